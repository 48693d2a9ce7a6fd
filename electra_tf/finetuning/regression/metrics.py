"""Regression metrics as the official `RegressionScorer` reports them (scipy's definitions).

- `pearson`: 100 * Pearson's r of (targets, predictions);
- `spearman`: 100 * Spearman's rho: Pearson's r of the ranks, ties given their average rank
  (scipy.stats.spearmanr);
- `mse`: mean squared error on the scale the model is trained on (STS: [0, 1], the label / 5);
- `loss`: the mean per-record loss of the head (for regression the same squared error, computed
  in float32 by the model).

Both correlations are unchanged by the /5 scaling, so they equal the correlations on the 0-5 STS
scale. A constant series has no correlation: the value is NaN (scipy returns NaN too).
"""

from __future__ import annotations

from typing import Dict

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span (scipy `rankdata` "average")."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Boundaries of runs of equal values in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), np.float64)
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + 1 + end) / 2.0  # mean of start+1 .. end
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r (float64); NaN when either series is constant or shorter than 2."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if len(x) < 2:
        return float("nan")
    dx = x - x.mean()
    dy = y - y.mean()
    denominator = np.sqrt(np.dot(dx, dx) * np.dot(dy, dy))
    if denominator == 0:
        return float("nan")
    return float(np.clip(np.dot(dx, dy) / denominator, -1.0, 1.0))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho with average ranks for ties."""
    return pearson(average_ranks(x), average_ranks(y))


def regression_metrics(targets: np.ndarray, predictions: np.ndarray,
                       losses: np.ndarray) -> Dict[str, float]:
    """{"pearson", "spearman", "mse", "loss"} in the official order and units.

    Args:
        targets: float [n], on the training scale.
        predictions: float [n], the head's outputs.
        losses: float [n], the head's per-record losses.
    """
    targets = np.asarray(targets, np.float64)
    predictions = np.asarray(predictions, np.float64)
    return {
        "pearson": 100.0 * pearson(targets, predictions),
        "spearman": 100.0 * spearman(targets, predictions),
        "mse": float(np.mean(np.square(targets - predictions))),
        "loss": float(np.mean(np.asarray(losses, np.float64))),
    }
