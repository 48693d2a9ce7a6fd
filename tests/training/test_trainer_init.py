"""Continued pretraining from an imported Google checkpoint (issue 6 <-> issue 4 contract).

`python -m electra_tf.convert from-google` writes DATA_DIR/models/NAME/{config.json, vocab.txt,
init_checkpoint/}; the trainer starts from those weights at the checkpoint's global step with a
fresh optimizer, then resumes from its own checkpoints as usual.
"""

import os

import numpy as np
import pytest

from electra_tf.convert import google, names
from electra_tf.training import checkpoint_files
from electra_tf.training.tf.trainer import Trainer, TrainingError
from tests import convert_fixtures, pretraining_fixtures


@pytest.fixture
def imported(tmp_path):
    data_dir = str(tmp_path / "data")
    pretraining_fixtures.write_dataset(data_dir)
    vocab = os.path.join(data_dir, "vocab.txt")
    weights = convert_fixtures.official_weights(pretraining_fixtures.VOCAB_SIZE, generator_hidden=16)
    prefix = convert_fixtures.write_google_checkpoint(str(tmp_path / "google" / "model.ckpt"),
                                                      weights, global_step=4000)
    model_dir = os.path.join(data_dir, "models", "continued")
    # Hparams that are not in the weights (the data's sequence length) are given at import.
    result = google.import_google_checkpoint(
        prefix, vocab, model_dir, hparams={"max_seq_length": pretraining_fixtures.MAX_SEQ_LENGTH})
    return data_dir, weights, result


def _config(data_dir, result, **overrides):
    hparams = dict(result.hparams, train_batch_size=8, num_train_steps=4003, num_warmup_steps=2,
                   save_checkpoints_steps=1000, iterations_per_loop=2, do_export=False)
    hparams.update(overrides)
    from electra_tf.config import PretrainingConfig
    return PretrainingConfig.create("continued", data_dir, hparams)


def test_training_starts_from_imported_weights_and_step(imported):
    data_dir, weights, result = imported
    run = Trainer(_config(data_dir, result))
    assert run.step == 4000 and run.restored_from.endswith(os.path.join("init_checkpoint", "ckpt-0"))
    restored = names.get_official_weights(run.model)
    for name, value in weights.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    # Fresh optimizer: no Adam slot from the TF1 checkpoint (they hold 7.0) was read.
    assert all(float(np.abs(v.numpy()).max()) == 0.0 for v in run.optimizer.variables
               if "adam_m" in v.path)
    run.train()
    assert run.step == 4003
    moved = names.get_official_weights(run.model)
    assert not np.array_equal(moved["electra/encoder/layer_0/output/dense/kernel"],
                              weights["electra/encoder/layer_0/output/dense/kernel"])
    # From now on the run's own checkpoints win over the imported one.
    again = Trainer(_config(data_dir, result, num_train_steps=4005))
    assert again.step == 4003 and os.path.basename(again.restored_from) == "ckpt-4003"


def test_imported_run_with_other_structural_hparams_is_refused(imported):
    data_dir, _, result = imported
    with pytest.raises(TrainingError, match="generator_hidden_size"):
        Trainer(_config(data_dir, result, generator_hidden_size=0.5))


def test_init_checkpoint_dir_name_is_shared_with_the_converter():
    assert checkpoint_files.INIT_CHECKPOINT_DIR == "init_checkpoint"
