"""The Trainer under tf.distribute: two replicas match one device; two workers end identical.

Dropout is switched off (hidden_dropout_prob = attention_probs_dropout_prob = 0) in the comparison
with one device: Keras draws dropout masks from per-replica seed-generator states, so with dropout
on, replica r masks its half of the batch with other random bits than one device masking the
whole batch. Masking and generator sampling do not have this problem (they are keyed by the
example's index in the global batch), and neither do the data order, the gradient sum and the
clip, which is what this test is about.
"""

import os

import numpy as np
import pytest

from electra_tf.training import run_dir
from electra_tf.training.tf import trainer as trainer_lib
from tests import pretraining_fixtures as fx

STEPS = 4
WORKER_TIMEOUT_SECONDS = 240


def _no_dropout_config(data_dir, name, **overrides):
    return fx.tiny_config(data_dir, name, num_train_steps=STEPS, iterations_per_loop=2,
                          save_checkpoints_steps=STEPS, model_hparam_overrides=fx.NO_DROPOUT,
                          **overrides)


def test_two_replicas_match_one_device_at_the_same_global_batch(data_dir, mirrored_strategy):
    single = trainer_lib.Trainer(_no_dropout_config(data_dir, "one_device"))
    initial = [v.numpy() for v in single.model.trainable_variables]
    single_scalars = single.train()
    mirrored = trainer_lib.Trainer(_no_dropout_config(data_dir, "mirrored"),
                                   strategy=mirrored_strategy)
    assert mirrored.strategy.num_replicas_in_sync == 2
    mirrored_scalars = mirrored.train()
    assert single.step == mirrored.step == STEPS

    # Same initial weights, same batches, same masks: after several Adam steps the weights agree
    # to float32 round-off of the different summation order (two partial sums + all-reduce);
    # measured 6e-8. Adam divides by sqrt(v), so a round-off difference in a near-zero gradient
    # can be amplified: the bound leaves room for that, and is still far below what a wrong batch
    # split or a doubled/halved gradient makes (weights move by ~3e-3 in these steps).
    differences = [float(np.max(np.abs(a.numpy() - b.numpy())))
                   for a, b in zip(single.model.trainable_variables, mirrored.model.trainable_variables)]
    moved = [float(np.max(np.abs(a.numpy() - b)))
             for a, b in zip(single.model.trainable_variables, initial)]
    assert max(differences) <= 1e-5
    assert max(moved) > 1e-3  # the runs did train: the tolerance is meaningful
    for key in ("total_loss", "masked_lm_loss", "disc_loss", "grad_norm", "learning_rate"):
        assert mirrored_scalars[key] == pytest.approx(single_scalars[key], rel=1e-4), key
    for key in ("masked_lm_accuracy", "disc_accuracy", "disc_auc"):
        assert mirrored_scalars[key] == pytest.approx(single_scalars[key], abs=1e-3), key


@pytest.mark.slow  # two worker processes (MultiWorkerMirroredStrategy, ~45-75 s)
def test_two_workers_finish_with_identical_weights(data_dir):
    hparams = fx.tiny_hparams(num_train_steps=STEPS, iterations_per_loop=2, save_checkpoints_steps=2,
                              strategy="multi_worker")
    procs = fx.start_workers(data_dir, "multi_worker", hparams)
    outputs = []
    try:
        for proc in procs:
            log = proc.communicate(timeout=WORKER_TIMEOUT_SECONDS)[0]
            outputs.append((proc.returncode, log))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    fingerprints = []
    for index, (code, log) in enumerate(outputs):
        assert code == 0, f"worker {index} failed:\n{log[-3000:]}"
        step, fingerprint = fx.final_fingerprint(log)
        assert step == STEPS
        fingerprints.append(fingerprint)
    assert fingerprints[0] == fingerprints[1]
    # The chief writes the run (checkpoint at the end, summaries); the other worker's checkpoints
    # stay in its private directory.
    model_dir = os.path.join(data_dir, "models", "multi_worker")
    assert os.path.exists(os.path.join(model_dir, f"ckpt-{STEPS}.index"))
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(model_dir))
    worker_dir = os.path.join(model_dir, run_dir.WORKER_CHECKPOINT_DIR, "worker_1")
    assert os.path.exists(os.path.join(worker_dir, f"ckpt-{STEPS}.index"))
    assert not any(f.startswith("events.out.tfevents") for f in os.listdir(worker_dir))
