"""A linear probe: multinomial logistic regression on frozen features, fit from scratch.

Pure numpy / scipy (no Keras, no global random state), so the learning probe of a pretraining
run (`finetuning.probe`) can call it between training loops without touching the run, and tests
can check it on toy data. The fit is deterministic: features are standardised with the training
set's mean and standard deviation, the weights start at zero and L-BFGS (scipy) minimises

    mean cross-entropy + 0.5 * l2 * ||W||^2        (the bias is not penalised)

in float64 to its tolerance or `MAX_ITERATIONS`, whichever comes first. The L2 term keeps the
optimum finite on separable data and bounds the iterations the fit needs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.optimize

# L-BFGS iterations: the fit's cost is bounded whatever the features.
MAX_ITERATIONS = 500
# Standard deviations below this (a constant feature) divide by 1 instead.
MIN_STD = 1e-6


class ProbeResult(NamedTuple):
    """Accuracies of one probe fit (fractions in [0, 1]).

    Attributes:
        train_accuracy: float. On the examples the classifier was fit on.
        dev_accuracy: float. On the held-out examples.
        majority_accuracy: float. Dev accuracy of always answering the most frequent training
            label: the score a probe that learned nothing reaches.
        iterations: int. L-BFGS iterations the fit took.
    """

    train_accuracy: float
    dev_accuracy: float
    majority_accuracy: float
    iterations: int


def standardise(train: np.ndarray, dev: np.ndarray):
    """Both sets scaled by the training set's per-feature mean and standard deviation.

    Args:
        train: float [n_train, dim].
        dev: float [n_dev, dim].

    Returns:
        (train, dev), float64 [n, dim] each.
    """
    train = np.asarray(train, np.float64)
    dev = np.asarray(dev, np.float64)
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std < MIN_STD, 1.0, std)
    return (train - mean) / std, (dev - mean) / std


def _objective(params: np.ndarray, x: np.ndarray, one_hot: np.ndarray, l2: float):
    """Mean cross-entropy + 0.5 * l2 * ||W||^2 and its gradient over params = [W; b] flat."""
    n, dim = x.shape
    num_labels = one_hot.shape[1]
    weights = params[:dim * num_labels].reshape(dim, num_labels)
    bias = params[dim * num_labels:]
    logits = x @ weights + bias
    logits -= logits.max(axis=1, keepdims=True)  # stable log-softmax
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = -(one_hot * log_probs).sum() / n + 0.5 * l2 * float((weights ** 2).sum())
    error = (np.exp(log_probs) - one_hot) / n  # d loss / d logits
    grad_weights = x.T @ error + l2 * weights
    return loss, np.concatenate([grad_weights.ravel(), error.sum(axis=0)])


def fit_logistic(x: np.ndarray, labels: np.ndarray, num_labels: int, l2: float):
    """Multinomial logistic regression by L-BFGS from zero weights.

    Args:
        x: float64 [n, dim]. Standardised features.
        labels: int [n]. Label ids in [0, num_labels).
        num_labels: int. Number of classes (>= 2).
        l2: float. Weight of 0.5 * ||W||^2 (> 0).

    Returns:
        (weights [dim, num_labels], bias [num_labels], iterations).
    """
    dim = x.shape[1]
    one_hot = np.eye(num_labels)[np.asarray(labels)]
    start = np.zeros(dim * num_labels + num_labels)
    found = scipy.optimize.minimize(_objective, start, args=(x, one_hot, l2), jac=True,
                                    method="L-BFGS-B",
                                    options={"maxiter": MAX_ITERATIONS})
    params = found.x
    return (params[:dim * num_labels].reshape(dim, num_labels), params[dim * num_labels:],
            int(found.nit))


def predict(x: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Label ids [n] of the largest logit (the lowest id on a tie)."""
    return np.argmax(x @ weights + bias, axis=1)


def probe_accuracy(train_features: np.ndarray, train_labels: np.ndarray,
                   dev_features: np.ndarray, dev_labels: np.ndarray, num_labels: int,
                   l2: float) -> ProbeResult:
    """Fits a linear classifier on the training features and scores it on both sets.

    Args:
        train_features: float [n_train, dim].
        train_labels: int [n_train]. Label ids in [0, num_labels).
        dev_features: float [n_dev, dim].
        dev_labels: int [n_dev].
        num_labels: int. Number of classes (>= 2).
        l2: float. The fit's L2 weight (> 0).

    Returns:
        ProbeResult.
    """
    train_labels = np.asarray(train_labels, np.int64)
    dev_labels = np.asarray(dev_labels, np.int64)
    train_x, dev_x = standardise(train_features, dev_features)
    weights, bias, iterations = fit_logistic(train_x, train_labels, num_labels, l2)
    majority = np.bincount(train_labels, minlength=num_labels).argmax()
    return ProbeResult(
        train_accuracy=float(np.mean(predict(train_x, weights, bias) == train_labels)),
        dev_accuracy=float(np.mean(predict(dev_x, weights, bias) == dev_labels)),
        majority_accuracy=float(np.mean(dev_labels == majority)),
        iterations=iterations)
