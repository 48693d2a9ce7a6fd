"""Counter-based random bits in integer `keras.ops`: the same draws on TensorFlow, JAX and PyTorch.

Every random draw of the objective (masking positions and [MASK] choices, the generator's Gumbel
noise) is a keyed hash of where it is used: (run seed, step, stream, global example index,
position). Nothing is drawn from a framework's RNG, so:

- the same seed gives bit-identical masks and samples on every backend and device (integer
  arithmetic is exact);
- an example's draws depend on its index in the GLOBAL batch, not on its batch neighbours or
  on how the batch is split across replicas or devices;
- a resumed run draws what the uninterrupted run drew at the same step (the step is a counter,
  not a state).

The hash is murmur3's 32-bit finaliser (`fmix32`), a bijection of 32-bit words whose every input
bit flips about half of the output bits, applied in a chain: a stream key from (seed, step,
salt), an example key from (stream key, example index), then one word per element from
(example key, element counter). Keys and words are int32 tensors holding uint32 bit patterns:
JAX has no 64-bit integers by default and PyTorch few unsigned ops, but every backend wraps
int32 multiplication modulo 2^32 and has arithmetic right shifts, from which `_shift_right`
builds the logical shift.

Uniforms take the top 24 bits: u = (k + 0.5) / 2^24, k in [0, 2^24), exact in float32, never 0
or 1.
"""

from __future__ import annotations

from typing import Sequence, Union

import keras
from keras import ops

# Salts naming the independent streams of one step. New stochastic components take a new one.
MASKING_SALT = 1
SAMPLING_SALT = 2

# Odd 32-bit constants (murmur3's and the golden ratio's) keying the chain's links.
_C_SEED = 0x27D4EB2F
_C_STEP = 0x165667B1
_C_SALT = 0x9E3779B1
_C_EXAMPLE = 0x85EBCA77
_C_ELEMENT = 0xC2B2AE3D
_C_ROW = 0x7FEB352D
_C_SUB = 0x68E31DA4

IntLike = Union[int, "keras.KerasTensor"]


def int32_bits(value: int) -> int:
    """The int32 with the bit pattern of the uint32 `value mod 2^32`."""
    value %= 2 ** 32
    return value - 2 ** 32 if value >= 2 ** 31 else value


def _i32(value: int):
    return ops.convert_to_tensor(int32_bits(value), "int32")


def _shift_right(x, bits: int):
    """Logical right shift of int32 bit patterns (the backends' `>>` on int32 is arithmetic)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def fmix32(x):
    """murmur3's finaliser on int32 tensors holding uint32 bit patterns (wrapping arithmetic)."""
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, _i32(0x85EBCA6B))
    x = ops.bitwise_xor(x, _shift_right(x, 13))
    x = ops.multiply(x, _i32(0xC2B2AE35))
    return ops.bitwise_xor(x, _shift_right(x, 16))


def _link(key, value, constant: int):
    """One link of the chain: fmix32(key XOR value * constant)."""
    return fmix32(ops.bitwise_xor(key, ops.multiply(value, _i32(constant))))


def stream_key(seed: IntLike, step: IntLike, salt: int):
    """The int32 key of one random stream at one step.

    Args:
        seed: int or int tensor. The run seed (any value; taken modulo 2^32).
        step: int or scalar int tensor. The training step (< 2^31).
        salt: int. Names the stream (`MASKING_SALT`, `SAMPLING_SALT`).

    Returns:
        int32 scalar tensor.
    """
    seed = (_i32(seed) if isinstance(seed, int) else ops.cast(seed, "int32"))
    step = ops.cast(step, "int32")
    key = fmix32(ops.add(seed, _i32(_C_SEED)))
    key = _link(key, step, _C_STEP)
    return _link(key, _i32(salt), _C_SALT)


def example_keys(key, first_example: IntLike, batch_size: int):
    """int32 [batch_size]: the keys of global examples first_example .. first_example + B - 1.

    Args:
        key: int32 scalar, a `stream_key`.
        first_example: int or scalar int tensor. Global index of the first local example.
        batch_size: int B (static).
    """
    index = ops.add(ops.arange(batch_size, dtype="int32"), ops.cast(first_example, "int32"))
    return _link(key, index, _C_EXAMPLE)


def subkeys(keys, index: int):
    """int32 keys of an independent sub-stream `index` of each example (one draw of several)."""
    return _link(keys, _i32(index), _C_SUB)


def element_bits(keys, shape: Sequence[int]):
    """int32 [B, *shape]: one hashed word per element of each example.

    Element (b, i_1, ..., i_k) gets fmix32 links of its coordinates, outermost first: a row key
    per leading index, then the last axis, so a [B, N, V] draw costs one link per element
    (plus one per row) and never builds a counter tensor of the full size.

    Args:
        keys: int32 [B], from `example_keys`.
        shape: the per-example shape (static ints), rank >= 1.
    """
    row_keys = keys
    for size in shape[:-1]:
        index = ops.arange(size, dtype="int32")
        row_keys = _link(ops.expand_dims(row_keys, -1), index, _C_ROW)
    last = ops.arange(shape[-1], dtype="int32")
    return _link(ops.expand_dims(row_keys, -1), last, _C_ELEMENT)


def uniform(bits):
    """float32 in (0, 1) from int32 words: (top 24 bits + 0.5) / 2^24."""
    top = ops.cast(_shift_right(bits, 8), "float32")
    return ops.multiply(ops.add(top, 0.5), 2.0 ** -24)


def unsigned(bits):
    """The words as non-negative int32 keys in [0, 2^31) (the top 31 bits), for ordering."""
    return _shift_right(bits, 1)


# --- Dropout: the stream of the encoder's dropout masks ---------------------------------------
# Keyed by a keras seed generator's state, as TensorFlow's fused kernels
# (`dropout_streams.hash_bits`) compute it, so that every backend drops the same elements.
_C_DROP_SEED = 0x27D4EB2F
_C_DROP_ROW = 0x9E3779B9
_C_DROP_COL = 0x85EBCA77
_SIGN = -2 ** 31


def keras_seed(seed_generator):
    """int32 [2]: the next seed of a keras `SeedGenerator` (advancing it once, as a keras random
    op does), reduced as keras' TensorFlow backend reduces it (`floormod(seed, 2^31 - 2)`), so
    the value is the same whatever dtype the backend keeps the state in."""
    seed = seed_generator.next()
    if keras.backend.standardize_dtype(seed.dtype) == "int32":
        return seed
    return ops.cast(ops.mod(seed, 2 ** 31 - 2), "int32")


def dropout_bits(seed, shape):
    """int32 words of `shape` (rank >= 1): a keyed hash of each element's (row, column).

    The tensor is viewed as rows x columns (columns: the last axis): row key fmix32(row * C1 +
    key), element fmix32(row key + column * C2), key = fmix32(fmix32(seed[0] + C0) + seed[1] *
    C1). The same words as `dropout_streams.hash_bits` computes inside TensorFlow's XLA clusters.

    Args:
        seed: int32 [2], e.g. `keras_seed(layer.seed_generator)`.
        shape: the shape, `ops.shape(x)`: ints, or on TensorFlow scalar int32 tensors for the
            dimensions unknown when tracing.
    """
    seed = ops.cast(seed, "int32")
    key = fmix32(ops.add(fmix32(ops.add(seed[0], _i32(_C_DROP_SEED))),
                         ops.multiply(seed[1], _i32(_C_DROP_ROW))))
    rows = 1
    for size in shape[:-1]:
        rows = rows * size
    row_keys = fmix32(ops.add(ops.multiply(ops.arange(rows, dtype="int32"), _i32(_C_DROP_ROW)),
                              key))
    columns = ops.multiply(ops.arange(shape[-1], dtype="int32"), _i32(_C_DROP_COL))
    bits = fmix32(ops.add(ops.expand_dims(row_keys, -1), ops.expand_dims(columns, 0)))
    return ops.reshape(bits, tuple(shape))


def keep_mask(bits, rate: float):
    """bool: True where an element survives dropout at `rate`: its word, read as uint32, is at
    least round(rate * 2^32) (so P(keep) = 1 - that / 2^32); nothing survives rate >= 1."""
    if rate >= 1:
        return ops.zeros_like(bits, dtype="bool")
    threshold = min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)
    # Unsigned order of 32-bit words = signed order with the sign bit flipped.
    return ops.greater_equal(ops.bitwise_xor(bits, _SIGN), int32_bits(threshold) ^ _SIGN)
