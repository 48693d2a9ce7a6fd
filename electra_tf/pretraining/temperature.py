"""The sampling-temperature curriculum (Fast-ELECTRA, Dong et al., ICLR 2024).

The generator's samples are drawn from softmax(logits / T). A temperature above 1 flattens that
distribution: replacements are more often implausible tokens, easy to detect. Fast-ELECTRA starts
at T0 > 1 and lowers T over training, so the replaced-token-detection task grows harder as the
discriminator learns (a curriculum without training the generator). Here T goes from
`temperature_start` at step 0 to the run's `temperature` (official 1.0) at `decay_steps`, and stays
there:

    p = min(step, decay_steps) / decay_steps
    linear:       T = end + (start - end) * (1 - p)
    cosine:       T = end + (start - end) * (1 + cos(pi * p)) / 2
    exponential:  T = start * (end / start) ** p       (geometric: equal ratios per step)

The step is a tensor read inside the compiled step (the global step the masking and sampling
draws are keyed by, `PretrainingModel.call`), so a resumed run samples at the temperatures an
uninterrupted one does, on every backend.
"""

from __future__ import annotations

import math

from keras import ops

from electra_tf.config.generator_checks import TEMPERATURE_SCHEDULES as SCHEDULES


def temperature_at(step, *, start: float, end: float, decay_steps: int,
                   schedule: str = "linear"):
    """The sampling temperature at `step` (a pure `keras.ops` function).

    Args:
        step: int or scalar tensor. The global step (updates applied before this one).
        start: float > 0. T0, the temperature at step 0 (`temperature_start`).
        end: float > 0. The temperature from `decay_steps` on (the `temperature` hparam).
        decay_steps: int >= 1. Steps from `start` to `end` (`temperature_decay_steps`).
        schedule: str. "linear", "cosine" or "exponential" (module docstring).

    Returns:
        float32 scalar tensor.

    Raises:
        ValueError: an unknown schedule, a non-positive temperature or decay_steps < 1.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"temperature schedule must be one of {', '.join(SCHEDULES)}, got "
                         f"{schedule!r}")
    if start <= 0 or end <= 0 or decay_steps < 1:
        raise ValueError(f"temperatures must be > 0 and decay_steps >= 1, got start={start}, "
                         f"end={end}, decay_steps={decay_steps}")
    step = ops.cast(step, "float32")
    progress = ops.divide(ops.minimum(ops.maximum(step, 0.0), float(decay_steps)),
                          float(decay_steps))
    if schedule == "exponential":
        value = ops.multiply(float(start), ops.power(float(end) / float(start), progress))
    else:
        if schedule == "linear":
            remaining = ops.subtract(1.0, progress)
        else:
            remaining = ops.multiply(0.5, ops.add(1.0, ops.cos(ops.multiply(math.pi, progress))))
        value = ops.add(float(end), ops.multiply(float(start) - float(end), remaining))
    # Exactly `end` once the decay is over (start * (end / start) may round off it): the rest of
    # the run samples as a run without the curriculum does.
    return ops.where(ops.greater_equal(progress, 1.0), float(end), value)
