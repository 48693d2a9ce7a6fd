"""What every backend's run shares before and beside its loop (`run.PretrainingRun`): the input
checks made before anything is written, the data-position key, the weights' fingerprint, the
limit of skipped non-finite steps and the words of a stop. Free of TensorFlow."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Callable, Iterable, Optional

import numpy as np

from electra_tf.config import PretrainingConfig
from electra_tf.data.records import integrity
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


def data_position_key(config: PretrainingConfig, plan: Optional[dict], pipeline: dict,
                      size: Callable[[str], int] = os.path.getsize) -> str:
    """What a saved data position depends on, as one sha256: the shards (names and sizes), the
    global batch, the seed, the sequence length, the record plan and the backend's `pipeline`
    facts. A position is restored only into the pipeline of the same key (a different batch size
    fails at the first step; rebuilt shards would resume mid-record).

    Args:
        config: the run's config (`pretrain_tfrecords`, `train_batch_size`, `seed`,
            `max_seq_length`; no shards listed unless `do_train`).
        plan: the training split's record plan (`dataset_checks.record_plan`), or None.
        pipeline: dict. What else the backend's reader depends on (TensorFlow: replicas and input
            pipelines; JAX / PyTorch: the backend, and the readers of several hosts). Its keys are
            part of the saved keys of earlier runs: change them and those runs restart their data.
        size: callable path -> bytes (TensorFlow: `tf.io.gfile`, for gs:// shards).

    Returns:
        str. The hex digest.
    """
    files = ([(os.path.basename(f), size(f)) for f in integrity.list_files(
        config.pretrain_tfrecords)] if config.do_train else [])
    key = {"files": files, "global_batch": config.train_batch_size, "seed": config.seed,
           "max_seq_length": config.max_seq_length, **pipeline}
    if plan is not None:  # other records read = another pipeline
        key["record_plan"] = {os.path.basename(f): v for f, v in plan.items()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def weights_fingerprint(variables: Iterable) -> str:
    """sha256 over the variables' dtypes, shapes and bytes, in the given (fixed) order, on every
    backend: equal weights, equal fingerprints.

    Two runs with this fingerprint equal hold bit-identical weights (used to check that workers
    end identical, that a resumed run equals an uninterrupted one and that backends agree).
    Names are left out: Keras numbers some of them per process (`seed_generator_7`), which says
    nothing about the values.
    """
    digest = hashlib.sha256()
    for variable in variables:
        value = np.asarray(variable.numpy())
        digest.update(f"{value.dtype.str}|{value.shape}|".encode("utf-8"))
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def check_skipped(skipped: int, limit: int, last_good: Optional[str]) -> None:
    """The limit of `max_skipped_nonfinite_steps`, the same on every backend.

    Args:
        skipped: int. Non-finite steps skipped in this process.
        limit: int. `max_skipped_nonfinite_steps`.
        last_good: str. The latest checkpoint, named in the error.

    Raises:
        TrainingError: more than `limit` steps skipped (nothing is saved then).
    """
    if skipped > limit:
        raise TrainingError(
            f"{skipped} non-finite steps skipped, more than max_skipped_nonfinite_steps={limit}: "
            f"the run has diverged. Training stopped without saving; the last good checkpoint is "
            f"{last_good}")
