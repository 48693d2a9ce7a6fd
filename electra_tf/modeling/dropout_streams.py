"""TensorFlow's dropout randomness for the fused kernels: one draw per Dropout call, two streams.

TensorFlow only (imported with fused.py and xla_clusters.py, never by JAX or PyTorch runs; their
dropout bits are `rng.dropout_bits`). The stream is chosen by `kernel_settings.DROPOUT_RNG`:

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
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import keras
import tensorflow as tf

from electra_tf.modeling import kernel_settings


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
