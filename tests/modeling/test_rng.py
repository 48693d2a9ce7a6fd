"""electra_tf.modeling.rng: counter-based random words in integer keras.ops, bit-identical on
TensorFlow, JAX and PyTorch."""

import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from electra_tf.modeling import dropout_streams
from electra_tf.modeling import rng
from tests import backends

WORDS = np.array([0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x12345678, 0xDEADBEEF],
                 dtype=np.uint64)


def _as_uint32(x):
    return np.asarray(x).astype(np.int64) % 2 ** 32


def test_fmix32_on_int32_equals_the_uint32_finaliser():
    words = np.concatenate([WORDS, np.random.default_rng(0).integers(0, 2 ** 32, 1000)])
    expected = dropout_streams.fmix32(tf.constant(words.astype(np.uint32))).numpy()
    got = ops.convert_to_numpy(rng.fmix32(ops.convert_to_tensor(
        np.array([rng.int32_bits(int(w)) for w in words], np.int32))))
    np.testing.assert_array_equal(_as_uint32(got), expected.astype(np.int64))


def test_int32_bits():
    assert rng.int32_bits(0) == 0 and rng.int32_bits(2 ** 31 - 1) == 2 ** 31 - 1
    assert rng.int32_bits(2 ** 31) == -2 ** 31 and rng.int32_bits(2 ** 32 - 1) == -1
    assert rng.int32_bits(2 ** 32 + 5) == 5 and rng.int32_bits(-1) == -1


def _draws(seed, step, salt, first, batch, shape):
    keys = rng.example_keys(rng.stream_key(seed, step, salt), first, batch)
    bits = rng.element_bits(keys, shape)
    return keys, bits, rng.uniform(bits)


def test_streams_depend_on_every_coordinate():
    base = ops.convert_to_numpy(_draws(7, 3, 1, 0, 4, [5, 6])[1])
    assert base.shape == (4, 5, 6) and base.dtype == np.int32
    assert len(np.unique(base)) == base.size  # no repeats among 120 words
    for args in ((8, 3, 1, 0), (7, 4, 1, 0), (7, 3, 2, 0)):
        other = ops.convert_to_numpy(_draws(*args, 4, [5, 6])[1])
        assert np.mean(other == base) < 0.01, args


def test_an_example_draws_the_same_whatever_its_batch():
    """Example 5 of the global batch: alone, or in a batch of 8 at offset 0 (replica split)."""
    whole = ops.convert_to_numpy(_draws(1, 2, 1, 0, 8, [3, 4])[1])
    alone = ops.convert_to_numpy(_draws(1, 2, 1, 5, 1, [3, 4])[1])
    np.testing.assert_array_equal(whole[5], alone[0])


def test_uniforms_are_uniform_and_strictly_inside():
    u = ops.convert_to_numpy(_draws(0, 0, 2, 0, 16, [64, 256])[2])
    assert u.dtype == np.float32 and u.min() > 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.std() - (1 / 12) ** 0.5) < 0.005
    # the top 24 bits: multiples of 2^-24 offset by half a step
    np.testing.assert_array_equal((u * 2 ** 24 - 0.5) % 1, 0)
    keys = ops.convert_to_numpy(rng.unsigned(_draws(0, 0, 2, 0, 16, [64])[1]))
    assert keys.min() >= 0


def test_large_seeds_and_steps_wrap_as_uint32():
    a = ops.convert_to_numpy(_draws(2 ** 32 - 1, 2 ** 31 - 1, 1, 0, 2, [3])[1])
    b = ops.convert_to_numpy(_draws(-1, 2 ** 31 - 1, 1, 0, 2, [3])[1])
    np.testing.assert_array_equal(a, b)


_CHILD = """
from electra_tf.modeling import rng
from keras import ops
keys = rng.example_keys(rng.stream_key(12345, int(inp["step"]), rng.SAMPLING_SALT), 3, 4)
bits = rng.element_bits(keys, [5, 7])
out["keys"] = ops.convert_to_numpy(keys)
out["bits"] = ops.convert_to_numpy(bits)
out["uniform"] = ops.convert_to_numpy(rng.uniform(bits))
out["unsigned"] = ops.convert_to_numpy(rng.unsigned(bits))
step = ops.convert_to_tensor(np.int32(inp["step"]))
out["traced_step"] = ops.convert_to_numpy(rng.stream_key(12345, step, rng.SAMPLING_SALT))
drop = rng.dropout_bits(ops.convert_to_tensor(np.array([99, 5], np.int32)), (6, 9))
out["dropout_bits"] = ops.convert_to_numpy(drop)
out["keep"] = ops.convert_to_numpy(rng.keep_mask(drop, 0.1))
import keras
generator = keras.random.SeedGenerator(1234)
out["keras_seed"] = np.stack([ops.convert_to_numpy(rng.keras_seed(generator)) for _ in range(3)])
"""


@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_same_bits_on_every_backend(backend):
    backends.require(backend)
    theirs = backends.run_on_backend(backend, _CHILD, {"step": np.array(99)})
    ours = backends.run_on_backend("tensorflow", _CHILD, {"step": np.array(99)})
    keys = rng.example_keys(rng.stream_key(12345, 99, rng.SAMPLING_SALT), 3, 4)
    np.testing.assert_array_equal(ours["keys"], ops.convert_to_numpy(keys))
    for name in ("keys", "bits", "uniform", "unsigned", "traced_step", "dropout_bits", "keep",
                 "keras_seed"):
        np.testing.assert_array_equal(theirs[name], ours[name], err_msg=name)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4, 6)])
def test_dropout_bits_equal_the_fused_kernels_words(shape):
    seed = tf.constant([123456, 7], tf.int32)
    expected = dropout_streams.hash_bits(seed, shape).numpy().astype(np.int64)
    got = ops.convert_to_numpy(rng.dropout_bits(ops.convert_to_tensor(seed.numpy()), shape))
    np.testing.assert_array_equal(_as_uint32(got), expected)


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5, 0.999, 1.0])
def test_keep_mask_equals_the_fused_kernels_mask(rate):
    seed = tf.constant([42, 3], tf.int32)
    shape = (64, 96)
    noise = dropout_streams.Noise(rate, "hash", seed)
    expected = dropout_streams.keep_mask(noise, shape).numpy()
    got = ops.convert_to_numpy(rng.keep_mask(rng.dropout_bits(seed.numpy(), shape), rate))
    np.testing.assert_array_equal(got, expected)
    if 0 < rate < 1:
        assert abs(got.mean() - (1 - rate)) < 0.02
