"""The trainer's checkpoint: what it holds, saving, and the three ways a run starts.

A checkpoint holds what makes a resumed run bit-identical to an uninterrupted one: the model
(with the dropout seed-generator states), the optimizer (with the step counter) and, in a
training run, the position of this worker's data iterator plus the key of the pipeline it
belongs to (`inputs.train_data_key`). Under MultiWorkerMirroredStrategy every worker saves (the
save is collective): the chief into the run directory, the others into their own
(`run_dir.worker_checkpoint_dir`).

A run starts from (in this order): its own latest intact checkpoint (`restore`), weights
imported by `from-google` (`restore_imported`: model and step, fresh optimizer), or nothing;
a run with a frozen generator (two-stage training, Fast-ELECTRA) then copies a finished run's
masked LM in at step 0 (`frozen_generator.start`).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Optional

import tensorflow as tf

from electra_tf import atomic
from electra_tf.errors import TrainingError, error_line
from electra_tf.training import checkpoint_files

logger = logging.getLogger("electra_tf")

# Checkpoint entry holding the training pipeline's key: the saved data position is only
# restored into the pipeline it came from.
TRAIN_DATA_KEY_NAME = "train_data_key"


class RunCheckpoint:
    """A `tf.train.Checkpoint` of the model and optimizer (and data position) with its manager.

    Args:
        model: the ElectraPretrainer.
        optimizer: its optimizer; its `iterations` number the checkpoints (`ckpt-<step>`).
        directory: str. Where this worker saves.
        max_to_keep: int or None. Checkpoints kept (None: all).
        data_iterator: optional tf.data iterator whose position is saved too (training).
        data_key: str. The key of that iterator's pipeline (`inputs.train_data_key`).
    """

    def __init__(self, model, optimizer, directory: str, max_to_keep: Optional[int],
                 data_iterator=None, data_key: Optional[str] = None):
        self.model = model
        self.optimizer = optimizer
        self.directory = directory
        self.max_to_keep = max_to_keep
        if os.path.isdir(directory):
            # TensorFlow's CheckpointManager fails on a damaged state file: rewrite it first.
            checkpoint_files.repair_checkpoint_state(directory)
        self.track_data(data_iterator, data_key)

    def _state(self) -> dict:
        """The trainer's state beside the model (`checkpoint_files.run_checkpoint`'s `state`)."""
        return {"optimizer": self.optimizer,
                # The seed generators' integer states only: a frozen generator's weights are
                # non-trainable too (and saved with the model already).
                "rng_state": [v for v in self.model.non_trainable_variables
                              if "float" not in str(v.dtype)]}

    def track_data(self, iterator, key: Optional[str]) -> None:
        """Saves `iterator`'s position (and `key`, its pipeline) from now on (None: no data)."""
        state = self._state()
        if iterator is not None:
            state["train_data"] = iterator
            state[TRAIN_DATA_KEY_NAME] = tf.Variable(key, trainable=False, dtype=tf.string)
        self.data_key = key if iterator is not None else None
        self.checkpoint = checkpoint_files.run_checkpoint(self.model, **state)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, self.directory, max_to_keep=self.max_to_keep,
            step_counter=self.optimizer.iterations, checkpoint_interval=None)

    @property
    def latest(self) -> Optional[str]:
        return self.manager.latest_checkpoint

    def save(self, step: int) -> str:
        """Saves `ckpt-<step>`; a failed save (disk full, unwritable directory) is a TrainingError.

        Only finite weights are saved: a checkpoint is "good" only if every model weight and
        optimizer slot is finite (`non_finite_variable`, checked first; one read of the
        variables in memory), so the last good checkpoint a stopped run names can be resumed.
        TensorFlow writes the data under a temporary name and the `checkpoint` state file last,
        so a failed save never becomes the latest checkpoint; its temporary files are removed
        (they hold the space a retry needs) and a restart resumes from the last complete one.
        """
        bad = non_finite_variable(list(self.model.trainable_variables)
                                  + list(self.optimizer.variables))
        if bad is not None:
            raise TrainingError(
                f"the weights are not finite after step {step} (NaN or Inf in {bad}): "
                f"{checkpoint_files.CHECKPOINT_PREFIX}-{step} is not saved and training stopped. "
                f"The last good checkpoint is {self.latest}; lower learning_rate (or set "
                "max_skipped_nonfinite_steps) and rerun to resume from it")
        try:
            path = self.manager.save(checkpoint_number=step)
            _sync(path, self.directory)
            return path
        except (tf.errors.OpError, OSError) as e:
            name = os.path.join(self.directory, f"{checkpoint_files.CHECKPOINT_PREFIX}-{step}")
            shutil.rmtree(name + "_temp", ignore_errors=True)
            reason = error_line(e, limit=None)
            reason = reason.split("; ", 1)[-1][:200]  # TensorFlow's "op context; reason"
            raise TrainingError(
                f"cannot save checkpoint {name} ({reason}): training stopped. The last "
                f"complete checkpoint is {self.latest}; free space or fix the permissions of "
                f"{self.directory} and rerun to resume from it") from None

    def restore(self, path: str, own_data: bool = True) -> bool:
        """Restores the checkpoint `path`; its data position only if it belongs to this worker's
        pipeline (`own_data` and the same key). Returns whether the data position was restored.

        Raises:
            TrainingError: the checkpoint does not match this run's model or optimizer.
        """
        same_data = (self.data_key is not None and own_data
                     and _read_string(path, TRAIN_DATA_KEY_NAME) == self.data_key)
        checkpoint = (self.checkpoint if same_data
                      else checkpoint_files.run_checkpoint(self.model, **self._state()))
        try:
            # expect_partial: an eval/export run, or a changed pipeline, leaves the saved data
            # position unread on purpose.
            checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise TrainingError(
                f"cannot resume from {path}: it does not match this run's model or optimizer "
                f"({error_line(e)}). Use the run's hparams, another --model-name, or "
                "--overwrite to start afresh") from None
        return same_data

    def restore_imported(self, path: str) -> None:
        """Starts from an imported model-only checkpoint (`python -m electra_tf.convert
        from-google`): weights and step come from it, the optimizer starts fresh."""
        step = tf.Variable(0, dtype=tf.int64)
        try:
            checkpoint_files.run_checkpoint(self.model, step=step).restore(
                path).assert_existing_objects_matched().expect_partial()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise TrainingError(f"cannot start from the imported checkpoint {path}: it does not "
                                f"match this run's model ({error_line(e)}). Use the hparams "
                                "`from-google` printed") from None
        self.optimizer.iterations.assign(step)


def _sync(prefix: str, directory: str) -> None:
    """Flushes a saved checkpoint's files, then the `checkpoint` state file TensorFlow renamed
    into place, then the directory, to the disk: after a power loss the state file is never
    empty and never names files that are not there. (Remote filesystems, `gs://...`, have
    their own guarantees: nothing to do.)"""
    if "://" in directory:
        return
    for path in sorted(tf.io.gfile.glob(prefix + ".*")):
        atomic.fsync_path(path)
    state = os.path.join(directory, checkpoint_files.CHECKPOINT_STATE_NAME)
    if os.path.exists(state):
        atomic.fsync_path(state)
    atomic.fsync_path(directory)


def non_finite_variable(variables) -> Optional[str]:
    """The name of the first floating-point variable holding NaN or Inf, or None.

    One fused check over all variables (a reduction per variable, no copy to the host), then a
    search only when something is wrong.
    """
    floating = [v for v in variables if tf.as_dtype(v.dtype).is_floating]
    if not floating:
        return None
    if bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in floating])):
        return None
    for variable in floating:
        if not bool(tf.reduce_all(tf.math.is_finite(variable))):
            return variable.path if hasattr(variable, "path") else variable.name
    return None


def _read_string(path: str, name: str) -> Optional[str]:
    """A string variable saved at the checkpoint's top level, or None if absent."""
    try:
        value = tf.train.load_checkpoint(path).get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")
    except (tf.errors.OpError, ValueError):
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
