"""Objective variants in the trainers (issue 34): a GDES run and a decoupled-optimizer run each
resume bit for bit (the two-halves check of test_trainer.py), and train as documented."""

import numpy as np
import pytest

from electra_tf.training import trainer as trainer_lib
from tests import pretraining_fixtures as fx
from tests.training.test_trainer import _state

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest

# 6 steps, a checkpoint at 3: the second half restores it in a new Trainer.
RUN = dict(num_train_steps=6, save_checkpoints_steps=3, iterations_per_loop=2, keep_checkpoint_max=2)


def _resume_is_bit_identical(data_dir, name, **hparams):
    """Trains RUN uninterrupted and in two halves (a new Trainer from ckpt-3); asserts every
    weight and optimizer variable equal. Returns the uninterrupted trainer."""
    whole = trainer_lib.Trainer(fx.tiny_config(data_dir, name + "_whole", **RUN, **hparams))
    whole.train()
    config = fx.tiny_config(data_dir, name + "_halves", **RUN, **hparams)
    first = trainer_lib.Trainer(config)
    first.train(stop_at_step=3)
    del first
    second = trainer_lib.Trainer(config)
    assert second.restored_from.endswith("ckpt-3") and second.step == 3
    second.train()
    a, b = _state(whole), _state(second)
    assert a["step"] == b["step"] == 6
    assert len(a["optimizer"]) == len(b["optimizer"])
    for x, y in zip(a["weights"] + a["optimizer"], b["weights"] + b["optimizer"]):
        np.testing.assert_array_equal(x, y)
    assert a["fingerprint"] == b["fingerprint"]
    return whole


def test_gdes_run_resumes_exactly_and_learns_its_deltas(data_dir):
    trainer = _resume_is_bit_identical(data_dir, "gdes", embedding_sharing="gdes")
    deltas = trainer.model.discriminator.embeddings.deltas()
    assert all(np.abs(d.numpy()).max() > 0 for d in deltas)  # trained (they start at zero)
    paths = [v.path for v in trainer.model.trainable_variables]
    assert "electra/disentangled_embeddings/word_delta" in paths

