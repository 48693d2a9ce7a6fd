"""Pretraining metrics under the official names and weightings (official `metric_fn`).

`PretrainingMetrics.update_state` takes the dict the official code passes to `metric_fn`, with the
official keys (`METRIC_INPUT_KEYS`); `metric_inputs` builds it from this package's outputs.

| name | value | weights |
|---|---|---|
| masked_lm_accuracy | generator argmax == masked_lm_ids | masked_lm_weights |
| masked_lm_loss | per-slot NLL (mean) | masked_lm_weights |
| sampled_masked_lm_accuracy | sampled id == masked_lm_ids | masked_lm_weights |
| disc_loss | per-sequence RTD loss, unweighted mean over sequences | none |
| disc_auc | ROC AUC, 200 thresholds, of probs vs labels | real tokens only (see below) |
| disc_accuracy | preds == labels | input_mask |
| disc_precision | preds == labels | preds * input_mask |
| disc_recall | preds == labels | labels * input_mask |
| disc_replaced_share | labels (not official) | input_mask |

The sampled and discriminator metrics exist only for the ELECTRA objective, the discriminator ones
only when disc_weight > 0 (as official). `disc_replaced_share`, the fraction of real tokens the
generator replaced, is not official: it is the base rate a collapsed discriminator predicts, whose
binary entropy its loss then equals (`training.collapse`).

Deliberate difference: the official `disc_auc` passes labels * input_mask and probs * input_mask
over ALL positions, so every padding position counts as a negative with probability 0, which
inflates the AUC. By default `disc_auc` here counts real tokens only;
`disc_auc_include_padding=True` restores the official behaviour.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import keras
from keras import ops

from electra_tf.pretraining.losses import MLMLoss, RTDLoss
from electra_tf.pretraining.masking import MaskedInputs
from electra_tf.pretraining.sampling import FakeInputs

# Official tf.metrics.auc defaults used by metric_fn.
AUC_NUM_THRESHOLDS = 200

# Keys of the official `eval_fn_inputs` dict, with what each holds.
METRIC_INPUT_KEYS = {
    "input_ids": "int [B, L] masked generator input (not used by any metric)",
    "masked_lm_preds": "int [B, N] generator argmax",
    "mlm_loss": "float [B, N] per-slot NLL",
    "masked_lm_ids": "int [B, N] original ids",
    "masked_lm_weights": "float [B, N] slot weights",
    "input_mask": "int [B, L]",
    "sampled_tokids": "int [B, N] generator samples (ELECTRA only)",
    "disc_loss": "float [B] per-sequence RTD loss (ELECTRA only)",
    "disc_labels": "int [B, L] is_fake labels (ELECTRA only)",
    "disc_probs": "float [B, L] sigmoid(logits) (ELECTRA only)",
    "disc_preds": "int [B, L] 1 iff logit > 0 (ELECTRA only)",
}

METRIC_NAMES = (
    "masked_lm_accuracy",
    "masked_lm_loss",
    "sampled_masked_lm_accuracy",
    "disc_loss",
    "disc_auc",
    "disc_accuracy",
    "disc_precision",
    "disc_recall",
    "disc_replaced_share",
)


def metric_inputs(
    masked: MaskedInputs,
    mlm: MLMLoss,
    fake: Optional[FakeInputs] = None,
    rtd: Optional[RTDLoss] = None,
) -> Dict[str, object]:
    """Builds the official `eval_fn_inputs` dict from this package's outputs.

    Args:
        masked: MaskedInputs (the generator input).
        mlm: MLMLoss.
        fake: FakeInputs, for the ELECTRA objective.
        rtd: RTDLoss, for the ELECTRA objective.

    Returns:
        dict keyed by `METRIC_INPUT_KEYS` (the ELECTRA-only keys only when fake and rtd are given).
    """
    out = {
        "input_ids": masked.input_ids,
        "masked_lm_preds": mlm.predictions,
        "mlm_loss": mlm.per_position_nll,
        "masked_lm_ids": masked.masked_lm_ids,
        "masked_lm_weights": masked.masked_lm_weights,
        "input_mask": masked.input_mask,
    }
    if fake is not None:
        out["sampled_tokids"] = fake.sampled_ids
    if fake is not None and rtd is not None:
        out.update(
            disc_loss=rtd.per_example_loss,
            disc_labels=fake.is_fake,
            disc_probs=rtd.probs,
            disc_preds=rtd.preds,
        )
    return out


def _flat(x, dtype=None):
    x = ops.reshape(x, [-1])
    return x if dtype is None else ops.cast(x, dtype)


class PretrainingMetrics:
    """Streaming pretraining metrics (keras.metrics objects) under the official names.

    Args:
        electra_objective: bool. Official `electra_objective`; False keeps only the two MLM
            metrics.
        disc_auc_include_padding: bool. False (default) computes disc_auc over real tokens only;
            True reproduces the official AUC that counts padding as negatives.
        disc_weight: float. Official `disc_weight`; the discriminator metrics exist only when > 0.

    Example:
        metrics = PretrainingMetrics()
        metrics.update_state(metric_inputs(masked, mlm, fake, rtd))
        metrics.result()  # {"masked_lm_accuracy": ..., ...}
    """

    def __init__(self, electra_objective: bool = True, disc_auc_include_padding: bool = False,
                 disc_weight: float = 50.0):
        self.electra_objective = electra_objective
        self.disc_auc_include_padding = disc_auc_include_padding
        self.disc_weight = disc_weight
        self._sampled = bool(electra_objective)
        self._disc = bool(electra_objective) and disc_weight > 0

        self.masked_lm_accuracy = keras.metrics.Accuracy(name="masked_lm_accuracy")
        self.masked_lm_loss = keras.metrics.Mean(name="masked_lm_loss")
        self.metrics = [self.masked_lm_accuracy, self.masked_lm_loss]
        if self._sampled:
            self.sampled_masked_lm_accuracy = keras.metrics.Accuracy(name="sampled_masked_lm_accuracy")
            self.metrics.append(self.sampled_masked_lm_accuracy)
        if self._disc:
            self.disc_loss = keras.metrics.Mean(name="disc_loss")
            self.disc_auc = keras.metrics.AUC(
                num_thresholds=AUC_NUM_THRESHOLDS, curve="ROC", name="disc_auc")
            self.disc_accuracy = keras.metrics.Accuracy(name="disc_accuracy")
            self.disc_precision = keras.metrics.Accuracy(name="disc_precision")
            self.disc_recall = keras.metrics.Accuracy(name="disc_recall")
            self.disc_replaced_share = keras.metrics.Mean(name="disc_replaced_share")
            self.metrics += [self.disc_loss, self.disc_auc, self.disc_accuracy,
                             self.disc_precision, self.disc_recall, self.disc_replaced_share]

    def update_state(self, outputs: Mapping[str, object]) -> None:
        """Accumulates one batch.

        Args:
            outputs: dict with the official `eval_fn_inputs` keys (`METRIC_INPUT_KEYS`), e.g.
                from `metric_inputs`. Every value is flattened, as in the official metric_fn.
        """
        mlm_ids = _flat(outputs["masked_lm_ids"], "int32")
        mlm_weights = _flat(outputs["masked_lm_weights"], "float32")
        self.masked_lm_accuracy.update_state(
            mlm_ids, _flat(outputs["masked_lm_preds"], "int32"), sample_weight=mlm_weights)
        self.masked_lm_loss.update_state(_flat(outputs["mlm_loss"], "float32"), sample_weight=mlm_weights)
        if self._sampled:
            self.sampled_masked_lm_accuracy.update_state(
                mlm_ids, _flat(outputs["sampled_tokids"], "int32"), sample_weight=mlm_weights)
        if self._disc:
            mask = _flat(outputs["input_mask"], "float32")
            labels = _flat(outputs["disc_labels"], "float32")
            preds = _flat(outputs["disc_preds"], "float32")
            probs = _flat(outputs["disc_probs"], "float32")
            self.disc_loss.update_state(_flat(outputs["disc_loss"], "float32"))
            if self.disc_auc_include_padding:
                self.disc_auc.update_state(labels * mask, probs * mask)
            else:
                self.disc_auc.update_state(labels, probs, sample_weight=mask)
            self.disc_accuracy.update_state(labels, preds, sample_weight=mask)
            self.disc_precision.update_state(labels, preds, sample_weight=preds * mask)
            self.disc_recall.update_state(labels, preds, sample_weight=labels * mask)
            self.disc_replaced_share.update_state(labels, sample_weight=mask)

    def result(self) -> Dict[str, object]:
        """Returns {official name: float32 scalar tensor} for the metrics that exist."""
        return {m.name: ops.convert_to_tensor(m.result()) for m in self.metrics}

    def reset_state(self) -> None:
        """Clears all accumulated state (start of an evaluation)."""
        for m in self.metrics:
            m.reset_state()
