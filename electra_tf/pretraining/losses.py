"""The generator's masked-LM loss and the discriminator's replaced-token-detection loss.

Both follow the official normalisation: a weighted sum over the whole batch divided by
(sum of weights + 1e-6), i.e. a mean per masked slot (MLM) or per real token (RTD) over the batch,
not a mean of per-example means. All math is float32 whatever the logits' dtype, so mixed
precision changes nothing here.

Everything is `keras.ops` (every backend); on TensorFlow the MLM cross-entropy keeps a faster
hand-written gradient of the same function (`_tf_softmax_cross_entropy`).

Under `tf.distribute` the denominator is the GLOBAL sum of weights (all-reduced across replicas)
while the numerator stays local, so each replica returns its CONTRIBUTION
local_sum / (global_weight_sum + 1e-6). Summing the per-replica losses
(`strategy.reduce(SUM, ...)`) gives exactly the one-device loss of the global batch, and, since
the denominator is a constant for differentiation, the replicas' gradients summed by the
optimizer's all-reduce equal the one-device gradient. Do NOT divide these losses by
`num_replicas_in_sync` again. Outside a strategy (or with one replica) they are plain batch losses. On JAX and PyTorch a step
sees the whole global batch (keras.distribution shards its arrays), so the sums are global as
they are.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import keras
from keras import ops

# Official get_softmax_output / _get_discriminator_output: `loss = sum / (sum(weights) + 1e-6)`.
LOSS_DENOMINATOR_EPS = 1e-6


def global_sum(x):
    """Sum of `x` over all replicas in sync, or `x` itself when there is nothing to sum over.

    Inside a tf.distribute replica context with more than one replica this is an all-reduce, so
    every replica must call it (the loss functions below do so unconditionally). In cross-replica
    context, with a single replica, or on another backend (one program over the global batch),
    it returns `x` unchanged.

    Args:
        x: tensor (typically a float32 scalar).

    Returns:
        Tensor of the same shape and dtype.
    """
    if keras.backend.backend() != "tensorflow":
        return x
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)


class MLMLoss(NamedTuple):
    """Masked-LM loss outputs (official `MLMOutput` without the [B, N, V] tensors).

    Attributes:
        loss: float32 scalar. This replica's contribution to the global-batch loss.
        per_position_nll: float32 [batch_size, N]. -log p(original id) per slot (the official
            `per_example_loss`, which is per slot despite its name); unweighted.
        predictions: int32 [batch_size, N]. argmax of the logits (official `preds`).
    """

    loss: Any
    per_position_nll: Any
    predictions: Any


class RTDLoss(NamedTuple):
    """Replaced-token-detection loss outputs (official `DiscOutput`).

    Attributes:
        loss: float32 scalar. This replica's contribution to the global-batch loss.
        per_example_loss: float32 [batch_size]. Per-sequence token mean (local, not global).
        probs: float32 [batch_size, seq_length]. sigmoid(logits).
        preds: int32 [batch_size, seq_length]. 1 iff logit > 0.
    """

    loss: Any
    per_example_loss: Any
    probs: Any
    preds: Any


def mlm_loss(logits, masked_lm_ids, masked_lm_weights, denominator=None) -> MLMLoss:
    """Generator loss: sum(w * nll) / (global sum(w) + 1e-6) over the masked slots.

    Duplicate masked positions are separate slots and count twice, as in the official code.

    Args:
        logits: float [batch_size, N, vocab_size]. Cast to float32.
        masked_lm_ids: int [batch_size, N]. Target (original) ids.
        masked_lm_weights: float [batch_size, N]. 1 for used slots, 0 for unused ones.
        denominator: optional float32 scalar used instead of the global sum(w), e.g. the sum
            over all micro-batches of an accumulated step (`weight_sum`); no all-reduce then.

    Returns:
        An `MLMLoss`.
    """
    logits = ops.cast(logits, "float32")
    weights = ops.cast(masked_lm_weights, "float32")
    vocab_size = logits.shape[-1]
    flat = ops.reshape(logits, [-1, vocab_size])
    labels = ops.reshape(ops.cast(masked_lm_ids, "int32"), [-1])
    if keras.backend.backend() == "tensorflow":
        nll, predictions = _tf_softmax_cross_entropy()(flat, labels)
    else:
        nll, predictions = _softmax_cross_entropy(flat, labels)
    slots = ops.shape(weights)
    nll = ops.reshape(nll, slots)
    predictions = ops.reshape(predictions, slots)
    loss = ops.sum(weights * nll) / _denominator(weights, denominator)
    return MLMLoss(loss=loss, per_position_nll=nll, predictions=predictions)


def _softmax_cross_entropy(logits, labels):
    """-log_softmax(logits)[label] and argmax(logits), row-wise (the official one-hot product,
    without a [rows, vocab] one-hot).

    Args:
        logits: float32 [rows, vocab].
        labels: int32 [rows].

    Returns:
        nll: float32 [rows]; predictions: int32 [rows] (argmax, no gradient).
    """
    label_logits = ops.take_along_axis(logits, ops.expand_dims(labels, -1), axis=-1)[:, 0]
    nll = ops.logsumexp(logits, axis=-1) - label_logits
    predictions = ops.stop_gradient(ops.cast(ops.argmax(logits, axis=-1), "int32"))
    return nll, predictions


@functools.lru_cache(maxsize=None)
def _tf_softmax_cross_entropy():
    """`_softmax_cross_entropy` for TensorFlow, from one softmax pass, with its gradient written
    out.

    `tf.nn.sparse_softmax_cross_entropy_with_logits` is a slow scalar kernel on CPU (measured
    ~7x the oneDNN softmax on [608, 30522]); here the softmax is the vectorised oneDNN kernel and
    everything else is a row reduction or a gather:
        nll = log(sum_v exp(l_v - max)) - (l_label - max) = -log(p_argmax) - (l_label - l_argmax),
    since p_argmax = exp(max - logsumexp) >= 1/vocab never underflows. Gradient: (p - onehot) * g.
    """
    import tensorflow as tf

    @tf.custom_gradient
    def cross_entropy(logits, labels):
        probs = tf.nn.softmax(logits)
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
        label_logits = tf.gather(logits, labels, batch_dims=1)
        max_logits = tf.gather(logits, predictions, batch_dims=1)
        max_probs = tf.gather(probs, predictions, batch_dims=1)
        nll = -tf.math.log(max_probs) - (label_logits - max_logits)

        def grad(upstream_nll, upstream_predictions=None):
            del upstream_predictions  # integer output
            rows = tf.range(tf.shape(labels)[0], dtype=labels.dtype)
            index = tf.stack([rows, labels], axis=1)
            grad_logits = tf.tensor_scatter_nd_sub(probs * upstream_nll[:, tf.newaxis], index,
                                                   upstream_nll)
            return grad_logits, None

        return (nll, predictions), grad

    return cross_entropy


def rtd_loss(logits, labels, input_mask, denominator=None) -> RTDLoss:
    """Discriminator loss: sum(sigmoid_ce * input_mask) / (global sum(input_mask) + 1e-6).

    [CLS], [SEP] and every real token count; padding does not.

    Args:
        logits: float [batch_size, seq_length]. Cast to float32.
        labels: int [batch_size, seq_length]. 1 = replaced (`FakeInputs.is_fake`).
        input_mask: int [batch_size, seq_length].
        denominator: optional float32 scalar used instead of the global sum(input_mask), as
            for `mlm_loss`.

    Returns:
        An `RTDLoss`.
    """
    logits = ops.cast(logits, "float32")
    weights = ops.cast(input_mask, "float32")
    labels = ops.cast(labels, "float32")
    # sigmoid cross-entropy in its stable form (TensorFlow's): max(x, 0) - x z + log(1 + e^-|x|)
    cross_entropy = (ops.relu(logits) - logits * labels
                     + ops.log1p(ops.exp(-ops.abs(logits))))
    losses = weights * cross_entropy
    per_example_loss = ops.sum(losses, axis=-1) / (ops.sum(weights, axis=-1)
                                                   + LOSS_DENOMINATOR_EPS)
    loss = ops.sum(losses) / _denominator(weights, denominator)
    probs = ops.sigmoid(logits)
    # Official: round((sign(logits) + 1) / 2); a logit of exactly 0 gives 0.5, rounded to even: 0.
    preds = ops.cast(logits > 0, "int32")
    return RTDLoss(loss=loss, per_example_loss=per_example_loss, probs=probs, preds=preds)


def weight_sum(weights):
    """The global (all-replica) sum of loss weights, without gradient: a loss denominator
    before the +1e-6."""
    return global_sum(ops.stop_gradient(ops.sum(ops.cast(weights, "float32"))))


def _denominator(weights, denominator):
    if denominator is None:
        return weight_sum(weights) + LOSS_DENOMINATOR_EPS
    return ops.cast(denominator, "float32") + LOSS_DENOMINATOR_EPS
