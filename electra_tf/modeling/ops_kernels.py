"""The transformer's elementwise kernels in `keras.ops`: the code every Keras backend runs.

JAX and PyTorch always run these (`kernel_settings.KERNELS` "ops"), and TensorFlow does when
KERNELS is "ops"; TensorFlow's default kernels are fused.py's and xla_clusters.py's. The
functions compute what the XLA clusters (xla_clusters.py) compute, with the same numerics:
- every elementwise step (bias adds, GELU, mask + softmax, dropout, residual add, LayerNorm)
  in float32 whatever the compute dtype, rounded to the compute dtype once at the end, as the
  clusters do under mixed_bfloat16 / mixed_float16 (the matmuls stay in the compute dtype);
- LayerNorm as (x - mean) * rsqrt(var + epsilon) * gamma + beta, the exact (erf) GELU, the
  padding mask as a -1e9 score bias, so float32 results equal TensorFlow's to float rounding;
- dropout as x * mask with mask in {0, 1 / (1 - rate)}, the mask drawn from the Dropout layer's
  seed generator (advanced once per draw, as keras' Dropout does): with DROPOUT_RNG "hash" the
  counter-based words of `rng.dropout_bits`, bit-identical to dropout_streams.py's on every
  backend, so a model drops the same elements on TensorFlow, JAX and PyTorch.
Gradients are the backends' automatic ones.

`draw` is the only function here with an effect (it advances a seed generator); the others are
pure functions of their tensors.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import keras
from keras import ops

from electra_tf.modeling import kernel_settings, rng

# The score added at padded keys: keras' `_large_negative_number` in float32 (the scores are
# float32 here, so float16's -3e4 is never needed). exp(score - 1e9) underflows to 0 whenever a
# row has one real key, so the probabilities equal those of masking by selection.
MASKED_SCORE = -1e9

# Exact GELU: Phi(x) = 0.5 + 0.5 * erf(x / sqrt(2)).
_SQRT_HALF = 0.7071067811865476


class Draw(NamedTuple):
    """One dropout call's randomness: its rate, its stream and the tensor defining the mask.

    `tensor` is the int32 [2] seed of the hash (kind "hash"), or u ~ U[0, 1) shaped like the
    input (kind "philox", the backend's own stream, as `keras.layers.Dropout` draws it).
    """
    rate: float
    kind: str
    tensor: object


def draw(layer: keras.layers.Dropout, shape, dtype, training) -> Optional[Draw]:
    """Advances `layer`'s seed generator once, as keras' Dropout does, and returns the draw.

    Args:
        layer: the keras Dropout layer whose rate and seed generator to use.
        shape: the shape of the tensor to drop (`ops.shape(x)`).
        dtype: the input's dtype (a "philox" draw is in it, as keras draws it).
        training: dropout only applies in training calls.

    Returns:
        The draw, or None when no dropout applies (not training, or rate 0): then the seed
        generator is not advanced either (as dropout_streams.draw_noise).
    """
    rate = float(layer.rate)
    if not training or rate <= 0:
        return None
    if kernel_settings.DROPOUT_RNG == "hash":
        return Draw(rate, "hash", rng.keras_seed(layer.seed_generator))
    return Draw(rate, "philox", keras.random.uniform(shape, dtype=dtype,
                                                     seed=layer.seed_generator))


def dropout(x, noise: Optional[Draw]):
    """x * mask, mask 1 / (1 - rate) where an element is kept and 0 where it is dropped.

    Args:
        x: float tensor.
        noise: the draw for x (`draw` with x's shape), or None (x is returned).

    Returns:
        A tensor like x.
    """
    if noise is None:
        return x
    shape = ops.shape(x)
    if noise.kind == "hash":
        keep = rng.keep_mask(rng.dropout_bits(noise.tensor, shape), noise.rate)
    else:
        keep = ops.greater_equal(noise.tensor, ops.cast(noise.rate, noise.tensor.dtype))
    scale = 0.0 if noise.rate >= 1 else 1.0 / (1.0 - noise.rate)
    return x * ops.where(keep, ops.cast(scale, x.dtype), ops.cast(0.0, x.dtype))


def layer_norm(x, gamma, beta, epsilon: float):
    """float32 LayerNorm over the last axis (fused.py's formula).

    Args:
        x: float32 [..., H].
        gamma, beta: float32 [H].
        epsilon: added to the variance.

    Returns:
        float32 [..., H].
    """
    mean = ops.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    rstd = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
    return centered * rstd * gamma + beta


def gelu(x):
    """Exact GELU, x * Phi(x) with Phi from erf (the form of xla_clusters.py's and keras')."""
    return x * (0.5 + 0.5 * ops.erf(x * _SQRT_HALF))


def bias_activation(h, bias, activation):
    """activation(h + bias); the exact GELU in float32 (as xla_clusters.bias_gelu), others in
    h's dtype.

    Args:
        h: [..., N] matmul output in the compute dtype.
        bias: [N] float32.
        activation: a keras activation function, or None.

    Returns:
        A tensor like h.
    """
    if activation is keras.activations.gelu:
        return ops.cast(gelu(ops.cast(h, "float32") + bias), h.dtype)
    h = h + ops.cast(bias, h.dtype)
    return h if activation is None else activation(h)


def padding_bias(padding_mask):
    """float32 [B, 1, 1, L]: 0 at real keys, MASKED_SCORE at padding.

    Args:
        padding_mask: [B, L], nonzero / True at real tokens.
    """
    keep = ops.cast(padding_mask, "bool")[:, None, None, :]
    return ops.where(keep, 0.0, MASKED_SCORE)


def attention_probs(scores, mask_bias, noise: Optional[Draw]):
    """dropout(softmax(scores + mask_bias)), float32 math (as xla_clusters.attention_probs).

    Args:
        scores: [B, heads, Lq, Lk] in the compute dtype.
        mask_bias: float32, broadcastable to scores (`padding_bias`), or None.
        noise: the draw for the probabilities, or None.

    Returns:
        [B, heads, Lq, Lk] in scores' dtype.
    """
    logits = ops.cast(scores, "float32")
    if mask_bias is not None:
        logits = logits + mask_bias
    return ops.cast(dropout(ops.softmax(logits, axis=-1), noise), scores.dtype)


def bias_dropout_residual_norm(h, bias, residual, gamma, beta, epsilon: float,
                               noise: Optional[Draw]):
    """LayerNorm(dropout(h + bias) + residual), float32 math (as
    xla_clusters.bias_dropout_residual_norm).

    Args:
        h: [rows, H] matmul output in the compute dtype.
        bias, gamma, beta: [H] float32.
        residual: [rows, H] in the compute dtype.
        epsilon: LayerNorm epsilon.
        noise: the draw for h + bias, or None.

    Returns:
        [rows, H] in h's dtype.
    """
    x = dropout(ops.cast(h, "float32") + bias, noise) + ops.cast(residual, "float32")
    return ops.cast(layer_norm(x, gamma, beta, epsilon), h.dtype)


def norm_dropout(x, gamma, beta, epsilon: float, noise: Optional[Draw]):
    """dropout(LayerNorm(x)) over the last axis, float32 math (as xla_clusters.norm_dropout).

    Args:
        x: [..., E] in the compute dtype.
        gamma, beta: [E] float32.
        epsilon: LayerNorm epsilon.
        noise: the draw for the normalized values, or None.

    Returns:
        A tensor like x.
    """
    return ops.cast(dropout(layer_norm(ops.cast(x, "float32"), gamma, beta, epsilon), noise),
                    x.dtype)
