"""Span-level F1 (official `EntityLevelF1Scorer`).

Per sentence, n = round(sum of labels_mask) words were tagged; only labels[:n] and
predictions[:n] are compared, so words cut by truncation count neither as gold nor as
predicted. Gold and predicted spans are sets of (start, end, type) from `spans.span_labels` over
the label names; over all sentences, correct = |gold & predicted|, P = 100 correct / predicted,
R = 100 correct / gold, F1 = 2PR / (P + R), and all three are 0 when nothing is correct.

`loss` = sum of the sentence losses / number of tagged words. The official scorer adds every
sentence's loss twice (QUIRK Q10, fixed); `legacy_loss=True` reports the doubled value.
"""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from electra_tf.finetuning.tagging.spans import span_labels


def span_f1(label_ids: np.ndarray, predictions: np.ndarray, labels_mask: np.ndarray,
            losses: np.ndarray, label_names: Sequence[str],
            legacy_loss: bool = False) -> Dict[str, float]:
    """{"precision", "recall", "f1", "loss"} in the official order and units.

    Args:
        label_ids: int [n, seq]. Gold label ids by word.
        predictions: int [n, seq]. Predicted label ids by word.
        labels_mask: float [n, seq]. 1 on tagged words.
        losses: float [n]. Per-sentence losses from the head.
        label_names: label names in id order.
        legacy_loss: report the official doubled loss.
    """
    correct = n_gold = n_predicted = 0
    total_words = 0
    for gold_row, predicted_row, mask in zip(label_ids, predictions, labels_mask):
        n = int(round(float(np.sum(mask))))
        total_words += n
        gold = set(span_labels([label_names[i] for i in gold_row[:n]]))
        predicted = set(span_labels([label_names[i] for i in predicted_row[:n]]))
        correct += len(gold & predicted)
        n_gold += len(gold)
        n_predicted += len(predicted)
    if correct == 0:
        precision = recall = f1 = 0.0
    else:
        precision = 100.0 * correct / n_predicted
        recall = 100.0 * correct / n_gold
        f1 = 2 * precision * recall / (precision + recall)
    loss = float(np.sum(np.asarray(losses, np.float64))) * (2 if legacy_loss else 1)
    return {"precision": precision, "recall": recall, "f1": f1,
            "loss": loss / max(1, total_words)}
