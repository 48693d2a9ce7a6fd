"""Fault injection: a poisoned batch (NaN losses and gradients) with `max_skipped_nonfinite_steps`.

The batch is marked in the data (row 0 all [MASK]: the random shards never hold that) and a thin
wrapper around the model turns that batch's losses into NaN, so the poison travels through the
real input pipeline, the compiled loop and the optimizer.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.records import pipeline
from electra_tf.config.hparams import ConfigError
from electra_tf.training.tf import trainer as trainer_lib
from tests import backends
from tests import pretraining_fixtures as fx

MASK_ID = 4  # fx.vocab_tokens(): [PAD] [UNK] [CLS] [SEP] [MASK]


pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


class _PoisonedModel:
    """Delegates to the model; a batch whose row 0 is all [MASK] gets NaN losses."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, batch, **kwargs):
        outputs = dict(self._model(batch, **kwargs))
        poisoned = tf.reduce_all(tf.equal(batch["input_ids"][0], MASK_ID))
        factor = tf.where(poisoned, tf.constant(float("nan")), tf.constant(1.0))
        for key in ("total_loss", "disc_loss"):
            outputs[key] = outputs[key] * factor
        return outputs


def _poison(trainer, batch_indices):
    """Replaces the trainer's data with the same batches, `batch_indices` (0-based from the
    current position) poisoned, and its model with `_PoisonedModel`."""
    config = trainer.config
    dataset = pipeline.make_dataset(
        config.pretrain_tfrecords, batch_size=trainer.input_split.local_batch,
        max_seq_length=config.max_seq_length, is_training=True, seed=config.seed + 1,
        input_context=trainer.input_split.context)
    marks = tf.constant(batch_indices, tf.int64)

    def mark(index, batch):
        hit = tf.reduce_any(tf.equal(marks, index))
        ids = batch["input_ids"]
        row0 = tf.where(hit, tf.fill(tf.shape(ids[0]), tf.cast(MASK_ID, ids.dtype)), ids[0])
        return dict(batch, input_ids=tf.concat([row0[None], ids[1:]], axis=0))

    trainer.train_iterator = iter(dataset.enumerate().map(mark))
    trainer.model = _PoisonedModel(trainer.model)
    trainer._train_loop = None


def _snapshot(trainer):
    return ([v.numpy().copy() for v in trainer.model.trainable_variables]
            + [v.numpy().copy() for v in trainer.optimizer.variables])


def test_skip_option_is_validated():
    with pytest.raises(ConfigError, match="max_skipped_nonfinite_steps"):
        fx.tiny_config("/nonexistent", max_skipped_nonfinite_steps=-1)


def test_poisoned_batch_is_skipped_without_touching_weights_or_optimizer(data_dir, caplog):
    # Without dropout: the skipped step's forward pass would advance the dropout RNG state (by
    # design: the model ran), which would make the comparison below about dropout masks.
    config = fx.tiny_config(data_dir, "skip_one", num_train_steps=6, iterations_per_loop=1,
                            save_checkpoints_steps=3, max_skipped_nonfinite_steps=1,
                            model_hparam_overrides=fx.NO_DROPOUT)
    trainer = trainer_lib.Trainer(config)
    _poison(trainer, [2])  # the third batch from step 0
    trainer.train(stop_at_step=2)
    before = _snapshot(trainer)
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        trainer.train(stop_at_step=3)  # consumes the poisoned batch (skipped), then one good one
    assert any("non-finite step at step 2" in r.getMessage() and "disc_loss" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert trainer.skipped_steps == 1
    assert trainer.step == 3
    trainer.train()
    assert trainer.step == 6
    assert all(np.isfinite(v.numpy()).all() for v in trainer.model.trainable_variables)

    # The skipped step left everything untouched: replaying the same batches without the poisoned
    # one from the step-2 state gives the same step-3 weights (a second trainer, same data).
    clean = trainer_lib.Trainer(fx.tiny_config(data_dir, "skip_ref", num_train_steps=6,
                                               iterations_per_loop=1, save_checkpoints_steps=3,
                                               model_hparam_overrides=fx.NO_DROPOUT))
    _poison(clean, [])
    clean.train(stop_at_step=2)
    for a, b in zip(before, _snapshot(clean)):
        np.testing.assert_array_equal(a, b)
    next(clean.train_iterator)  # drop the batch the first run skipped
    clean.train()
    for a, b in zip(_snapshot(clean), _snapshot(trainer)):
        np.testing.assert_array_equal(a, b)

    # Counted in TensorBoard.
    counts = fx.read_scalars(config.model_dir, ["skipped_steps"])["skipped_steps"]
    assert counts[1] == 0.0 and counts[3] == 1.0 and counts[6] == 1.0, counts


def test_more_bad_batches_than_allowed_stops(data_dir):
    config = fx.tiny_config(data_dir, "skip_too_many", num_train_steps=8, iterations_per_loop=2,
                            save_checkpoints_steps=2, max_skipped_nonfinite_steps=1)
    trainer = trainer_lib.Trainer(config)
    _poison(trainer, [2, 3])
    with pytest.raises(trainer_lib.TrainingError,
                       match=r"2 non-finite steps skipped, more than max_skipped_nonfinite_steps=1"
                             r".*ckpt-2"):
        trainer.train()
    assert tf.train.latest_checkpoint(config.model_dir).endswith("ckpt-2")


def test_two_replicas_agree_to_skip_a_batch_poisoned_on_one_replica(data_dir, mirrored_strategy):
    # Row 0 of the worker's batch lands on replica 0 only: replica 1's loss stays finite, so the
    # replicas must agree on the skip (else one applies an update and the other does not).
    def make(name, poisoned):
        config = fx.tiny_config(data_dir, name, num_train_steps=5, iterations_per_loop=5,
                                save_checkpoints_steps=5, max_skipped_nonfinite_steps=1,
                                model_hparam_overrides=fx.NO_DROPOUT)
        trainer = trainer_lib.Trainer(config, strategy=mirrored_strategy)
        _poison(trainer, poisoned)
        return trainer

    trainer = make("skip_mirrored", [2])
    assert trainer.strategy.num_replicas_in_sync == 2
    trainer.train()
    assert trainer.skipped_steps == 1 and trainer.step == 5
    for variable in trainer.model.trainable_variables:
        values = [v.numpy() for v in mirrored_strategy.experimental_local_results(variable.value)]
        assert len(values) == 2
        np.testing.assert_array_equal(values[0], values[1])  # replicas stayed in sync
        assert np.isfinite(values[0]).all()

    # The same as never seeing the poisoned batch: a clean run over the other batches.
    clean = make("skip_mirrored_ref", [])
    clean.train(stop_at_step=2)
    next(clean.train_iterator)
    clean.train(stop_at_step=6)  # 5 updates: steps 0, 1, then 3 more after the dropped batch
    for a, b in zip(_snapshot(clean), _snapshot(trainer)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# --- JAX and PyTorch ---------------------------------------------------------------------------
# The same poison in a child process on the other backend: the model's `call` turns the losses of
# a batch whose row 0 is all [MASK] into NaN, and the trainer's reader marks the batches at the
# given positions of its data order (by their content, so Keras' read-ahead and the reader's
# put-back after a chunk do not matter).
_PORTABLE_POISON = f"""
import json
import numpy as np
from keras import ops
from electra_tf.config import PretrainingConfig
from electra_tf.errors import TrainingError
from electra_tf.training import npz_checkpoint
from electra_tf.training.portable import trainer as portable_trainer
from electra_tf.training.pretrainer import ElectraPretrainer

MASK_ID = {MASK_ID}
_call = ElectraPretrainer.call

# The signature is call's own: Keras reads it (whether to pass `training`) when a model is built.
def _poisoned_call(self, inputs, seed=None, training=None, example_offset=None,
                   loss_denominators=None):
    outputs = dict(_call(self, inputs, seed=seed, training=training,
                         example_offset=example_offset, loss_denominators=loss_denominators))
    hit = ops.all(ops.equal(inputs["input_ids"][0], MASK_ID))
    factor = ops.where(hit, float("nan"), 1.0)
    for key in ("total_loss", "disc_loss"):
        outputs[key] = outputs[key] * factor
    return outputs

ElectraPretrainer.call = _poisoned_call


class Poisoned:
    '''The trainer's reader; the batches equal to `targets` get row 0 all [MASK].'''

    def __init__(self, reader, targets):
        self.reader, self.targets = reader, targets

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.reader)
        if any(np.array_equal(batch["input_ids"], t) for t in self.targets):
            ids = batch["input_ids"].copy()
            ids[0] = MASK_ID
            batch = dict(batch, input_ids=ids)
        return batch

    def state(self):
        return self.reader.state()

    def restore(self, state):
        self.reader.restore(state)

    def close(self):
        self.reader.close()


def poisoned_trainer(config_json, positions):
    trainer = portable_trainer.PortableTrainer(PretrainingConfig.from_dict(json.loads(config_json)))
    reference = trainer._train_reader(trainer.config.seed)
    batches = [next(reference)["input_ids"] for _ in range(max(positions, default=-1) + 1)]
    reference.close()
    trainer.reader = Poisoned(trainer.reader, [batches[i] for i in positions])
    return trainer


def snapshot(trainer):
    return ([np.array(v.numpy()) for v in trainer.model.trainable_variables]
            + [np.array(v.numpy()) for v in trainer.optimizer.variables])
"""


@pytest.mark.slow  # three tiny runs in a child per backend: 95-115 s on 2 loaded cores
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_portable_backends_skip_a_poisoned_batch(data_dir, backend):
    """As the TensorFlow test above, on JAX (the skip decided inside the compiled step, here a
    scan of 2 steps per call: `steps_per_execution`) and PyTorch: the skipped step leaves the
    weights, the optimizer and its step counter as a run that never saw the batch; the data
    position (the checkpoint's too) is past the batch; `skipped_steps` counts it; one more bad
    batch than allowed stops the run with TensorFlow's error, naming the last checkpoint."""
    backends.require(backend)

    def config(name, **overrides):
        return fx.tiny_config(data_dir, f"{name}_{backend}", backend=backend,
                              **dict(dict(num_train_steps=6, iterations_per_loop=2,
                                          save_checkpoints_steps=2, max_skipped_nonfinite_steps=1,
                                          do_eval=False, do_export=False,
                                          model_hparam_overrides=fx.NO_DROPOUT), **overrides))

    skip, clean, many = config("skip_one"), config("skip_ref"), config("skip_many",
                                                                       num_train_steps=8)
    out = backends.run_on_backend(backend, _PORTABLE_POISON + f"""
trainer = poisoned_trainer({skip.to_json()!r}, [2])
out["spe"] = np.array(trainer.steps_per_execution)
trainer.train(stop_at_step=2)
at_2 = snapshot(trainer)
trainer.train(stop_at_step=4)  # batch 2 skipped, batch 3 applied (one call), then batch 4
out["step_after_skip"] = np.array(trainer.step)
out["skipped"] = np.array(trainer.skipped_steps)
trainer.train()
out["step"] = np.array(trainer.step)
out["finite"] = np.array(all(np.isfinite(a).all() for a in snapshot(trainer)))

# The same run (skipping on, nothing poisoned) over the same batches but the skipped one.
reference = poisoned_trainer({clean.to_json()!r}, [])
reference.train(stop_at_step=2)
out["same_at_2"] = np.array(all(np.array_equal(a, b) for a, b in zip(at_2, snapshot(reference))))
next(reference.reader)  # drop the batch the first run skipped
reference.train()
out["same_at_6"] = np.array(all(np.array_equal(a, b)
                                for a, b in zip(snapshot(trainer), snapshot(reference))))
out["same_position"] = np.array(trainer.reader.state() == reference.reader.state())
saved = npz_checkpoint.read_meta(trainer.latest)["data_state"]
out["saved_position"] = np.array(saved == reference.reader.state())
trainer.close()
reference.close()

too_many = poisoned_trainer({many.to_json()!r}, [2, 3])
try:
    too_many.train()
    out["error"] = ""
except TrainingError as e:
    out["error"] = str(e)
out["latest"] = np.array(str(npz_checkpoint.latest_good(too_many.config.model_dir)))
too_many.close()
""")
    assert int(out["spe"]) == (2 if backend == "jax" else 1)
    assert int(out["step_after_skip"]) == 4 and int(out["skipped"]) == 1
    assert int(out["step"]) == 6 and bool(out["finite"])
    assert bool(out["same_at_2"]) and bool(out["same_at_6"])
    assert bool(out["same_position"]) and bool(out["saved_position"])
    counts = fx.read_scalars(skip.model_dir, ["skipped_steps"])["skipped_steps"]
    assert counts[2] == 0.0 and counts[4] == 1.0 and counts[6] == 1.0, counts
    error = str(out["error"])
    assert error.startswith("2 non-finite steps skipped, more than "
                            "max_skipped_nonfinite_steps=1: the run has diverged"), error
    assert error.endswith("ckpt-2.npz") and str(out["latest"]).endswith("ckpt-2.npz"), error
