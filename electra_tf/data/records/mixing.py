"""How much training batches look like uniform random draws of examples (a diagnostic).

Given the batches a pipeline produced, as integer labels per example (its source, e.g. a corpus
file or collection, and its position in corpus order), `mixing_statistics` compares them with
batches drawn at random from the same examples:

* `p_value`: two-sided p-value of the summed per-batch Pearson chi-square of source counts
  against the global source shares (chi-square with batches * (sources - 1) degrees of freedom
  for random draws): tiny when batches are dominated by one source;
* `tv_ratio`: mean total-variation distance of a batch's source shares from the global shares,
  divided by the same mean for random draws (1 when mixed like a random draw);
* `spread_ratio`: mean within-batch standard deviation of corpus positions, divided by that of
  random draws (well below 1 when batches walk the corpus in order).
Used by the tests (tests/data/test_mixing.py) and the scaling benchmark (benchmarks/build_dataset.py).
"""

from __future__ import annotations

from typing import Dict

import numpy as np

RANDOM_BATCHES = 2000  # random draws simulated for the reference values


def _source_counts(sources: np.ndarray, num_sources: int) -> np.ndarray:
    return np.stack([(sources == s).sum(axis=1) for s in range(num_sources)], axis=1)


def _total_variation(counts: np.ndarray, shares: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(counts / counts.sum(axis=-1, keepdims=True) - shares).sum(axis=-1)


def chi_square_upper_tail(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof) (the regularised upper incomplete gamma)."""
    import tensorflow as tf  # lazy: only callers that compute p-values need it

    return float(tf.math.igammac(dof / 2.0, statistic / 2.0))


def mixing_statistics(sources: np.ndarray, positions: np.ndarray,
                      rng: np.random.Generator) -> Dict[str, float]:
    """Compares batches with random draws (see the module docstring).

    Args:
        sources: int [num_batches, batch_size], each example's source id (0..S-1).
        positions: int or float [num_batches, batch_size], each example's corpus position.
        rng: numpy Generator for the simulated random draws.

    Returns:
        {"p_value", "tv_ratio", "spread_ratio", "chi_square", "dof", "tv", "spread", and
        descriptive means with their random-draw values: "span" / "random_span" (corpus
        positions covered by a batch), "majority_share" / "random_majority_share" (share of a
        batch's largest source), "batches_90pct_one_source" / "random_..." (fraction of batches
        that are >= 90% one source)}.
    """
    sources = np.asarray(sources)
    positions = np.asarray(positions, dtype=np.float64)
    num_batches, batch_size = sources.shape
    num_sources = int(sources.max()) + 1
    flat_sources, flat_positions = sources.reshape(-1), positions.reshape(-1)
    shares = np.bincount(flat_sources, minlength=num_sources) / flat_sources.size
    counts = _source_counts(sources, num_sources)
    expected = batch_size * shares
    present = expected > 0
    chi_square = float((((counts - expected) ** 2)[:, present] / expected[present]).sum())
    dof = num_batches * (int(present.sum()) - 1)
    upper = chi_square_upper_tail(chi_square, dof) if dof > 0 else 1.0
    picks = np.stack([rng.choice(flat_sources.size, batch_size, replace=False)
                      for _ in range(RANDOM_BATCHES)])
    random_counts = _source_counts(flat_sources[picks], num_sources)
    random_tv = _total_variation(random_counts, shares)
    random_spread = flat_positions[picks].std(axis=1)
    tv = _total_variation(counts, shares).mean()
    spread = positions.std(axis=1).mean()
    span = positions.max(axis=1) - positions.min(axis=1)
    random_span = flat_positions[picks].max(axis=1) - flat_positions[picks].min(axis=1)
    majority = counts.max(axis=1) / batch_size
    random_majority = random_counts.max(axis=1) / batch_size
    return {"p_value": 2 * min(upper, 1 - upper), "tv_ratio": float(tv / random_tv.mean()),
            "spread_ratio": float(spread / random_spread.mean()), "chi_square": chi_square,
            "dof": dof, "tv": float(tv), "spread": float(spread),
            # Descriptive: the span of corpus positions in a batch, the share of its largest
            # source, and how often one source makes up >= 90% of a batch (observed, random).
            "span": float(span.mean()), "random_span": float(random_span.mean()),
            "majority_share": float(majority.mean()),
            "random_majority_share": float(random_majority.mean()),
            "batches_90pct_one_source": float((majority >= 0.9).mean()),
            "random_batches_90pct_one_source": float((random_majority >= 0.9).mean())}
