"""What a pretraining run on JAX or PyTorch can do (`portable_trainer`): the strategies and
precisions it runs, a one-line error for the rest before anything is written, and the devices it
splits the global batch over. Free of TensorFlow."""

from __future__ import annotations

import logging
import math
import os
from typing import List, Optional

import keras

from electra_tf.config import PretrainingConfig
from electra_tf.errors import TrainingError
from electra_tf.sources import downloads
from electra_tf.training import capabilities

logger = logging.getLogger("electra_tf")

# What this trainer can run on: the TensorFlow strategies that map to Keras' distribution API.
STRATEGIES = {"jax": ("auto", "one_device", "mirrored", "tpu", "multi_worker"),
              "torch": ("auto", "one_device")}
PORTABLE_POLICIES = ("float32", "mixed_bfloat16")
# JAX steps per compiled call when the steps_per_execution hparam is null: at most this many
# (measured: docs/benchmarks.md, "Steps per compiled call on JAX").
AUTO_STEPS_PER_EXECUTION = 16


def check_supported(config: PretrainingConfig, profile_steps: int = 0) -> None:
    """One-line errors for what this backend cannot do (before anything is written): its
    strategies and precisions here, the run-level features in `capabilities`.

    Raises:
        TrainingError: naming the flag or hparam.
    """
    backend = config.backend
    if backend not in STRATEGIES:
        raise TrainingError(f"--backend {backend}: the portable trainer runs jax or torch")
    active = keras.backend.backend()
    if active != backend:
        raise TrainingError(f"--backend {backend}, but Keras was imported with the {active} "
                            f"backend: set KERAS_BACKEND={backend} before importing keras (the "
                            "tools do)")
    if config.strategy not in STRATEGIES[backend]:
        raise TrainingError(
            f"strategy={config.strategy!r} with --backend {backend}: not supported (use "
            f"{' or '.join(STRATEGIES[backend])}; several machines: --backend jax or "
            "tensorflow with multi_worker)" + ("; PyTorch trains on one device here"
                                               if backend == "torch" else ""))
    if backend == "jax" and config.strategy == "tpu":
        _check_tpu()
    capabilities.check(config, profile_steps)
    if config.mixed_precision == "mixed_float16":
        raise TrainingError(f"mixed_precision mixed_float16 needs loss scaling, which --backend "
                            f"{backend} does not do: use auto, mixed_bfloat16 or float32")


def steps_per_execution(config: PretrainingConfig) -> int:
    """Training steps per compiled call (`ElectraPretrainer.compile(steps_per_execution=)`).

    The hparam when set (checked: it divides iterations_per_loop and save_checkpoints_steps);
    when null, on JAX the largest divisor of both that is at most `AUTO_STEPS_PER_EXECUTION`
    (official 200 and 1000: 10; iterations_per_loop 1: 1), so every loop and checkpoint ends at
    a call's end; on PyTorch 1 (Keras runs its steps one by one there).
    """
    if config.steps_per_execution is not None:
        return config.steps_per_execution
    if config.backend != "jax":
        return 1
    bound = math.gcd(config.iterations_per_loop, config.save_checkpoints_steps)
    return max(k for k in range(1, min(bound, AUTO_STEPS_PER_EXECUTION) + 1) if bound % k == 0)


def _check_tpu() -> None:
    """strategy "tpu" on JAX: JAX must see a TPU (else it would train on its CPU, as told by
    nobody). Safe before `hosts.join`: a strategy other than multi_worker joins no cluster."""
    import jax

    platforms = sorted({device.platform for device in jax.devices()})
    if "tpu" not in platforms:
        raise TrainingError(f"strategy='tpu' with --backend jax, but JAX sees no TPU here (its "
                            f"devices: {', '.join(platforms)}): run on a TPU VM with "
                            "jax[tpu] installed, or use strategy auto to train on these devices")


def local_devices() -> List[str]:
    """The devices Keras' distribution API sees (JAX: every local device)."""
    if keras.backend.backend() != "jax":
        return []
    return keras.distribution.list_devices()


# XLA's persistent compilation cache for a JAX run: its directory ("off", "0", "false" or "no":
# none), else $XDG_CACHE_HOME/electra-tf/jax-compilation (`downloads.default_cache_dir`).
COMPILATION_CACHE_ENV = "ELECTRA_TF_JAX_COMPILATION_CACHE"
COMPILATION_CACHE_MAX_BYTES = 4 << 30  # least recently used entries go beyond it


def use_compilation_cache(backend: str) -> Optional[str]:
    """JAX: turns on XLA's persistent compilation cache, so a resumed run (or any later run of
    the same model, batch and JAX: pretraining, each fine-tuning trial) loads its compiled
    programs (the step, the initializers) instead of compiling them. A cache set already
    (JAX_COMPILATION_CACHE_DIR, jax.config) is kept; $ELECTRA_TF_JAX_COMPILATION_CACHE names the
    directory or turns it off. Logs the directory in use.

    Returns:
        The cache directory in use, or None (off, or not JAX).
    """
    path = _compilation_cache(backend)
    if path:
        logger.info("compiled programs cached in %s (%s=off: not)", path, COMPILATION_CACHE_ENV)
    return path


def _compilation_cache(backend: str) -> Optional[str]:
    """`use_compilation_cache` less its log line."""
    if backend != "jax":
        return None
    import jax  # lazy: JAX is an optional backend (a PyTorch run has none)

    setting = os.environ.get(COMPILATION_CACHE_ENV, "").strip()
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    path = setting or os.path.join(downloads.default_cache_dir(), "jax-compilation")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # a read-only home: the run compiles as without a cache
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    # Every compiled program, not only those over JAX's default 1 s (the initializers'
    # programs take a fraction of a second each, some 27 of them), unless the user chose.
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_MAX_BYTES)
    return path
