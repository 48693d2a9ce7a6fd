"""Leftovers of interrupted saves and exports, cleaned up at the next start; checkpoint retention
counting what is on disk.

Real interruptions: a `run_pretraining.py` process SIGKILLed while TensorFlow writes a
checkpoint (its `ckpt-N_temp/` staging directory exists) and while it writes an export (its
`export/discriminator/.<step>.tmp-*` staging directory exists). The retention test starts from the files a
save interrupted between writing the checkpoint and updating the `checkpoint` state file leaves
(the checkpoints are on disk, the state file does not list them).
"""

import contextlib
import json
import logging
import os
import signal
import subprocess
import time

import pytest

from electra_tf.training.tf import trainer as trainer_lib
from tests import pretraining_fixtures as fx

TIMEOUT = 240

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


def _checkpoints(model_dir):
    return sorted(int(n[len("ckpt-"):-len(".index")]) for n in os.listdir(model_dir)
                  if n.startswith("ckpt-") and n.endswith(".index"))


@pytest.mark.slow  # two tiny trainings: ~60 s on 2 shared cores
def test_retention_counts_checkpoints_on_disk_after_interrupted_saves(data_dir, caplog):
    run = dict(save_checkpoints_steps=2, iterations_per_loop=2)
    with trainer_lib.Trainer(fx.tiny_config(data_dir, "retention", num_train_steps=6,
                                            keep_checkpoint_max=0, **run)) as trainer:
        trainer.train()
    model_dir = trainer.config.model_dir
    assert _checkpoints(model_dir) == [0, 2, 4, 6]
    # The saves of ckpt-4 and ckpt-6 were cut off after their files, before the state file.
    with open(os.path.join(model_dir, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "ckpt-2"\nall_model_checkpoint_paths: "ckpt-0"\n'
                'all_model_checkpoint_paths: "ckpt-2"\n')
    config = fx.tiny_config(data_dir, "retention", num_train_steps=10, keep_checkpoint_max=2, **run)
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        with trainer_lib.Trainer(config) as trainer:
            assert trainer.restored_from == os.path.join(model_dir, "ckpt-6")
            assert _checkpoints(model_dir) == [4, 6]  # at start: 2 of the 4 on disk kept
            trainer.train()
    assert _checkpoints(model_dir) == [8, 10]  # without counting the disk: [4, 6, 8, 10]
    assert any("keep_checkpoint_max=2: deleted 2 older checkpoint(s) found on disk" in
               r.getMessage() and "ckpt-0, ckpt-2" in r.getMessage() for r in caplog.records)


def _kill_when(proc, model_dir, seen, what, signum=signal.SIGKILL):
    """Sends `signum` (SIGKILL) to `proc` the moment `seen(model_dir)` holds and waits for it to
    end; returns what was seen (or None if the process ended first)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        found = seen(model_dir)
        if found:
            proc.send_signal(signum)
            proc.wait(timeout=60)
            return found
        time.sleep(0.001)
    if proc.poll() is None:
        proc.kill()
        pytest.fail(f"no {what} within {TIMEOUT} s")
    return None


def _kill_until_left(command, model_dir, seen, left, what, log_pattern=None):
    """Starts `command` up to 4 times, SIGKILLing it when `seen(model_dir)` finds something, until
    a kill leaves `left(model_dir)` non-empty; returns what `left` finds.

    A kill can land just after the rename that ends the work, or the work can end between two
    looks on a loaded machine: the command then runs again (a training run resumes, an export
    replaces the last one atomically). stderr goes to `log_pattern.format(attempt)` if given.
    """
    for attempt in range(4):
        with (open(log_pattern.format(attempt), "w") if log_pattern
              else contextlib.nullcontext(subprocess.DEVNULL)) as stderr:
            proc = subprocess.Popen(command, env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                                    stdout=subprocess.DEVNULL, stderr=stderr)
            found = _kill_when(proc, model_dir, seen, what)
        if found and left(model_dir):
            return left(model_dir)
    pytest.fail(f"none of 4 kills left a {what}'s leftovers behind")


def _save_temps(model_dir):
    try:
        return [n for n in os.listdir(model_dir) if n.endswith("_temp")]
    except FileNotFoundError:
        return []


def _later_save_temps(model_dir):
    """`ckpt-N_temp` of a save after the first (the export needs a checkpoint to read). Named by
    step, not by ckpt-0.index being there: TensorFlow creates that file while it merges the first
    save, with ckpt-0_temp still present, and a kill then leaves no readable checkpoint."""
    return [n for n in _save_temps(model_dir) if n != "ckpt-0_temp"]


def _export_staging(model_dir):
    """Staging directories under export/ and its network folders (export/<network>/<step>/),
    relative to export/."""
    export = os.path.join(model_dir, "export")
    found = []
    for directory, dirs, _ in os.walk(export):
        found += [os.path.relpath(os.path.join(directory, n), export) for n in dirs if ".tmp-" in n]
        dirs[:] = [n for n in dirs if ".tmp-" not in n]
    return sorted(found)


@pytest.mark.slow  # several real runs killed mid-save and mid-export: ~60-120 s on 2 cores
def test_sigkill_mid_save_and_mid_export_leftovers_are_removed_at_the_next_start(
        data_dir, caplog):
    model_dir = os.path.join(data_dir, "models", "killed_saves")
    # A large (unused) vocab makes every save write ~100 MB: a window of a tenth of a second.
    hparams = fx.tiny_hparams(num_train_steps=40, iterations_per_loop=1, save_checkpoints_steps=1,
                              keep_checkpoint_max=0, vocab_size=60000, embedding_size=128)
    command = fx.run_pretraining_command(data_dir, "killed_saves", hparams)
    temps = _kill_until_left(command, model_dir, _later_save_temps, _save_temps, "checkpoint save")
    # The next start (an export run) removes them; killed in turn while TensorFlow writes the
    # SavedModel's staging directory.
    export = fx.run_pretraining_command(data_dir, "killed_saves", dict(
        hparams, do_train=False, do_export=True))
    staging = _kill_until_left(export, model_dir, _export_staging, _export_staging,
                               "export staging directory",
                               log_pattern=os.path.join(data_dir, "export-{}.log"))
    assert _save_temps(model_dir) == []
    # The first start after the killed saves is the one that removed their leftovers.
    removed = [line for line in open(os.path.join(data_dir, "export-0.log"))
               if "leftover(s)" in line]
    assert len(removed) == 1 and all(os.path.join(model_dir, name) in removed[0]
                                     for name in temps), removed

    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        trainer = trainer_lib.Trainer(trainer_lib.PretrainingConfig.create(
            "killed_saves", data_dir, json.loads(json.dumps(hparams))))
    trainer.close()
    assert _export_staging(model_dir) == []
    removed = [r.getMessage() for r in caplog.records if "leftover(s)" in r.getMessage()]
    assert len(removed) == 1 and all(os.path.join(model_dir, "export", name) in removed[0]
                                     for name in staging), removed
