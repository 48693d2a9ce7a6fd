"""The transformer block's elementwise work as XLA clusters (KERNELS "xla", training calls).

TensorFlow only. Each run of elementwise work between two matmuls is one
`tf.function(jit_compile=True)` with a hand-written gradient that is itself one compiled
function, so XLA fuses it into one or two loops while the matmuls stay outside XLA (oneDNN on
CPU; cuBLAS on GPU). Five clusters:
    split_heads                   QKV bias, head split, query scale   grad: dqkv, db
    bias_gelu                     FFN: gelu(h + b)              grad: dh, db (one pass + column sum)
    attention_probs               dropout(softmax(s + mask))    grad: ds (from the output: no mask)
    bias_dropout_residual_norm    LN(dropout(h + b) + r)        grad: dh, db, dr, dgamma, dbeta
    norm_dropout                  dropout(LN(x)) (embeddings)   grad: dx, dgamma, dbeta
All of their arithmetic is float32 whatever the compute dtype (under mixed_bfloat16 the inputs
are upcast and the outputs rounded once, inside the fused loop, so it costs no memory traffic);
bias, gamma and beta gradients are summed in float32. Dropout inside a cluster applies a draw of
`dropout_streams` (the "hash" mask is computed in the loop and recomputed in the gradient).

The clusters run in training calls only (`kernel_settings.use_xla`): evaluation and exported
models use fused.py's op-by-op kernels, so serving a SavedModel never needs the XLA JIT. On GPU
and TPU they are ordinary XLA functions (on TPU everything is XLA anyway; on GPU XLA compiles
them for the device).
"""

from __future__ import annotations

import functools
from typing import Optional

import tensorflow as tf

from electra_tf.modeling.dropout_streams import Noise, dropout_scale
from electra_tf.modeling.fused import gelu_and_slope, norm_backward, norm_forward


def _compiled(fn):
    """`fn` (keyword-only static arguments after the tensors) as one XLA-compiled function per
    combination of static arguments, shared by every layer that calls it (one compilation per
    shape, not per layer)."""
    cache = {}

    @functools.wraps(fn)
    def call(*tensors, **static):
        key = tuple(sorted(static.items()))
        if key not in cache:
            cache[key] = tf.function(functools.partial(fn, **static), jit_compile=True,
                                     autograph=False)
        return cache[key](*tensors)

    return call


def _noise_tensor(noise: Optional[Noise]):
    return tf.zeros([2], tf.int32) if noise is None else noise.tensor


def _static_noise(noise: Optional[Noise]) -> dict:
    return {"rate": 0.0 if noise is None else noise.rate,
            "kind": "none" if noise is None else noise.kind}


def _apply_dropout(x32, noise_tensor, rate, kind):
    """float32 x * mask inside a cluster (mask from the draw or the hash, never stored)."""
    if kind == "none":
        return x32
    return x32 * dropout_scale(Noise(rate, kind, noise_tensor), tf.shape(x32), tf.float32)


def _column_sum(x):
    return tf.reduce_sum(tf.reshape(x, [-1, tf.shape(x)[-1]]), axis=0)


# --- QKV bias + head split + query scaling ------------------------------------------------------
@_compiled
def _split_heads_forward(qkv, bias, *, heads, scale):
    shape = tf.shape(qkv)  # [B, L, 3 * H]
    x = tf.reshape(tf.cast(qkv, tf.float32) + bias, [shape[0], shape[1], 3, heads, -1])
    query, key, value = tf.unstack(tf.transpose(x, [2, 0, 3, 1, 4]), 3)
    return tuple(tf.cast(t, qkv.dtype) for t in (query * scale, key, value))


@_compiled
def _split_heads_backward(d_query, d_key, d_value, *, scale):
    parts = [tf.cast(d_query, tf.float32) * scale, tf.cast(d_key, tf.float32),
             tf.cast(d_value, tf.float32)]  # [B, heads, L, hs] each
    if d_query.dtype != tf.float32:
        d = tf.stack(parts)  # [3, B, heads, L, hs]
        shape = tf.shape(d)
        d = tf.reshape(tf.transpose(d, [1, 3, 0, 2, 4]), [shape[1], shape[3], -1])  # [B, L, 3H]
        return tf.cast(d, d_query.dtype), _column_sum(d)
    # float32: XLA's CPU backend writes a reduction's operand to memory unless it is an
    # argument, so the column sum of the transposed [B, L, 3H] result above costs a second
    # transposed copy. Here the result is one transposed write and the bias gradient is summed
    # from the arguments in their head layout (the query scaled after the sum): ~20% faster on
    # ELECTRA-small's discriminator. (In bfloat16 the float32 upcasts would be written either
    # way, and the form above measured faster.)
    shape = tf.shape(d_query)
    d = tf.concat([tf.transpose(t, [0, 2, 1, 3]) for t in parts], 2)  # [B, L, 3 * heads, hs]
    sums = [tf.reduce_sum(t, axis=[0, 2]) for t in (d_query, d_key, d_value)]  # [heads, hs]
    return (tf.reshape(d, [shape[0], shape[2], -1]),
            tf.reshape(tf.stack([sums[0] * scale] + sums[1:]), [-1]))


def split_heads(qkv: tf.Tensor, bias: tf.Tensor, heads: int, scale: float):
    """(qkv + bias) split into scaled query, key and value heads, as one compiled loop.

    Args:
        qkv: [B, L, 3 * H] output of the fused QKV matmul, in the compute dtype.
        bias: [3 * H] float32 (query, key, value biases).
        heads: number of heads (H = heads * head_size).
        scale: the query scaling, 1 / sqrt(head_size).

    Returns:
        query * scale, key, value: [B, heads, L, head_size] each, in qkv's dtype. Gradient: one
        loop back to [B, L, 3H] plus the bias's column sum (no stack, transpose and BiasAddGrad
        kernels).
    """
    @tf.custom_gradient
    def run(qkv, bias):
        def grad(d_query, d_key, d_value):
            return _split_heads_backward(d_query, d_key, d_value, scale=scale)

        return _split_heads_forward(qkv, bias, heads=heads, scale=scale), grad

    return run(qkv, bias)


# --- bias + GELU (FFN intermediate) -------------------------------------------------------------
@_compiled
def _bias_gelu_forward(h, bias):
    y, _ = gelu_and_slope(tf.cast(h, tf.float32) + bias, use_erf=True)
    return tf.cast(y, h.dtype)


@_compiled
def _bias_gelu_backward(dy, h, bias):
    _, slope = gelu_and_slope(tf.cast(h, tf.float32) + bias, use_erf=True)
    dx = tf.cast(dy, tf.float32) * slope()
    return tf.cast(dx, h.dtype), _column_sum(dx)


def bias_gelu(h: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """Exact GELU of h + bias as one compiled loop; gradient one loop + a column sum.

    Args:
        h: [..., N] matmul output in the compute dtype.
        bias: [N] float32.

    Returns:
        gelu(h + bias) in h's dtype.
    """
    @tf.custom_gradient
    def run(h, bias):
        def grad(dy):
            return _bias_gelu_backward(dy, h, bias)

        return _bias_gelu_forward(h, bias), grad

    return run(h, bias)


# --- attention: mask + softmax + dropout ---------------------------------------------------------
@_compiled
def _attention_forward(scores, mask_bias, noise, *, rate, kind):
    probs = tf.nn.softmax(tf.cast(scores, tf.float32) + mask_bias, axis=-1)
    return tf.cast(_apply_dropout(probs, noise, rate, kind), scores.dtype), tf.cast(probs,
                                                                                  scores.dtype)


@_compiled
def _attention_backward(dout, out, probs):
    # The softmax gradient of g = dout * mask is p * (g - sum(g * p)). With out = p * mask (the
    # forward's output), g * p = dout * out, so d_scores = dout * out - p * sum(dout * out): the
    # same product without the mask, so the hash is not recomputed and a Philox draw need not be
    # kept. (XLA's CPU backend materialises a reduction's operand, so the mask form wrote
    # dout * mask and g * p to memory: ~1 ms per ELECTRA-small discriminator layer at batch 32.)
    g = tf.cast(dout, tf.float32) * tf.cast(out, tf.float32)
    p = tf.cast(probs, tf.float32)
    return tf.cast(g - p * tf.reduce_sum(g, axis=-1, keepdims=True), probs.dtype)


def attention_probs(scores: tf.Tensor, mask_bias: tf.Tensor, noise: Optional[Noise]) -> tf.Tensor:
    """dropout(softmax(scores + mask_bias)) as one compiled loop (float32 softmax).

    Args:
        scores: [B, heads, Lq, Lk] in the compute dtype.
        mask_bias: float32, broadcastable to scores (0 for keys to attend to, a large negative
            number for padding), e.g. [B, 1, 1, Lk].
        noise: the dropout draw (`draw_noise`) for the probabilities, or None.

    Returns:
        [B, heads, Lq, Lk] dropped-out probabilities in scores' dtype. Kept for the gradient:
        the softmax output (in scores' dtype, as TensorFlow's softmax keeps it) and this output
        (which the context product's gradient keeps anyway); not the dropout mask or draw.
    """
    static = _static_noise(noise)
    noise_tensor = _noise_tensor(noise)

    @tf.custom_gradient
    def run(scores):
        out, probs = _attention_forward(scores, mask_bias, noise_tensor, **static)

        def grad(dout):
            return _attention_backward(dout, out, probs)

        return out, grad

    return run(scores)


# --- bias + dropout + residual + LayerNorm (attention output, FFN output) -----------------------
@_compiled
def _bdrn_forward(h, bias, residual, gamma, beta, noise, *, rate, kind, epsilon):
    x = _apply_dropout(tf.cast(h, tf.float32) + bias, noise, rate, kind)
    y, normalized, rstd = norm_forward(x + tf.cast(residual, tf.float32), gamma, beta, epsilon)
    return tf.cast(y, h.dtype), normalized, rstd


@_compiled
def _bdrn_backward(dy, normalized, rstd, gamma, noise, *, rate, kind, dtype):
    dx, d_gamma, d_beta = norm_backward(tf.cast(dy, tf.float32), normalized, rstd, gamma)
    dh = _apply_dropout(dx, noise, rate, kind)
    return tf.cast(dh, dtype), _column_sum(dh), tf.cast(dx, dtype), d_gamma, d_beta


def bias_dropout_residual_norm(h, bias, residual, gamma, beta, epsilon: float,
                               noise: Optional[Noise]) -> tf.Tensor:
    """LayerNorm(dropout(h + bias) + residual) as one compiled loop; its gradient as another.

    Args:
        h: [rows, H] matmul output in the compute dtype.
        bias, gamma, beta: [H] float32.
        residual: [rows, H] in the compute dtype.
        epsilon: LayerNorm epsilon.
        noise: the dropout draw for h + bias, or None.

    Returns:
        [rows, H] in h's dtype. Kept for the gradient: the float32 normalized values and
        1/std per row (as the op-by-op LayerNorm keeps them), plus the draw ("philox") or
        nothing ("hash": the mask is recomputed).
    """
    static = dict(_static_noise(noise), epsilon=float(epsilon))
    noise_tensor = _noise_tensor(noise)
    dtype = h.dtype.name

    @tf.custom_gradient
    def run(h, bias, residual, gamma, beta):
        y, normalized, rstd = _bdrn_forward(h, bias, residual, gamma, beta, noise_tensor,
                                            **static)

        def grad(dy):
            return _bdrn_backward(dy, normalized, rstd, gamma, noise_tensor,
                                  rate=static["rate"], kind=static["kind"], dtype=dtype)

        return y, grad

    return run(h, bias, residual, gamma, beta)


# --- LayerNorm + dropout (embeddings) -----------------------------------------------------------
@_compiled
def _norm_dropout_forward(x, gamma, beta, noise, *, rate, kind, epsilon):
    y, normalized, rstd = norm_forward(tf.cast(x, tf.float32), gamma, beta, epsilon)
    return tf.cast(_apply_dropout(y, noise, rate, kind), x.dtype), normalized, rstd


@_compiled
def _norm_dropout_backward(dy, normalized, rstd, gamma, noise, *, rate, kind, dtype):
    dy = _apply_dropout(tf.cast(dy, tf.float32), noise, rate, kind)
    dx, d_gamma, d_beta = norm_backward(dy, normalized, rstd, gamma)
    return tf.cast(dx, dtype), d_gamma, d_beta


def norm_dropout(x, gamma, beta, epsilon: float, noise: Optional[Noise]) -> tf.Tensor:
    """dropout(LayerNorm(x)) over the last axis as one compiled loop; gradient another.

    Args:
        x: [..., E] in the compute dtype.
        gamma, beta: [E] float32.
        epsilon: LayerNorm epsilon.
        noise: the dropout draw for the normalized values, or None.

    Returns:
        A tensor like x.
    """
    static = dict(_static_noise(noise), epsilon=float(epsilon))
    noise_tensor = _noise_tensor(noise)
    dtype = x.dtype.name

    @tf.custom_gradient
    def run(x, gamma, beta):
        y, normalized, rstd = _norm_dropout_forward(x, gamma, beta, noise_tensor, **static)

        def grad(dy):
            return _norm_dropout_backward(dy, normalized, rstd, gamma, noise_tensor,
                                          rate=static["rate"], kind=static["kind"], dtype=dtype)

        return y, grad

    return run(x, gamma, beta)
