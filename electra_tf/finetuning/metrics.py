"""Classification metrics from a confusion matrix: accuracy, F1 (binary and macro) and MCC.

- accuracy: correct / total.
- f1: binary tasks only, the F1 of label id 1 (the GLUE "1", e.g. MRPC/QQP "paraphrase"; for a
  generic task the second label in sorted order, e.g. "pos" of neg/pos).
- macro_f1: unweighted mean of per-class F1 over the classes that occur in the labels or the
  predictions (scikit-learn's default label set), each 2TP / (2TP + FP + FN).
- mcc: Matthews correlation; for more than two classes Gorodkin's generalisation
  (c*s - Σ p_k t_k) / sqrt((s² - Σ p_k²)(s² - Σ t_k²)), c = correct, s = total,
  p_k / t_k = predicted / true count of class k; it equals the binary formula for two classes.
  A zero denominator gives 0 (scikit-learn's convention). CoLA's official metric.
"""

from __future__ import annotations

import math
from typing import Dict

import numpy as np

METRIC_NAMES = ("accuracy", "f1", "macro_f1", "mcc")


def confusion_matrix(label_ids: np.ndarray, predictions: np.ndarray, num_labels: int) -> np.ndarray:
    """int64 [num_labels, num_labels]; row = true label, column = prediction."""
    label_ids = np.asarray(label_ids, np.int64)
    predictions = np.asarray(predictions, np.int64)
    if label_ids.shape != predictions.shape:
        raise ValueError(f"{label_ids.shape[0]} labels but {predictions.shape[0]} predictions")
    matrix = np.zeros([num_labels, num_labels], np.int64)
    np.add.at(matrix, (label_ids, predictions), 1)
    return matrix


def _f1(tp: float, fp: float, fn: float) -> float:
    denominator = 2 * tp + fp + fn
    return 0.0 if denominator == 0 else 2 * tp / denominator


def classification_metrics(label_ids: np.ndarray, predictions: np.ndarray,
                           num_labels: int) -> Dict[str, float]:
    """Accuracy, F1 (binary only), macro F1 and MCC; see the module docstring.

    Args:
        label_ids: int [n]. True label ids.
        predictions: int [n]. Predicted label ids.
        num_labels: int.

    Returns:
        {"accuracy", "macro_f1", "mcc", "n"} plus "f1" when num_labels == 2.
    """
    matrix = confusion_matrix(label_ids, predictions, num_labels).astype(np.float64)
    total = matrix.sum()
    correct = np.trace(matrix)
    true_counts = matrix.sum(axis=1)
    predicted_counts = matrix.sum(axis=0)
    tp = np.diag(matrix)
    fp = predicted_counts - tp
    fn = true_counts - tp
    present = (true_counts + predicted_counts) > 0
    per_class = [_f1(tp[k], fp[k], fn[k]) for k in range(num_labels)]
    results = {
        "accuracy": float(correct / total) if total else 0.0,
        "macro_f1": float(np.mean([per_class[k] for k in range(num_labels) if present[k]]))
        if present.any() else 0.0,
        "n": int(total),
    }
    if num_labels == 2:
        results["f1"] = float(per_class[1])
    covariance = correct * total - float(np.dot(predicted_counts, true_counts))
    denominator = math.sqrt((total ** 2 - float(np.dot(predicted_counts, predicted_counts)))
                            * (total ** 2 - float(np.dot(true_counts, true_counts))))
    results["mcc"] = float(covariance / denominator) if denominator > 0 else 0.0
    return results


def mean_and_std(values) -> Dict[str, float]:
    """{"mean", "std"}: std is the sample standard deviation (ddof=1), 0 for one value."""
    values = np.asarray(list(values), np.float64)
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return {"mean": float(values.mean()), "std": std}
