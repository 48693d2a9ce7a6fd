"""Tagging metrics: chunk's span F1 (official `EntityLevelF1Scorer`), ner's entity F1 (seqeval's),
pos's token accuracy.

chunk (`span_f1`):

Per sentence, n = round(sum of labels_mask) words were tagged; only labels[:n] and
predictions[:n] are compared, so words cut by truncation count neither as gold nor as
predicted. Gold and predicted spans are sets of (start, end, type) from `spans.span_labels` over
the label names; over all sentences, correct = |gold & predicted|, P = 100 correct / predicted,
R = 100 correct / gold, F1 = 2PR / (P + R), and all three are 0 when nothing is correct.

`loss` = sum of the sentence losses / number of tagged words. The official scorer adds every
sentence's loss twice (QUIRK Q10, fixed); `legacy_loss=True` reports the doubled value.

ner (`entity_f1`): micro-averaged entity precision / recall / F1 over all sentences, entities as
`entities.entities` finds them (seqeval's default or strict mode), x 100; equal to seqeval's
`precision_score` / `recall_score` / `f1_score` (average "micro", zero_division 0) on the same
tag sequences (tested). The sequences are whole sentences: words cut by the truncation are
predicted "O" (so their gold entities count as missed).

pos (`token_accuracy`): 100 x correct words / words, cut words counted wrong.

Both report `loss` as chunk does (per tagged word, not doubled).
"""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from electra_tf.finetuning.tagging.entities import entities
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


def word_loss(losses: np.ndarray, labels_mask: np.ndarray) -> float:
    """Sum of the sentence losses / number of tagged words (chunk's `loss`, un-doubled)."""
    total = float(np.sum(np.asarray(losses, np.float64)))
    return total / max(1, int(round(float(np.sum(labels_mask)))))


def entity_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], scheme: str,
              mode: str) -> Dict[str, float]:
    """{"precision", "recall", "f1"} x 100 of entities (module docstring).

    Args:
        gold: per sentence, its gold tags.
        predicted: per sentence, as many predicted tags.
        scheme: "BIO" or "BIOES".
        mode: "default" or "strict" (entities.py).
    """
    correct = n_gold = n_predicted = 0
    for gold_tags, predicted_tags in zip(gold, predicted):
        assert len(gold_tags) == len(predicted_tags)
        gold_set = set(entities(gold_tags, scheme, mode))
        predicted_set = set(entities(predicted_tags, scheme, mode))
        correct += len(gold_set & predicted_set)
        n_gold += len(gold_set)
        n_predicted += len(predicted_set)
    precision = 100.0 * correct / n_predicted if n_predicted else 0.0
    recall = 100.0 * correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def token_accuracy(gold: Sequence[Sequence[str]],
                   predicted: Sequence[Sequence[str]]) -> Dict[str, float]:
    """{"accuracy"}: 100 x words whose predicted tag is the gold one / words."""
    total = sum(len(g) for g in gold)
    correct = sum(g == p for gold_tags, predicted_tags in zip(gold, predicted)
                  for g, p in zip(gold_tags, predicted_tags))
    return {"accuracy": 100.0 * correct / max(1, total)}
