"""TensorFlow's elementwise kernels of the transformer block, op by op or as XLA clusters.

TensorFlow only: imported by the modeling layers only when the backend is TensorFlow and
`kernel_settings.KERNELS` is "tf" or "xla". The same functions in `keras.ops`, which JAX and
PyTorch run (and TensorFlow with KERNELS "ops"), are in ops_kernels.py.

Between its matmuls, a post-LN transformer block does only memory-bound elementwise work: bias
adds, GELU, the attention mask and softmax, dropout, residual adds and LayerNorm, and their
gradients. TensorFlow runs each of these as its own kernel (one pass over memory each), ~25 per
layer. This module computes them two ways, chosen by `kernel_settings.KERNELS` when a model is
traced:

- "tf": op by op (TensorFlow kernels), with closed-form gradients for LayerNorm and GELU. This
  is the block's original fast path (issue 5).
- "xla": each run of elementwise work between two matmuls is one `tf.function(jit_compile=True)`
  with a hand-written gradient that is itself one compiled function, so XLA fuses it into one
  or two loops while the matmuls stay outside XLA (oneDNN on CPU; cuBLAS on GPU). Five clusters:
    split_heads                   QKV bias, head split, query scale   grad: dqkv, db
    bias_gelu                     FFN: gelu(h + b)              grad: dh, db (one pass + column sum)
    attention_probs               dropout(softmax(s + mask))    grad: ds (from the output: no mask)
    bias_dropout_residual_norm    LN(dropout(h + b) + r)        grad: dh, db, dr, dgamma, dbeta
    norm_dropout                  dropout(LN(x)) (embeddings)   grad: dx, dgamma, dbeta
  All of their arithmetic is float32 whatever the compute dtype (under mixed_bfloat16 the inputs
  are upcast and the outputs rounded once, inside the fused loop, so it costs no memory traffic);
  bias, gamma and beta gradients are summed in float32.

Dropout randomness, chosen by `DROPOUT_RNG`:
- "philox": keras' own stream. The keep mask is `u >= rate` for u drawn by
  `tf.random.stateless_uniform` in the input's dtype from the Dropout layer's seed generator,
  exactly as `keras.layers.Dropout` draws it, so every mask equals keras'. (The draw stays a
  TensorFlow kernel outside XLA: XLA's CPU Philox is ~100x slower than TensorFlow's.)
- "hash": a counter-based stream. Each element's 32 keep bits are a keyed hash of its (row,
  column) counter, `fmix32(row_key + column * C)`, with the key taken from the same seed
  generator (`hash_bits`), computed in registers inside the fused loop and recomputed in the
  backward pass: no random tensor is written, read or kept for the gradient. The masks are
  seeded and reproducible (same seed generator state -> same masks, on every device: integer
  arithmetic is exact), but they are a different stream from keras': a model trained with
  "hash" sees other masks than with "philox". The keep probability is 1 - round(rate * 2^32) /
  2^32 (keras' bfloat16 draw resolves the rate to 1/128 only: 0.1 becomes 13/128).

The generator's Gumbel-max sampling noise has the same two streams, chosen by `SAMPLING_RNG` and
implemented in `electra_tf.pretraining.sampling`: "philox" (per-example stateless Philox draws,
TensorFlow kernels) or "hash" (the same keyed hash per (example, slot, vocab id), computed inside
one XLA-compiled loop with the Gumbel transform and the scores, never stored).

The dense layers' input gradient, chosen by `DENSE_GRAD` (`matmul` below; the XLA path's
QKV, attention-output and FFN products): "matmul" is TensorFlow's own MatMul gradient, dx =
matmul(dy, kernel, transpose_b=True); "einsum" computes the same product as
`einsum("ij,kj->ik", dy, kernel)`. Same arithmetic, another oneDNN kernel: on a 2-core AMD EPYC
the transposed-operand MatMul runs the FFN's [tokens, 1024] x [256, 1024]^T at ~156 GFLOP/s and
the einsum at ~210 (the forward product's speed; `benchmarks/dense_grad.py`, docs/benchmarks.md).

All four switches live in kernel_settings.py (re-exported here, so `fused.configure`,
`fused.kernel_options` and `fused.KERNELS` keep working) and are read when a model is traced. The
clusters run in training calls only (`use_xla`): evaluation and exported models use the op-by-op
kernels, so serving a SavedModel never needs the XLA JIT.

GPU and TPU: the clusters are ordinary XLA functions (on TPU everything is XLA anyway; on GPU XLA
compiles them for the device), and the hash is plain 32-bit integer arithmetic, so every
combination runs there unchanged. tests/training/test_speed_equivalence.py checks every combination
against the op-by-op path: losses, gradients and weights agree to float rounding.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import NamedTuple, Optional

import keras
import tensorflow as tf

from electra_tf.modeling import kernel_settings
from electra_tf.modeling.kernel_settings import (  # noqa: F401  (re-exported, see below)
    DEFAULT_DENSE_GRAD,
    DEFAULT_DROPOUT_RNG,
    DEFAULT_KERNELS,
    DEFAULT_SAMPLING_RNG,
    DENSE_GRAD_CHOICES,
    DROPOUT_RNG_CHOICES,
    KERNEL_CHOICES,
    SAMPLING_RNG_CHOICES,
    configure,
    kernel_options,
    use_xla,
)

# The switches (KERNELS, DROPOUT_RNG, SAMPLING_RNG, DENSE_GRAD) and their choices, defaults,
# `configure`, `kernel_options` and `use_xla` are defined once, TensorFlow-free, in
# kernel_settings.py, and re-exported here. The four switches are properties of this module's
# class, so `fused.KERNELS` reads and `fused.KERNELS = ...` (or pytest's monkeypatch.setattr,
# which restores a data descriptor by assignment) writes kernel_settings' one definition.
def _forwarded(name: str) -> property:
    return property(lambda module: getattr(kernel_settings, name),
                    lambda module, value: setattr(kernel_settings, name, value),
                    doc=f"`kernel_settings.{name}`.")


class _SettingsForwarding(types.ModuleType):
    KERNELS = _forwarded("KERNELS")
    DROPOUT_RNG = _forwarded("DROPOUT_RNG")
    SAMPLING_RNG = _forwarded("SAMPLING_RNG")
    DENSE_GRAD = _forwarded("DENSE_GRAD")


sys.modules[__name__].__class__ = _SettingsForwarding


# ------------------------------------------------------------------------------------------------
# Dropout randomness
# ------------------------------------------------------------------------------------------------
class Noise(NamedTuple):
    """What one dropout call draws: its rate, its stream and the tensor that defines the mask.

    `tensor` is u ~ U[0, 1) shaped like the input (kind "philox"), or the int32 [2] seed the
    hash is keyed with (kind "hash").
    """
    rate: float
    kind: str
    tensor: tf.Tensor


def keras_seed(seed_generator) -> tf.Tensor:
    """The seed keras' TF backend draws for one random op: next state, as int32 (`_cast_seed`)."""
    seed = seed_generator.next()
    if seed.dtype == tf.int32:
        return seed
    return tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)


def draw_noise(layer: keras.layers.Dropout, shape, dtype, training: bool) -> Optional[Noise]:
    """Advances `layer`'s seed generator once (as keras' Dropout does) and returns the draw.

    Returns None when no dropout applies (not training, or rate 0).
    """
    rate = float(layer.rate)
    if not training or rate <= 0:
        return None
    seed = keras_seed(layer.seed_generator)
    if kernel_settings.DROPOUT_RNG == "hash":
        return Noise(rate, "hash", seed)
    return Noise(rate, "philox", tf.random.stateless_uniform(shape, seed=seed, dtype=dtype))


_C_ROW = 0x9E3779B9  # odd constants of the counter -> key mixing (golden ratio, murmur3)
_C_COL = 0x85EBCA77
_C_SEED = 0x27D4EB2F


def _u32(value: int) -> tf.Tensor:
    return tf.constant(value, tf.uint32)


def fmix32(x: tf.Tensor) -> tf.Tensor:
    """murmur3's 32-bit finaliser: a bijection of uint32 whose every input bit flips about half
    of the output bits."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
    x = x * _u32(0x85EBCA6B)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(13)))
    x = x * _u32(0xC2B2AE35)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))


def hash_bits(seed: tf.Tensor, shape) -> tf.Tensor:
    """Counter-based random bits: uint32 `shape`, a keyed hash of each element's position.

    The tensor is viewed as rows x columns (columns = the last axis). Each row gets a key
    `fmix32(row * C1 + key)` ([rows, 1], cheap), and each element `fmix32(row_key + column *
    C2)`: about ten integer operations per element, which XLA fuses into the loop that uses
    them. Pure function of (seed, shape): the same on every device and in and out of XLA.

    Args:
        seed: int32 [2] (a keras seed generator state).
        shape: static or dynamic shape, rank >= 1, fewer than 2^31 rows.
    """
    shape = tf.convert_to_tensor(shape, tf.int32)
    seed = tf.bitcast(tf.cast(seed, tf.int32), tf.uint32)
    key = fmix32(fmix32(seed[0] + _u32(_C_SEED)) + seed[1] * _u32(_C_ROW))
    rows = tf.bitcast(tf.range(tf.reduce_prod(shape[:-1]), dtype=tf.int32), tf.uint32)
    cols = tf.bitcast(tf.range(shape[-1], dtype=tf.int32), tf.uint32)
    row_keys = fmix32(rows * _u32(_C_ROW) + key)[:, tf.newaxis]
    bits = fmix32(row_keys + cols[tf.newaxis, :] * _u32(_C_COL))
    return tf.reshape(bits, shape)


def keep_mask(noise: Noise, shape) -> tf.Tensor:
    """bool keep mask of `shape` for a draw (True = the element survives dropout)."""
    if noise.kind == "hash":
        threshold = min(int(round(noise.rate * 2.0 ** 32)), 2 ** 32 - 1)
        keep = hash_bits(noise.tensor, shape) >= _u32(threshold)
        return keep if noise.rate < 1 else tf.zeros_like(keep)
    u = noise.tensor
    return u >= tf.constant(noise.rate, u.dtype)


def dropout_scale(noise: Noise, shape, dtype) -> tf.Tensor:
    """The dropout multiplier of `shape`: 1 / (1 - rate) where kept, 0 where dropped."""
    scale = 0.0 if noise.rate >= 1 else 1.0 / (1.0 - noise.rate)
    return tf.where(keep_mask(noise, shape), tf.constant(scale, dtype), tf.constant(0.0, dtype))


def dropout(x: tf.Tensor, layer: keras.layers.Dropout, training: bool) -> tf.Tensor:
    """What `layer(x, training=training)` computes, as x * mask with mask in {0, 1 / (1 - rate)}.

    keras' Dropout (`tf.nn.experimental.stateless_dropout`) draws u ~ U[0, 1) in x's dtype from
    the layer's seed generator and returns where(u >= rate, x * scale, 0); with
    DROPOUT_RNG = "philox" the same draw gives the same mask here ("hash": the counter-based
    stream, see the module docstring). The multiply's gradient is one multiply by the same mask,
    where keras' backward pass runs a select and a multiply.

    Args:
        x: float tensor.
        layer: the keras Dropout layer whose rate and seed generator to use.
        training: bool. Dropout only applies when True (and rate > 0).

    Returns:
        A tensor like x.
    """
    if not training or layer.rate <= 0:
        return x
    if layer.rate >= 1:
        return tf.zeros_like(x)
    noise = draw_noise(layer, tf.shape(x), x.dtype, training)
    return x * dropout_scale(noise, tf.shape(x), x.dtype)


# ------------------------------------------------------------------------------------------------
# Op-by-op kernels with closed-form gradients ("tf")
# ------------------------------------------------------------------------------------------------
def layer_norm(x: tf.Tensor, layer: keras.layers.LayerNormalization, dtype) -> tf.Tensor:
    """`layer(x)` over the last axis (float32 math, result in `dtype`), with a fused gradient.

    Forward: y = (x - mean) * rsqrt(var + epsilon) * gamma + beta, as keras'
    `ops.layer_normalization` (which computes in at least float32). The gradient is the closed
    form dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma,
    instead of differentiating the moments graph op by op.

    Args:
        x: float tensor [..., H].
        layer: the keras LayerNormalization (last-axis, center and scale) owning gamma and beta.
        dtype: the compute dtype of the result.
    """
    return tf.cast(_layer_norm(tf.cast(x, tf.float32), tf.cast(layer.gamma, tf.float32),
                               tf.cast(layer.beta, tf.float32), layer.epsilon), dtype)


def _norm_forward(x, gamma, beta, epsilon):
    """float32 LayerNorm over the last axis: (y, normalized, rstd)."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True) + epsilon)
    normalized = centered * rstd
    return normalized * gamma + beta, normalized, rstd


def _norm_backward(dy, normalized, rstd, gamma):
    """Gradients of `_norm_forward` (float32): dx, dgamma, dbeta.

    dx = rstd * (dy * gamma - mean(dy * gamma) - normalized * mean(dy * gamma * normalized)),
    means over the last axis. The two row means are computed as matrix-vector products with
    gamma / width, which read dy and dy * normalized where they are: XLA's CPU backend writes a
    reduction's operand to memory, so reducing dy * gamma and dy * gamma * normalized would
    write two more tensors of dy's size (measured: the bias + dropout + residual + LayerNorm
    gradient ~1.5x faster for ELECTRA-small's discriminator). dy * normalized is written once,
    for dgamma and the second mean.
    """
    width = tf.shape(dy)[-1]
    dy_rows = tf.reshape(dy, [-1, width])
    dy_normalized = tf.reshape(dy * normalized, [-1, width])
    d_gamma = tf.reduce_sum(dy_normalized, axis=0)
    d_beta = tf.reduce_sum(dy_rows, axis=0)
    gamma_mean = gamma[:, tf.newaxis] / tf.cast(width, gamma.dtype)  # [width, 1]
    mean = tf.reshape(tf.matmul(dy_rows, gamma_mean), tf.shape(rstd))
    mean_normalized = tf.reshape(tf.matmul(dy_normalized, gamma_mean), tf.shape(rstd))
    dx = rstd * (dy * gamma - mean - normalized * mean_normalized)
    return dx, d_gamma, d_beta


@tf.custom_gradient
def _layer_norm(x, gamma, beta, epsilon):
    y, normalized, rstd = _norm_forward(x, gamma, beta, epsilon)

    def grad(dy):
        return _norm_backward(dy, normalized, rstd, gamma) + (None,)

    return y, grad


# Exact GELU constants: Phi(x) = 0.5 * erfc(-x / sqrt(2)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def _gelu_and_slope(x, use_erf=False):
    """float32 exact GELU x * Phi(x), and its derivative Phi(x) + x * phi(x) (as a function).

    Phi from erfc (op by op: TensorFlow's erfc kernel keeps relative precision for very negative
    x) or from erf (in XLA clusters: XLA's erf is a rational polynomial without the exp that its
    erfc needs, ~40% cheaper; it is the form of tf.nn.gelu and keras, and equal to float
    rounding wherever GELU is not ~0)."""
    if use_erf:
        cdf = 0.5 + 0.5 * tf.math.erf(x * _SQRT_HALF)
    else:
        cdf = 0.5 * tf.math.erfc(x * -_SQRT_HALF)
    return x * cdf, lambda: cdf + x * (tf.exp(-0.5 * tf.square(x)) * _INV_SQRT_2PI)


@tf.custom_gradient
def gelu(x):
    """Exact (erf) GELU, x * Phi(x), computed in float32 whatever x's dtype; result in x's dtype.

    keras' gelu under mixed_bfloat16 runs every elementwise op of the erf form and of its
    gradient as a bfloat16 Eigen kernel, which is not vectorised on CPU (measured: the FFN
    activation was a quarter of a bfloat16 ELECTRA-small step). Here the forward pass is one
    float32 erfc and two multiplies, and the backward pass recomputes Phi from the saved input
    (no extra float32 [tokens, FFN] tensor is kept): dx = dy * (Phi(x) + x * phi(x)).
    """
    y, _ = _gelu_and_slope(tf.cast(x, tf.float32))

    def grad(dy):
        _, slope = _gelu_and_slope(tf.cast(x, tf.float32))
        return tf.cast(tf.cast(dy, tf.float32) * slope(), x.dtype)

    return tf.cast(y, x.dtype), grad


# ------------------------------------------------------------------------------------------------
# XLA clusters ("xla")
# ------------------------------------------------------------------------------------------------
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
    y, _ = _gelu_and_slope(tf.cast(h, tf.float32) + bias, use_erf=True)
    return tf.cast(y, h.dtype)


@_compiled
def _bias_gelu_backward(dy, h, bias):
    _, slope = _gelu_and_slope(tf.cast(h, tf.float32) + bias, use_erf=True)
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
    y, normalized, rstd = _norm_forward(x + tf.cast(residual, tf.float32), gamma, beta, epsilon)
    return tf.cast(y, h.dtype), normalized, rstd


@_compiled
def _bdrn_backward(dy, normalized, rstd, gamma, noise, *, rate, kind, dtype):
    dx, d_gamma, d_beta = _norm_backward(tf.cast(dy, tf.float32), normalized, rstd, gamma)
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
    y, normalized, rstd = _norm_forward(tf.cast(x, tf.float32), gamma, beta, epsilon)
    return tf.cast(_apply_dropout(y, noise, rate, kind), x.dtype), normalized, rstd


@_compiled
def _norm_dropout_backward(dy, normalized, rstd, gamma, noise, *, rate, kind, dtype):
    dy = _apply_dropout(tf.cast(dy, tf.float32), noise, rate, kind)
    dx, d_gamma, d_beta = _norm_backward(dy, normalized, rstd, gamma)
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


# ------------------------------------------------------------------------------------------------
# Dense layers' matmul
# ------------------------------------------------------------------------------------------------
@tf.custom_gradient
def _matmul_einsum_input_grad(x, kernel):
    def grad(dy):
        # dy @ kernel^T as an einsum: TensorFlow's MatMul gradient passes transpose_b=True, whose
        # oneDNN kernel is slower for these shapes (module docstring). The kernel gradient keeps
        # TensorFlow's form, x^T @ dy, which runs at the forward product's speed.
        return (tf.einsum("ij,kj->ik", dy, kernel),
                tf.matmul(x, dy, transpose_a=True))

    return tf.matmul(x, kernel), grad


def matmul(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
    """A dense layer's product without bias: `x @ kernel`, with the input gradient of `DENSE_GRAD`.

    Args:
        x: float [rows, in].
        kernel: float [in, out], same dtype.

    Returns:
        float [rows, out]. The value and both gradients are the same products whatever
        `DENSE_GRAD` (float rounding may differ with the kernel oneDNN picks).
    """
    if kernel_settings.DENSE_GRAD == "einsum" and (x.dtype == tf.float32 or _onednn_bf16()):
        return _matmul_einsum_input_grad(x, kernel)
    return tf.matmul(x, kernel)


@functools.lru_cache(maxsize=None)
def _onednn_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (oneDNN's bf16 einsum). Without it (AVX2
    only) TensorFlow's bf16 Einsum is Eigen's, which accumulates in lower precision than its
    MatMul (measured on a Zen 3 EPYC: 1.6% against 1.0% max error on [24, 40] x [40, 16]), so
    the einsum form is used for float32 only there (bf16 is emulated and slow on such CPUs
    anyway: mixed_precision "auto" picks float32)."""
    from electra_tf import precision

    name, flags = precision.read_cpu()
    return precision.native_bf16(precision.DeviceFacts("cpu", name, flags))[0]
