"""Fault injection on the run directory: bad model names, `--overwrite` aimed at more than one
run, damaged `config.json` and `checkpoint` state files, leftovers of interrupted saves and
exports, checkpoint retention after interrupted saves.

Every case runs the real code path on real files (copies of a tiny trained run) and asserts what
the user sees and that nothing else on disk was touched.
"""

import json
import logging
import os
import shutil
import signal
import subprocess
import time

import pytest

import run_pretraining
from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.training import checkpoint_files, run_dir
from electra_tf.training.tf import trainer as trainer_lib
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx
from tests.test_locking import wait_for_holder

RUN = dict(num_train_steps=2, save_checkpoints_steps=2, iterations_per_loop=2)

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


@pytest.fixture(scope="module")
def trained(data_dir):
    """A finished tiny run (ckpt-0, ckpt-2) to copy."""
    trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, "trained", **RUN))
    trainer.train()
    trainer.close()
    return trainer.config.model_dir


def _copy(trained, data_dir, name):
    target = os.path.join(data_dir, "models", name)
    shutil.copytree(trained, target)
    return target


def _tree(path):
    """Every file under `path` with its size: what must survive a refused --overwrite."""
    return sorted((os.path.relpath(os.path.join(root, name), path),
                   os.path.getsize(os.path.join(root, name)))
                  for root, _, names in os.walk(path) for name in names)


def _main(capsys, *argv):
    return faults.run_main(run_pretraining.main, capsys, *argv)


_one_error_line = faults.one_error_line


# ------------------------------------------------------------------------------------------------
# 1. Model names and --overwrite
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", " ", ".", "..", "../../x", "/abs/run", "a/b", "x\ny"])
def test_model_name_must_be_one_directory_name(data_dir, name):
    with pytest.raises(ConfigError, match="--model-name must be one directory name"):
        PretrainingConfig.create(name, data_dir, fx.tiny_hparams())


def test_data_dir_tensorflow_cannot_name_is_refused_naming_it_escaped(tmp_path):
    data_dir = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    with pytest.raises(ConfigError, match=r"model_dir .*caf\\xe9/models/x: TensorFlow reads and "
                                          r"writes only file names that are valid UTF-8"):
        PretrainingConfig.create("x", data_dir, fx.tiny_hparams())


def test_empty_model_name_from_an_unset_variable_writes_and_deletes_nothing(
        trained, data_dir, capsys):
    """`--model-name "$UNSET" --overwrite`: one line, exit 2; every run under models/ stays."""
    _copy(trained, data_dir, "other_run")
    models = os.path.join(data_dir, "models")
    before = _tree(models)
    for extra in ((), ("--overwrite",)):
        code, err = _main(capsys, "--data-dir", data_dir, "--model-name", "", "--hparams",
                          '{"debug": true}', *extra)
        assert "--model-name must be one directory name" in _one_error_line(code, err)
    assert _tree(models) == before
    assert not os.path.exists(os.path.join(models, "config.json"))


def test_overwrite_never_deletes_a_parent_of_several_runs(trained, data_dir, capsys):
    """A run written straight into models/ (what an empty name did before) next to other runs:
    `--overwrite` on models/ refuses, naming an entry that is not part of a run."""
    root = os.path.join(data_dir, "parent_of_runs")
    shutil.copytree(trained, root)  # its own config.json, checkpoints ... at the top
    _copy(trained, root, "run_a")  # plus two complete runs inside: root/models/run_a
    shutil.copytree(trained, os.path.join(root, "run_b"))
    before = _tree(root)
    config = fx.tiny_config(data_dir, "parent", model_dir=root, **RUN)
    with pytest.raises(trainer_lib.TrainingError,
                       match=r"refusing to delete .*parent_of_runs for --overwrite: it holds "
                             r"models \(and 1 more\), which is not part of a run"):
        trainer_lib.Trainer(config, overwrite=True)
    assert _tree(root) == before


def test_overwrite_refuses_a_run_holding_a_users_file(trained, data_dir):
    model_dir = _copy(trained, data_dir, "with_notes")
    with open(os.path.join(model_dir, "notes.txt"), "w") as f:
        f.write("keep me")
    before = _tree(model_dir)
    with pytest.raises(trainer_lib.TrainingError, match="it holds notes.txt"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, "with_notes", **RUN), overwrite=True)
    assert _tree(model_dir) == before


def test_overwrite_deletes_exactly_one_run(trained, data_dir, caplog):
    model_dir = _copy(trained, data_dir, "to_replace")
    neighbour = _copy(trained, data_dir, "neighbour")
    before = _tree(neighbour)
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, "to_replace", **RUN),
                                      overwrite=True)
    trainer.close()
    assert trainer.step == 0 and trainer.restored_from is None
    assert any("deleted the previous run in" in r.getMessage() for r in caplog.records)
    assert not os.path.exists(os.path.join(model_dir, "ckpt-2.index"))
    assert _tree(neighbour) == before


# ------------------------------------------------------------------------------------------------
# 7. A 0-byte config.json: the message says so, and the advice it gives works
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"", b"\x8b\x00garbage\xff"])
def test_damaged_config_json_is_named_and_overwrite_then_works(trained, data_dir, content):
    name = f"damaged_config_{len(content)}"
    model_dir = _copy(trained, data_dir, name)
    with open(os.path.join(model_dir, "config.json"), "wb") as f:
        f.write(content)
    config = fx.tiny_config(data_dir, name, **RUN)
    with pytest.raises(trainer_lib.TrainingError) as info:
        trainer_lib.Trainer(config)
    message = str(info.value)
    assert "config.json" in message and "pass --overwrite" in message, message
    if not content:
        assert "is empty (0 bytes" in message, message
    trainer = trainer_lib.Trainer(config, overwrite=True)  # the advice works
    trainer.close()
    assert trainer.step == 0
    assert PretrainingConfig.load(os.path.join(model_dir, "config.json")).model_name == name


# ------------------------------------------------------------------------------------------------
# 3. A damaged `checkpoint` state file
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 2, b"garbage: not a proto\n"],
                         ids=["empty", "random_bytes", "text"])
def test_damaged_state_file_falls_back_to_the_newest_intact_checkpoint(
        trained, data_dir, content, caplog):
    name = f"state_{len(content)}"
    model_dir = _copy(trained, data_dir, name)
    with open(os.path.join(model_dir, "checkpoint"), "wb") as f:
        f.write(content)
    # Every reader of the directory survives it: converters and fine-tuning (load_run) ...
    assert run_dir.load_run(model_dir).checkpoint == os.path.join(model_dir, "ckpt-2")
    # ... and the trainer, which rewrites the state file before TensorFlow's manager reads it.
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, name, **dict(RUN, num_train_steps=4)))
    assert trainer.restored_from == os.path.join(model_dir, "ckpt-2") and trainer.step == 2
    assert any("checkpoint state file" in r.getMessage() and "was damaged" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    import tensorflow as tf

    assert tf.train.latest_checkpoint(model_dir) == os.path.join(model_dir, "ckpt-2")
    trainer.train()
    trainer.close()
    assert tf.train.latest_checkpoint(model_dir) == os.path.join(model_dir, "ckpt-4")
    assert checkpoint_files.checkpoint_state_problem(model_dir) is None


# ------------------------------------------------------------------------------------------------
# 5. One writer per run directory (a real second process)
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_second_writer_of_a_run_stops_and_a_killed_writers_lock_is_taken_over(
        data_dir, capsys, caplog):
    """A training process holds its run directory: a second run_pretraining.py on it (even with
    --overwrite) stops with one line naming it and deletes nothing. After the first is
    SIGKILLed its lock file is stale: the next run takes it over, naming the dead process, and
    resumes from the killed run's checkpoint."""
    hparams = fx.tiny_hparams(num_train_steps=100000, save_checkpoints_steps=2,
                              iterations_per_loop=2)
    model_dir = os.path.join(data_dir, "models", "contended")
    first = subprocess.Popen(fx.run_pretraining_command(data_dir, "contended", hparams),
                             env=fx.subprocess_env(), cwd=fx.REPO_ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for_holder(model_dir, first.pid, first, timeout=300)
        deadline = time.monotonic() + 300
        while fx.latest_step(model_dir) is None:  # its step-0 checkpoint is written
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)
        checkpoints = sorted(n for n in os.listdir(model_dir) if n.startswith("ckpt-"))
        code, err = _main(capsys, "--data-dir", data_dir, "--model-name", "contended",
                          "--hparams", json.dumps(hparams), "--overwrite")
        line = _one_error_line(code, err)
        assert f"model dir {model_dir} is in use by pid {first.pid} on host" in line, line
        assert sorted(n for n in os.listdir(model_dir) if n.startswith("ckpt-")) == checkpoints
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    latest = fx.latest_step(model_dir)
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        trainer = trainer_lib.Trainer(PretrainingConfig.create("contended", data_dir, hparams))
    trainer.close()
    assert any(f"taking over a stale lock of pid {first.pid}" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert trainer.step == latest
