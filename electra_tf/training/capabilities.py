"""What each backend's run can do: one table, and the one-line error for the rest.

A run-level feature (an hparam or a flag of the pretraining command) that not every backend runs
has one row here naming the backends that run it. `check` refuses the others before anything is
written, in one line naming the feature and where it runs. The strategies and precisions of the
JAX / PyTorch run are theirs (`portable_support`); a SavedModel export needs TensorFlow, and a
JAX / PyTorch run says how to get one instead (`PortableTrainer._export`).

tests/training/test_capabilities.py names, for every backend a row claims, the test that runs the
feature there, and fails on a claim without one.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Tuple

from electra_tf.config import PretrainingConfig
from electra_tf.console import KERAS_BACKENDS
from electra_tf.errors import TrainingError

BACKENDS = KERAS_BACKENDS


class Capability(NamedTuple):
    """One row of the table.

    Attributes:
        name: str. The feature as the user writes it (`hparam X` or `--flag`).
        backends: tuple of str. The backends that run it.
        used: callable (config, profile_steps) -> bool. Whether a run asks for it.
    """

    name: str
    backends: Tuple[str, ...]
    used: Callable[[PretrainingConfig, int], bool]


CAPABILITIES: Dict[str, Capability] = {
    "max_skipped_nonfinite_steps": Capability(
        "hparam max_skipped_nonfinite_steps", ("tensorflow", "jax", "torch"),
        lambda config, _: config.max_skipped_nonfinite_steps != 0),
    "two_stage_generator_dir": Capability(
        "hparam two_stage_generator_dir", ("tensorflow", "jax", "torch"),
        lambda config, _: bool(config.two_stage_generator_dir)),
    "frozen_generator_dir": Capability(
        "hparam frozen_generator_dir", ("tensorflow", "jax", "torch"),
        lambda config, _: bool(config.frozen_generator_dir)),
    "jit_compile": Capability(
        "hparam jit_compile", ("tensorflow", "jax"),
        lambda config, _: bool(config.jit_compile)),
    "profile_steps": Capability(
        "--profile-steps", ("tensorflow", "jax"),
        lambda _, profile_steps: profile_steps > 0),
}


def supports(backend: str, feature: str) -> bool:
    """Whether `backend` runs `feature` (a key of `CAPABILITIES`)."""
    return backend in CAPABILITIES[feature].backends


def check(config: PretrainingConfig, profile_steps: int = 0) -> None:
    """One line for the first feature the run asks for that its backend does not run (before
    anything is written).

    Args:
        config: the run's config (`backend` names the backend).
        profile_steps: int. The pretraining command's `--profile-steps`.

    Raises:
        TrainingError: naming the feature, this run's backend and the backends that run it.
    """
    for capability in CAPABILITIES.values():
        if capability.used(config, profile_steps) and config.backend not in capability.backends:
            raise TrainingError(
                f"{capability.name} is supported with "
                f"{' or '.join('--backend ' + b for b in capability.backends)} only "
                f"(this run has --backend {config.backend})")
