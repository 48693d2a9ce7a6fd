"""What both trainers share (TensorFlow's `trainer`, JAX / PyTorch's `portable_trainer`): the
input checks made before anything is written, the run directory's lock, and the words of a stop.
Free of TensorFlow."""

from __future__ import annotations

import logging
from typing import Dict, Optional

from electra_tf.config import PretrainingConfig
from electra_tf.errors import Preempted, TrainingError
from electra_tf.training import adam_warmup
from electra_tf.vocab import Vocab, load_vocab

logger = logging.getLogger("electra_tf")


def check_keras_backend(backend: str, what: str) -> None:
    """One line, before anything is written, when Keras was imported with another backend than
    `backend` (Keras reads `KERAS_BACKEND`, else ~/.keras/keras.json, once, at import).

    Args:
        backend: str. The backend `what` needs ("tensorflow").
        what: str. What needs it, for the message ("the TensorFlow trainer").

    Raises:
        TrainingError: naming the variable and the fix.
    """
    import os

    import keras

    active = keras.backend.backend()
    if active == backend:
        return
    source = (f"KERAS_BACKEND={os.environ['KERAS_BACKEND']} in the environment"
              if os.environ.get("KERAS_BACKEND") else "~/.keras/keras.json")
    raise TrainingError(f"{what} needs Keras' {backend} backend, but Keras was imported with "
                        f"the {active} backend ({source}): set KERAS_BACKEND={backend} before "
                        "importing keras (the electra-tf tools do)")


def check_vocab_and_batches(config: PretrainingConfig, replicas: int, unit: str) -> Vocab:
    """Loads the vocab and checks it and the batch sizes against the run's devices.

    Args:
        config: the run's config.
        replicas: int. Devices the global batch is split over.
        unit: str. What they are called in messages ("replicas in sync", "devices
            data-parallel").

    Raises:
        TrainingError: the vocab is larger than `vocab_size`, or a batch does not split.
    """
    vocab = load_vocab(config.vocab_file)
    if vocab.size > config.vocab_size:
        raise TrainingError(f"{config.vocab_file} has {vocab.size} tokens but vocab_size is "
                            f"{config.vocab_size}: set the vocab_size hparam to {vocab.size}")
    for key in ("train_batch_size", "eval_batch_size"):
        if getattr(config, key) % replicas:
            raise TrainingError(f"{key}={getattr(config, key)} (the global batch) is not a "
                                f"multiple of the {replicas} {unit}")
    if config.train_batch_size % (replicas * config.gradient_accumulation_steps):
        raise TrainingError(
            f"train_batch_size={config.train_batch_size} is not a multiple of {replicas} "
            f"replica(s) x gradient_accumulation_steps={config.gradient_accumulation_steps}")
    return vocab


def warn_about_schedule(config: PretrainingConfig) -> None:
    """Logs one warning when the official Adam's first updates would be much larger than
    `learning_rate` (a short warmup; `adam_warmup.short_warmup_warning`)."""
    warning = adam_warmup.short_warmup_warning(config)
    if warning:
        logger.warning(warning)


def preempted(step: int, checkpoint: Optional[str], during: str, rerun: str) -> Preempted:
    """The stop of a phase other than training: nothing of the run is lost."""
    return Preempted(f"stopped by SIGTERM {during} at step {step}; nothing is lost (the "
                     f"checkpoint {checkpoint} is complete). Rerun the same command to {rerun}")


class LockedRun:
    """A trainer holding its run directory's lock (`_lock`) until `close()` or the block's end,
    and training from its step in chunks (`step`, `stop`, `_train_steps(start, end)`, `_save()`
    and `_stop_preempted()` its own)."""

    _lock = None
    _schedule_checked = False

    def train(self, stop_at_step: Optional[int] = None) -> Dict[str, float]:
        """Trains to `num_train_steps` (or `stop_at_step`, for tests and staged runs), resuming
        from the current step. Returns the last chunk's averaged scalars."""
        config = self.config
        start_step = self.step
        end_step = min(config.num_train_steps, stop_at_step or config.num_train_steps)
        if start_step >= end_step:
            logger.info("already at step %d >= num_train_steps %d: nothing to train", start_step,
                        config.num_train_steps)
            return {}
        if not self._schedule_checked:  # once per run, whatever the number of train() calls
            self._schedule_checked = True
            warn_about_schedule(config)
        with self.stop:  # SIGTERM: stop before the next step, save, raise Preempted
            return self._train_steps(start_step, end_step)

    def _chunk_size(self, end_step: int) -> int:
        """Steps of the next chunk: up to the next checkpoint, the end, or the loop size."""
        step, every = self.step, self.config.save_checkpoints_steps
        return min(self.config.iterations_per_loop, every - step % every, end_step - step)

    def _stop_or_save(self, end_step: int) -> None:
        """After a chunk: stop (saving) if SIGTERM asked, else save when a checkpoint is due."""
        if self.stop.requested:
            self._stop_preempted()
        if self.step % self.config.save_checkpoints_steps == 0 or self.step >= end_step:
            self._save()

    def close(self) -> None:
        """Releases the run directory's lock (idempotent; the process's exit does too)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
