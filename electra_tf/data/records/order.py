"""The pretraining data order, defined here once so TensorFlow and numpy compute the same order.

`pipeline.make_dataset` (tf.data) and `record_reader.BatchReader` (no TensorFlow: the JAX and
PyTorch trainers) read the same shards in the same order for the same seed. tf.data's `shuffle`
order is an implementation detail of TensorFlow that no other reader can reproduce, so the two
shuffles of the pipeline are permutations defined by a keyed hash instead:

- *file order*: epoch e reads the pipeline's files (after sharding) in the order of
  `file_order(seed, e, n)`: the argsort of `hash32(seed, e, i)` over file indices i (ties,
  about 1 in 2^32 per pair, by index);
- *record order*: the interleaved record stream is cut into consecutive windows of
  `RECORD_SHUFFLE_WINDOW` records (the last one shorter where the stream ends), and window w
  is emitted in the order `record_order(seed, w, m)`: the argsort of `hash32(seed + 1, w, p)`
  over its positions p.

Both are pure functions of (seed, epoch or window, index), so a position in the stream is a few
integers and resume needs no saved random state. The rest of the order is structural and shared
too: `pipeline_files` (which files a pipeline reads, and whether records are sharded instead),
`interleave_cycle` (how many files are read at once, one record from each in turn).

`hash32` is MurmurHash3 (x86, 32-bit) of the 8-byte message (a, b) as two little-endian 32-bit
words, keyed by the seed: every input bit flips about half the output bits. The numpy and the
TensorFlow implementations use the same uint32 operations (wrapping multiply, xor, shifts) and
agree bit for bit (tests/data/test_record_reader.py). TensorFlow is imported only inside the
`*_tf` functions: the numpy half must stay importable without it.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

# Official: cycle_length = min(4, number of files).
MAX_INTERLEAVE_CYCLE = 4
# Records per window of the record shuffle. The official pipeline shuffles through a
# 100-record buffer; a window of 1,000 breaks up the interleave's round-robin pattern better
# at a negligible memory cost (records are ~1-4 KB).
RECORD_SHUFFLE_WINDOW = 1000

_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_INDEX_BITS = 31  # sort keys: hash * 2^31 + index, unique while there are < 2^31 items


def _seed_u32(seed: int) -> int:
    return int(seed) & _M32


# ------------------------------------------------------------------------------------------------
# numpy
# ------------------------------------------------------------------------------------------------
def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _round(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    k = _rotl(k * np.uint32(_C1), 15) * np.uint32(_C2)
    h = _rotl(h ^ k, 13)
    return h * np.uint32(5) + np.uint32(0xE6546B64)


def _as_u32(x) -> np.ndarray:
    """Integers modulo 2^32 as uint32 (negative ones too, as their two's complement)."""
    return (np.asarray(x, dtype=np.int64) & _M32).astype(np.uint32)


def hash32(seed: int, a, b) -> np.ndarray:
    """MurmurHash3_x86_32 of the words (a mod 2^32, b mod 2^32) keyed by `seed mod 2^32`.

    Args:
        seed: int. Any Python int.
        a, b: ints or int arrays (broadcast together), taken modulo 2^32.

    Returns:
        uint32 array of the broadcast shape.
    """
    a, b = np.broadcast_arrays(_as_u32(a), _as_u32(b))
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps on purpose
        h = np.full(a.shape, _seed_u32(seed), np.uint32)
        h = _round(h, a)
        h = _round(h, b)
        return _fmix(h ^ np.uint32(8))  # 8: the message length in bytes


def permutation(seed: int, key: int, n: int) -> np.ndarray:
    """int64 [n]: the argsort of `hash32(seed, key, i)` over i in [0, n), ties by index."""
    return np.argsort(hash32(seed, key, np.arange(n, dtype=np.int64)), kind="stable")


def file_order(seed: int, epoch: int, num_files: int) -> np.ndarray:
    """int64 [num_files]: the order in which epoch `epoch` reads a pipeline's files."""
    return permutation(seed, epoch, num_files)


def record_order(seed: int, window: int, size: int) -> np.ndarray:
    """int64 [size]: the order in which record window `window` (of `size` records) is emitted."""
    return permutation(seed + 1, window, size)


# ------------------------------------------------------------------------------------------------
# TensorFlow (same operations on tf.uint32)
# ------------------------------------------------------------------------------------------------
def _tf_u32(x):
    import tensorflow as tf  # lazy: see module docstring

    x = tf.convert_to_tensor(x)
    if x.dtype == tf.uint32:
        return x
    return tf.cast(tf.bitwise.bitwise_and(tf.cast(x, tf.int64), tf.constant(_M32, tf.int64)),
                   tf.uint32)


def hash32_tf(seed: int, a, b):
    """`hash32` in TensorFlow ops: a uint32 tensor, bit-identical to the numpy result.

    Args:
        seed: int. Any Python int (a constant of the graph).
        a, b: int tensors or ints (broadcast together), taken modulo 2^32.
    """
    import tensorflow as tf  # lazy: see module docstring

    def u32(value):
        return tf.constant(value, tf.uint32)

    def rotl(x, r):
        return tf.bitwise.bitwise_or(tf.bitwise.left_shift(x, u32(r)),
                                     tf.bitwise.right_shift(x, u32(32 - r)))

    def one_round(h, k):
        k = rotl(k * u32(_C1), 15) * u32(_C2)
        h = rotl(tf.bitwise.bitwise_xor(h, k), 13)
        return h * u32(5) + u32(0xE6546B64)

    def shift_xor(h, r):
        return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, u32(r)))

    a, b = _tf_u32(a), _tf_u32(b)
    h = one_round(u32(_seed_u32(seed)) + tf.zeros_like(a), a)
    h = one_round(h, b)
    h = tf.bitwise.bitwise_xor(h, u32(8))
    h = shift_xor(h, 16) * u32(0x85EBCA6B)
    h = shift_xor(h, 13) * u32(0xC2B2AE35)
    return shift_xor(h, 16)


def permutation_tf(seed: int, key, n):
    """`permutation` in TensorFlow ops: int64 [n] (n a scalar int tensor or int)."""
    import tensorflow as tf  # lazy: see module docstring

    index = tf.range(tf.cast(n, tf.int64), dtype=tf.int64)
    hashes = tf.cast(hash32_tf(seed, key, index), tf.int64)
    # Unique int64 keys (hash * 2^31 + index < 2^63): the order is the stable argsort's.
    return tf.cast(tf.argsort(hashes * (1 << _INDEX_BITS) + index), tf.int64)


def file_order_tf(seed: int, epoch, num_files):
    """`file_order` in TensorFlow ops (epoch a scalar int tensor)."""
    return permutation_tf(seed, epoch, num_files)


def record_order_tf(seed: int, window, size):
    """`record_order` in TensorFlow ops (window, size scalar int tensors)."""
    return permutation_tf(seed + 1, window, size)


# ------------------------------------------------------------------------------------------------
# Structure shared by both readers
# ------------------------------------------------------------------------------------------------
def pipeline_files(files: Sequence[str], num_pipelines: int = 1,
                   pipeline_id: int = 0) -> Tuple[List[str], bool]:
    """The files one input pipeline reads, and whether it shards records instead of files.

    Files are sharded per pipeline (file i to pipeline i mod n) when there are at least as many
    files as pipelines; otherwise every pipeline reads every file and keeps record k of the
    interleaved stream when k mod n is its id.

    Returns:
        (the pipeline's files in list order, shard_records).
    """
    if not 0 <= pipeline_id < num_pipelines:
        raise ValueError(f"input_pipeline_id {pipeline_id} is not in [0, {num_pipelines})")
    shard_records = num_pipelines > 1 and len(files) < num_pipelines
    if num_pipelines > 1 and not shard_records:
        return list(files[pipeline_id::num_pipelines]), False
    return list(files), shard_records


def interleave_cycle(num_files: int) -> int:
    """Files read at once (official: min(4, number of files) of the whole list, before
    sharding: a pipeline with fewer files then also reads the next epoch's first files)."""
    return min(MAX_INTERLEAVE_CYCLE, num_files)
