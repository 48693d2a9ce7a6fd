"""The collapse guard: is the discriminator predicting the base rate? (issue 44)

An ELECTRA discriminator can collapse to the constant answer "original" for every token: its
logits stop depending on the input, so its held-out AUC is 0.5, its recall 0, and its loss the
binary entropy H(p) of the replaced share p (the fraction of real tokens the generator replaced),
about 0.367 nats at p = 0.12. Its features then fine-tune at chance (docs/experiments.md: a GPU
run at learning rate 1e-3 did this from step 500 on). Early in a run the same numbers are
normal: predicting "original" everywhere is the first thing a discriminator learns, and it
separates the replacements only later.

`CollapseGuard` reads the scalars both trainers already compute (`disc_auc`, `disc_recall`,
`disc_loss` and `disc_replaced_share`, `pretraining.metrics`) and judges them:

- a reading is **at the base rate** when the AUC is within `AUC_TOLERANCE` (0.02) of 0.5 with
  recall 0, or the loss within `ENTROPY_TOLERANCE` (1%, relative) of H(p) with the AUC within
  `ENTROPY_RULE_AUC_TOLERANCE` (0.05) of 0.5;
- up to step `start_step` = max(`num_warmup_steps`, `collapse_grace_steps`) it is **early**: not
  judged, and an evaluation at the base rate says that this is expected;
- after it, `collapse_patience` training loops in a row at the base rate are a **collapse**: one
  warning per process (what it means, what to change), the per-loop scalar `disc_collapsed` (1
  while collapsed, else 0) and, in an evaluation at the base rate, `disc_collapsed = 1` in the
  eval results and a warning line.

Pure Python (no TensorFlow, no Keras): the TensorFlow trainer (`trainer`) and the JAX / PyTorch
one (`portable_trainer`) call the same guard.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Mapping, MutableMapping, Optional

logger = logging.getLogger("electra_tf")

# The rules' tolerances. A collapsed discriminator's held-out AUC is 0.500 exactly (every
# probability the same); a training loop's wanders around 0.5 (dropout varies the probabilities,
# and a small loop sees a few hundred replaced tokens: 0.46-0.53 measured on the tests' tiny
# model), hence the entropy rule beside it. A discriminator that learns slowly can sit at H(p) too
# (measured: loss within 0.2% of it at AUC 0.57), so the entropy rule also wants the AUC near 0.5.
AUC_TOLERANCE = 0.02
RECALL_AT_MOST = 1e-3  # "recall 0": no replaced token found (0.000 to three decimals)
ENTROPY_TOLERANCE = 0.01  # |disc_loss - H(p)| <= 1% of H(p)
ENTROPY_RULE_AUC_TOLERANCE = 0.05  # ... with the AUC within 0.05 of 0.5

# The scalar (per training loop, in TensorBoard) and eval-results key the guard adds.
COLLAPSED_KEY = "disc_collapsed"
# What the guard reads; a run without them (electra_objective false, disc_weight 0) is not judged.
INPUT_KEYS = ("disc_auc", "disc_recall", "disc_loss", "disc_replaced_share")

DOCS = 'docs/operations.md, "A collapsed discriminator"'


def binary_entropy(p: float) -> float:
    """H(p) in nats: the loss of predicting the probability p for every token when a share p
    of them is replaced (0 at p = 0 or 1)."""
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log(p) + (1.0 - p) * math.log(1.0 - p))


@dataclasses.dataclass(frozen=True)
class Reading:
    """One training loop's or evaluation's discriminator scalars, judged.

    Attributes:
        auc: float. `disc_auc`.
        recall: float. `disc_recall`.
        loss: float. `disc_loss` (nats).
        share: float. `disc_replaced_share`, p.
        entropy: float. H(p), nats.
        auc_rule: bool. AUC within AUC_TOLERANCE of 0.5 and recall 0.
        entropy_rule: bool. Loss within ENTROPY_TOLERANCE of H(p) (relative), AUC within
            ENTROPY_RULE_AUC_TOLERANCE of 0.5.
    """

    auc: float
    recall: float
    loss: float
    share: float
    entropy: float
    auc_rule: bool
    entropy_rule: bool

    @property
    def at_base_rate(self) -> bool:
        return self.auc_rule or self.entropy_rule

    def evidence(self) -> str:
        """The numbers behind the verdict, e.g. `disc_auc 0.5000, disc_recall 0.0000, disc_loss
        0.3667 against H(0.1230) = 0.3714 nats`."""
        return (f"disc_auc {self.auc:.4f}, disc_recall {self.recall:.4f}, disc_loss "
                f"{self.loss:.4f} against H({self.share:.4f}) = {self.entropy:.4f} nats")


def read(scalars: Mapping[str, float]) -> Optional[Reading]:
    """Judges the discriminator's scalars; None when any of `INPUT_KEYS` is missing or not finite
    (no discriminator metrics, or a loop whose every step was skipped)."""
    values = [scalars.get(key) for key in INPUT_KEYS]
    if any(v is None or not math.isfinite(float(v)) for v in values):
        return None
    auc, recall, loss, share = (float(v) for v in values)
    entropy = binary_entropy(share)
    # Without replaced tokens (p 0) there is no base rate to compare the loss with.
    near_entropy = entropy > 0.0 and abs(loss - entropy) <= ENTROPY_TOLERANCE * entropy
    return Reading(auc=auc, recall=recall, loss=loss, share=share, entropy=entropy,
                   auc_rule=abs(auc - 0.5) <= AUC_TOLERANCE and recall <= RECALL_AT_MOST,
                   entropy_rule=near_entropy and abs(auc - 0.5) <= ENTROPY_RULE_AUC_TOLERANCE)


@dataclasses.dataclass(frozen=True)
class EvalNote:
    """What an evaluation says about the discriminator, below its results line.

    Attributes:
        level: int. logging level (INFO early in a run, WARNING for a collapse).
        text: str. The line.
    """

    level: int
    text: str


class CollapseGuard:
    """Watches a run's training loops and evaluations for a collapsed discriminator.

    Args:
        patience: int. Training loops in a row at the base rate, after `start_step`, that make a
            collapse (`collapse_patience`); 0 turns the guard off.
        start_step: int. The last step of the early phase: max(`num_warmup_steps`,
            `collapse_grace_steps`).
        settings: {hparam: value} the advice quotes (learning_rate, num_warmup_steps,
            optimizer, adam_bias_correction, train_batch_size, generator_hidden_size,
            temperature).
        log: bool. Whether this process logs the warning (the chief, host 0).
    """

    def __init__(self, patience: int, start_step: int,
                 settings: Optional[Mapping[str, object]] = None, log: bool = True):
        self.patience = patience
        self.start_step = start_step
        self.settings = dict(settings or {})
        self.log = log
        self.in_a_row = 0  # loops at the base rate since the last one that was not
        self.warned_at: Optional[int] = None  # the step of the (one) warning

    @classmethod
    def for_config(cls, config, log: bool = True) -> "CollapseGuard":
        """The guard of a run: `collapse_patience`, the early phase up to max(num_warmup_steps,
        collapse_grace_steps), the hparams the advice names."""
        settings = {key: getattr(config, key) for key in (
            "learning_rate", "num_warmup_steps", "optimizer", "adam_bias_correction",
            "train_batch_size", "generator_hidden_size", "temperature") if hasattr(config, key)}
        return cls(config.collapse_patience,
                   max(config.num_warmup_steps, config.collapse_grace_steps), settings, log)

    @property
    def enabled(self) -> bool:
        return self.patience > 0

    @property
    def collapsed(self) -> bool:
        """Whether the last `patience` judged loops were all at the base rate."""
        return self.enabled and self.in_a_row >= self.patience

    def early(self, step: int) -> bool:
        """Whether `step` is in the early phase, where the base rate is expected."""
        return step <= self.start_step

    # --- Training --------------------------------------------------------------------------------
    def observe(self, step: int, scalars: MutableMapping[str, float]) -> None:
        """Judges one training loop, ending at `step`; adds `disc_collapsed` (0 or 1) to its
        `scalars` and logs the warning the first time the loops make a collapse.

        A loop without the discriminator's scalars (or with non-finite ones) is not judged and
        leaves the count as it was; one not at the base rate resets it (a recovery).
        """
        if not self.enabled:
            return
        reading = read(scalars)
        if reading is None:
            return
        if self.early(step):
            self.in_a_row = 0
        elif reading.at_base_rate:
            self.in_a_row += 1
        else:
            if self.collapsed and self.log:
                logger.info("the discriminator left the base rate at step %d (%s)", step,
                            reading.evidence())
            self.in_a_row = 0
        scalars[COLLAPSED_KEY] = float(self.collapsed)
        if self.collapsed and self.warned_at is None:
            self.warned_at = step
            if self.log:
                logger.warning("%s", self.warning(step, reading))

    def warning(self, step: int, reading: Reading) -> str:
        """The one warning of a collapse seen in training at `step`."""
        return (f"the discriminator has collapsed at step {step}: for {self.patience} training "
                f"loops in a row (after step {self.start_step}) it predicted the base rate, "
                f"\"original\" for every token (last loop: {reading.evidence()}). Its "
                "features then carry nothing (a collapsed run of docs/experiments.md fine-tuned "
                "at chance). Training goes on. " + self.advice())

    def advice(self) -> str:
        """What to try, naming the run's values of the hparams involved."""
        s = self.settings

        def now(key):
            return f" (now {s[key]})" if key in s else ""

        # The official Adam has no bias correction: under a short warmup its first ~1000
        # updates are up to 3x what learning_rate says (training.adam_warmup).
        adam = (" or adam_bias_correction true (now false: a short warmup's first updates are "
                "larger than learning_rate says)" if s.get("adam_bias_correction") is False
                and s.get("optimizer") == "adamw" else "")
        return ("To fix it, restart the run (from scratch or from a checkpoint before the "
                f"collapse) with a lower learning_rate{now('learning_rate')} or a longer "
                f"num_warmup_steps{now('num_warmup_steps')}{adam}: the official recipe is "
                f"learning_rate 5e-4 at train_batch_size 128{now('train_batch_size')} with "
                "10000 warmup steps and the gradient clipped at global norm 1.0 (fixed here); "
                "do not raise the rate with the batch. A smaller generator_hidden_size"
                f"{now('generator_hidden_size')} or a higher sampling temperature"
                f"{now('temperature')} makes the replacements easier to detect. "
                f"See {DOCS}")

    # --- Evaluation ------------------------------------------------------------------------------
    def judge_eval(self, step: int, results: MutableMapping[str, float]) -> Optional[EvalNote]:
        """Judges an evaluation at `step` on its own numbers (an eval-only run has no training
        loops): adds `disc_collapsed` (1 at the base rate after the early phase, else 0) to
        `results` and returns the line that explains a base-rate result, or None."""
        if not self.enabled:
            return None
        reading = read(results)
        if reading is None:
            return None
        collapsed = reading.at_base_rate and not self.early(step)
        results[COLLAPSED_KEY] = float(collapsed)
        if not reading.at_base_rate:
            return None
        if not collapsed:
            return EvalNote(logging.INFO, (
                f"eval at step {step}: the discriminator predicts the base rate, \"original\" "
                f"for every token ({reading.evidence()}), which is expected this early: up to "
                f"step {self.start_step} (the later of num_warmup_steps and "
                "collapse_grace_steps) a discriminator often answers that before it learns to "
                "spot the replacements; the collapse guard judges only after it"))
        advice = (f"See the warning at step {self.warned_at}" if self.warned_at is not None
                  else self.advice())
        return EvalNote(logging.WARNING, (
            f"eval at step {step}: the discriminator has collapsed: it predicts the base rate, "
            f"\"original\" for every token ({reading.evidence()}). {advice}"))
