"""TensorFlow's op-by-op kernels of the transformer block (KERNELS "tf", and "xla" outside
training), and the dense layers' matmul.

TensorFlow only: imported by the modeling layers only when the backend is TensorFlow and
`kernel_settings.KERNELS` is "tf" or "xla". The same functions in `keras.ops`, which JAX and
PyTorch run (and TensorFlow with KERNELS "ops"), are in ops_kernels.py.

Between its matmuls, a post-LN transformer block does only memory-bound elementwise work: bias
adds, GELU, the attention mask and softmax, dropout, residual adds and LayerNorm, and their
gradients. TensorFlow runs each of these as its own kernel (one pass over memory each), ~25 per
layer. TensorFlow's kernels compute them two ways, chosen by `kernel_settings.KERNELS` when a
model is traced:

- "tf": op by op (TensorFlow kernels), with closed-form gradients for LayerNorm and GELU (here).
  This is the block's original fast path (issue 5).
- "xla": each run of elementwise work between two matmuls is one XLA cluster with a hand-written
  gradient (xla_clusters.py), built on this module's float32 LayerNorm and GELU math.

Dropout's randomness (`DROPOUT_RNG`: keras' Philox draw or a counter-based hash) is
dropout_streams.py's.

The dense layers' input gradient, chosen by `DENSE_GRAD` (`matmul` below; the XLA path's
QKV, attention-output and FFN products): "matmul" is TensorFlow's own MatMul gradient, dx =
matmul(dy, kernel, transpose_b=True); "einsum" computes the same product as
`einsum("ij,kj->ik", dy, kernel)`. Same arithmetic, another oneDNN kernel: on a 2-core AMD EPYC
the transposed-operand MatMul runs the FFN's [tokens, 1024] x [256, 1024]^T at ~156 GFLOP/s and
the einsum at ~210 (the forward product's speed; `benchmarks/dense_grad.py`, docs/benchmarks.md).

All four switches live in kernel_settings.py, TensorFlow-free (`kernel_settings.configure`,
`kernel_options`, `KERNELS`, ...), and are read when a model is traced.

GPU and TPU: the hash is plain 32-bit integer arithmetic and the clusters ordinary XLA
functions, so every combination runs there unchanged. tests/training/test_speed_equivalence.py
checks every combination against the op-by-op path: losses, gradients and weights agree to float
rounding.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

from electra_tf import precision
from electra_tf.modeling import kernel_settings


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


def norm_forward(x, gamma, beta, epsilon):
    """float32 LayerNorm over the last axis: (y, normalized, rstd)."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True) + epsilon)
    normalized = centered * rstd
    return normalized * gamma + beta, normalized, rstd


def norm_backward(dy, normalized, rstd, gamma):
    """Gradients of `norm_forward` (float32): dx, dgamma, dbeta.

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
    y, normalized, rstd = norm_forward(x, gamma, beta, epsilon)

    def grad(dy):
        return norm_backward(dy, normalized, rstd, gamma) + (None,)

    return y, grad


# Exact GELU constants: Phi(x) = 0.5 * erfc(-x / sqrt(2)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def gelu_and_slope(x, use_erf=False):
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
    y, _ = gelu_and_slope(tf.cast(x, tf.float32))

    def grad(dy):
        _, slope = gelu_and_slope(tf.cast(x, tf.float32))
        return tf.cast(tf.cast(dy, tf.float32) * slope(), x.dtype)

    return tf.cast(y, x.dtype), grad


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
    name, flags = precision.read_cpu()
    return precision.native_bf16(precision.DeviceFacts("cpu", name, flags))[0]
