"""Fault injection on checkpoints: corrupted, truncated or missing files, a `checkpoint` state file
naming a checkpoint that is gone, and a full disk (a small tmpfs) while saving or exporting.

A tiny run saves ckpt-0, ckpt-2 and ckpt-4; each test copies it, damages ckpt-4 for real (bytes
on disk) and resumes: the Trainer must skip ckpt-4 with a warning naming it, restore ckpt-2, and
training on to step 4 must reproduce the undamaged run bit for bit (never trains from garbage).
"""

import gc
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config.hparams import ConfigError
from electra_tf.training import checkpoint_files
from electra_tf.training.tf import trainer as trainer_lib
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx

RUN = dict(num_train_steps=4, save_checkpoints_steps=2, iterations_per_loop=2, keep_checkpoint_max=0)


pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


@pytest.fixture(scope="module")
def original(data_dir):
    trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, "original", **RUN))
    trainer.train()
    assert trainer.step == 4
    return {"model_dir": trainer.config.model_dir, "fingerprint": trainer.weights_fingerprint()}


def _copy_run(original, data_dir, name):
    target = os.path.join(data_dir, "models", name)
    shutil.copytree(original["model_dir"], target)
    return target


def _data_file(model_dir, step):
    return os.path.join(model_dir, f"ckpt-{step}.data-00000-of-00001")


def _truncate_data(model_dir):
    path = _data_file(model_dir, 4)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _garble_data(model_dir):
    path = _data_file(model_dir, 4)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for offset in range(size // 3, size, size // 7):  # flip bytes spread over the file
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))


def _garble_index(model_dir):
    path = os.path.join(model_dir, "ckpt-4.index")
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(os.urandom(64))


def _truncate_index(model_dir):
    path = os.path.join(model_dir, "ckpt-4.index")
    with open(path, "r+b") as f:
        f.truncate(10)


def _delete_data(model_dir):
    os.remove(_data_file(model_dir, 4))


DAMAGES = {"truncated_data": _truncate_data, "garbled_data": _garble_data,
           "garbled_index": _garble_index, "truncated_index": _truncate_index,
           "missing_data": _delete_data}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_latest_checkpoint_falls_back_to_previous_good_one(original, data_dir, damage, caplog):
    model_dir = _copy_run(original, data_dir, f"damaged_{damage}")
    DAMAGES[damage](model_dir)
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, f"damaged_{damage}", **RUN))
    bad = os.path.join(model_dir, "ckpt-4")
    assert any(bad in r.getMessage() and "corrupted or incomplete" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert trainer.restored_from == os.path.join(model_dir, "ckpt-2")
    assert trainer.step == 2
    trainer.train()
    assert trainer.step == 4
    assert trainer.weights_fingerprint() == original["fingerprint"]
    # The rewritten ckpt-4 is intact again.
    assert checkpoint_files.checkpoint_problem(bad) is None


def test_state_file_naming_a_missing_checkpoint_is_not_a_fresh_start(original, data_dir, caplog):
    """`checkpoint` says ckpt-6 (a save that never completed): the run resumes from ckpt-4, it does
    not silently start again at step 0 (what tf.train.latest_checkpoint alone would give)."""
    model_dir = _copy_run(original, data_dir, "state_points_nowhere")
    state = os.path.join(model_dir, "checkpoint")
    text = open(state).read().replace('"ckpt-4"', '"ckpt-6"', 1)
    assert 'model_checkpoint_path: "ckpt-6"' in text
    with open(state, "w") as f:
        f.write(text)
    assert tf.train.latest_checkpoint(model_dir) is None  # the trap
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, "state_points_nowhere", **RUN))
    assert trainer.step == 4
    assert trainer.weights_fingerprint() == original["fingerprint"]
    assert any(os.path.join(model_dir, "ckpt-6") in r.getMessage() for r in caplog.records)


def test_a_relative_run_directory_finds_its_checkpoints_without_warnings(original, caplog,
                                                                          monkeypatch):
    """The default DATA_DIR is relative (`pretrain_data`): the state file's entries are found
    under it once, not as `models/x/models/x/ckpt-N` reported corrupted."""
    parent, name = os.path.split(original["model_dir"])
    monkeypatch.chdir(parent)
    assert checkpoint_files.checkpoint_candidates(name) == [os.path.join(name, f"ckpt-{step}")
                                                   for step in (4, 2, 0)]
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        assert checkpoint_files.latest_good_checkpoint(name) == os.path.join(name, "ckpt-4")
    assert [r.getMessage() for r in caplog.records] == []


def test_partial_checkpoint_without_state_entry_is_skipped(original, data_dir):
    """Files of an interrupted save (an index whose data file was cut short) are never picked."""
    model_dir = _copy_run(original, data_dir, "partial_newer")
    for suffix in (".index", ".data-00000-of-00001"):
        shutil.copyfile(os.path.join(model_dir, f"ckpt-4{suffix}"),
                        os.path.join(model_dir, f"ckpt-6{suffix}"))
    with open(_data_file(model_dir, 6), "r+b") as f:
        f.truncate(100)
    trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, "partial_newer", **RUN))
    assert trainer.restored_from == os.path.join(model_dir, "ckpt-4")


def test_all_checkpoints_damaged_is_a_clear_error(original, data_dir):
    model_dir = _copy_run(original, data_dir, "all_damaged")
    for step in (0, 2, 4):
        with open(_data_file(model_dir, step), "r+b") as f:
            f.truncate(16)
    with pytest.raises(trainer_lib.TrainingError, match="no readable checkpoint in .*all_damaged"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, "all_damaged", **RUN))


# ------------------------------------------------------------------------------------------------
# Disk full: the model directory on a small tmpfs
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs (root only); skipped where mounting is not allowed."""
    with faults.small_filesystem(str(tmp_path / "small_disk")) as mount_point:
        yield mount_point


def test_disk_full_while_checkpointing_fails_clearly_and_keeps_last_good(data_dir, small_disk):
    model_dir = os.path.join(small_disk, "run")
    config = fx.tiny_config(data_dir, "disk_full", model_dir=model_dir, **RUN)
    trainer = trainer_lib.Trainer(config)
    trainer.train(stop_at_step=2)  # ckpt-0 and ckpt-2 fit
    checkpoint_bytes = os.path.getsize(_data_file(model_dir, 2))
    faults.fill(small_disk, checkpoint_bytes // 2)  # the next save runs out of space mid-write
    with pytest.raises(trainer_lib.TrainingError, match="cannot save checkpoint .*ckpt-4") as info:
        trainer.train()
    assert "No space left" in str(info.value) or "ENOSPC" in str(info.value)
    del trainer
    os.remove(os.path.join(small_disk, "filler"))
    # A restart resumes from the last complete checkpoint; the partial one is never picked.
    again = trainer_lib.Trainer(config)
    assert again.restored_from == os.path.join(model_dir, "ckpt-2")
    assert again.step == 2
    assert all(np.isfinite(v.numpy()).all() for v in again.model.trainable_variables)
    del again


# ------------------------------------------------------------------------------------------------
# Non-finite weights: never saved as a good checkpoint, skipped on resume
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hparams", [{"weight_decay_rate": float("nan")},
                                     {"learning_rate": float("inf")},
                                     {"train_batch_size": 1_000_000_000},
                                     {"model_hparam_overrides": {"hidden_dropout_prob": float("nan")}}])
def test_non_finite_or_out_of_range_hparams_are_refused(data_dir, hparams):
    """What JSON's NaN / Infinity (accepted by Python's json) or an int32-overflowing batch
    would have trained with."""
    with pytest.raises(ConfigError):
        fx.tiny_config(data_dir, "bad_hparams", **hparams)


def test_weights_that_diverge_are_never_saved_as_a_good_checkpoint(data_dir):
    """A finite but absurd learning rate turns the weights into Inf in the update of step 1,
    whose loss (computed before the update) is still finite. The save of step 1 is refused; the
    last good checkpoint named is ckpt-0, and a rerun with a sane rate resumes from it."""
    run = dict(num_train_steps=3, save_checkpoints_steps=1, iterations_per_loop=1,
               num_warmup_steps=0, keep_checkpoint_max=0)
    config = fx.tiny_config(data_dir, "diverges", learning_rate=2e38, **run)
    trainer = trainer_lib.Trainer(config)
    with pytest.raises(trainer_lib.TrainingError,
                       match=r"weights are not finite after step 1 .*ckpt-1 is not saved.*last "
                             r"good checkpoint is .*ckpt-0"):
        trainer.train()
    trainer.close()
    model_dir = config.model_dir
    assert not os.path.exists(os.path.join(model_dir, "ckpt-1.index"))
    assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-0")
    again = trainer_lib.Trainer(fx.tiny_config(data_dir, "diverges", **run))
    assert again.restored_from.endswith("ckpt-0")
    again.train()
    again.close()
    assert again.step == 3


def test_resume_skips_a_checkpoint_with_non_finite_weights(original, data_dir, caplog):
    """A checkpoint holding NaN (written by an older version, or another tool) is skipped with
    a warning naming it and the tensor; the previous one is restored."""
    model_dir = _copy_run(original, data_dir, "nan_checkpoint")
    trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, "nan_checkpoint", **RUN))
    variable = trainer.model.trainable_variables[3]
    variable.assign(tf.fill(variable.shape, np.nan))
    trainer.checkpointer.manager.save(checkpoint_number=6)  # bypasses the save-time check
    trainer.close()
    del trainer
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        again = trainer_lib.Trainer(fx.tiny_config(data_dir, "nan_checkpoint", **RUN))
    again.close()
    assert again.restored_from == os.path.join(model_dir, "ckpt-4")
    assert again.weights_fingerprint() == original["fingerprint"]
    warnings = [r.getMessage() for r in caplog.records if "ckpt-6" in r.getMessage()]
    assert warnings and "is non-finite, skipping it: NaN or Inf in" in warnings[0], warnings
