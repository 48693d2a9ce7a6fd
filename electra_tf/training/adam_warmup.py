"""How much larger the official Adam's first updates are than the learning-rate schedule says.

The official AdamWeightDecayOptimizer has no bias correction (parity item 31). Its moments start
at zero, so for a steady gradient the update m / sqrt(v) is (1 - beta_1^t) / sqrt(1 - beta_2^t)
times Adam's bias-corrected one: 3.2x at step 1, 6.5x at step 10, 2.3x at step 218, 1.26x at
1000 (beta_2 = 0.999 remembers ~1000 steps). Under the official 10,000-step warmup the schedule
is still tiny while the factor is large, so the effective peak rate is the configured one. A
short warmup ends while the factor is large: the run takes its largest steps right after warmup,
at up to several times `learning_rate`. That is the regime where ELECTRA's discriminator was seen
to collapse to the base rate (docs/experiments.md, issue 44): batch 512, learning_rate 1e-3,
218 warmup steps, an effective peak of 2.0e-3.

Pure Python: `amplification` reads a schedule's numbers, `short_warmup_warning` words them.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

# Official AdamWeightDecayOptimizer constants (also optimizers.ADAM_BETA_*; repeated here so this
# module imports no Keras).
BETA_1 = 0.9
BETA_2 = 0.999
# Warn when the effective peak rate exceeds the configured peak by this factor. 1.5 is reached
# by a warmup of ~590 steps in a long run; 218 warmup steps (the collapsed GPU run) give 2.0, the
# official 10,000 give 1.0.
WARN_ABOVE = 1.5
# The factor is within 0.1% of 1 after ~7,600 steps: looking further changes nothing.
HORIZON = 20000


class Amplification(NamedTuple):
    """The schedule's largest effective rate, relative to `learning_rate`.

    factor: max over t of lr(t) / learning_rate * (1 - beta_1^t) / sqrt(1 - beta_2^t).
    step: the step t where it is reached (1-based: the t-th update).
    """

    factor: float
    step: int


def schedule_rate(step: int, num_train_steps: int, num_warmup_steps: int,
                  lr_decay_power: float) -> float:
    """The official schedule at `step`, relative to the peak (`WarmupPolynomialDecay`)."""
    decay = (1.0 - min(step, num_train_steps) / num_train_steps) ** lr_decay_power
    warmup = min(1.0, step / num_warmup_steps) if num_warmup_steps > 0 else 1.0
    return decay * warmup


def amplification(num_train_steps: int, num_warmup_steps: int, lr_decay_power: float = 1.0,
                  beta_1: float = BETA_1, beta_2: float = BETA_2) -> Amplification:
    """The effective peak of the official (uncorrected) Adam under the official schedule.

    The update applied at optimizer step t (t = 1 for the first) uses the rate the schedule
    gives at the global step before it, t - 1, as the trainers do.

    Args:
        num_train_steps: int >= 1. The decay horizon.
        num_warmup_steps: int >= 0. The linear warmup.
        lr_decay_power: float. The polynomial decay's power.
        beta_1, beta_2: float. Adam's moment decays.

    Returns:
        Amplification(factor, step).
    """
    best = Amplification(0.0, 1)
    for t in range(1, min(num_train_steps, HORIZON) + 1):
        rate = schedule_rate(t - 1, num_train_steps, num_warmup_steps, lr_decay_power)
        factor = rate * (1.0 - beta_1 ** t) / math.sqrt(1.0 - beta_2 ** t)
        if factor > best.factor:
            best = Amplification(factor, t)
    return best


def short_warmup_warning(config) -> Optional[str]:
    """One warning line when the config's official Adam takes updates much larger than its
    `learning_rate` (`WARN_ABOVE`), naming the numbers and the two fixes; else None.

    Args:
        config: a PretrainingConfig (`optimizer`, `adam_bias_correction`, `learning_rate`,
            `num_train_steps`, `num_warmup_steps`, `lr_decay_power`).
    """
    if config.optimizer != "adamw" or getattr(config, "adam_bias_correction", False):
        return None  # LAMB and the corrected Adam have no amplification
    found = amplification(config.num_train_steps, config.num_warmup_steps, config.lr_decay_power)
    if found.factor <= WARN_ABOVE:
        return None
    # The warmup at which a long run's factor falls to WARN_ABOVE: 1 / sqrt(1 - b2^W) = WARN_ABOVE.
    safe = math.ceil(math.log(1.0 - 1.0 / WARN_ABOVE ** 2) / math.log(BETA_2))
    return (f"num_warmup_steps={config.num_warmup_steps} is short for the official Adam, which "
            f"has no bias correction: its updates peak at step {found.step} at {found.factor:.1f}x "
            f"learning_rate={config.learning_rate:g} (an effective {found.factor * config.learning_rate:.2g}),"
            f" the regime where ELECTRA's discriminator can collapse to the base rate. Set "
            f"num_warmup_steps >= {safe} (the official recipe uses 10000) or "
            f'"adam_bias_correction": true (docs/config.md)')
