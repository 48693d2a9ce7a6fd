"""Per-example keys: derivation, batch-split invariance, replica offsets, the eval stream."""

import numpy as np
import tensorflow as tf

from electra_tf.modeling import rng
from electra_tf.pretraining import seeds as seeds_lib


def test_example_keys_are_the_rng_chain_of_seed_step_salt_and_index():
    seed = tf.constant([12, 34], tf.int32)
    got = seeds_lib.example_keys(seed, 3, 4, salt=seeds_lib.MASKING_SALT).numpy()
    expected = rng.example_keys(rng.stream_key(12, 34, rng.MASKING_SALT), 3, 4).numpy()
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (4,) and got.dtype == np.int32


def test_example_keys_depend_on_global_index_not_on_the_split():
    seed = tf.constant([5, 6], tf.int32)
    whole = seeds_lib.example_keys(seed, 0, 8, salt=1).numpy()
    first = seeds_lib.example_keys(seed, 0, 4, salt=1).numpy()
    second = seeds_lib.example_keys(seed, tf.constant(4), tf.constant(4), salt=1).numpy()
    np.testing.assert_array_equal(np.concatenate([first, second]), whole)
    assert len(set(whole.tolist())) == 8


def test_salts_and_seeds_separate_streams():
    seed = tf.constant([5, 6])
    a = seeds_lib.example_keys(seed, 0, 4, salt=seeds_lib.MASKING_SALT).numpy()
    b = seeds_lib.example_keys(seed, 0, 4, salt=seeds_lib.SAMPLING_SALT).numpy()
    c = seeds_lib.example_keys(tf.constant([5, 7]), 0, 4, salt=seeds_lib.MASKING_SALT).numpy()
    d = seeds_lib.example_keys(tf.constant([6, 6]), 0, 4, salt=seeds_lib.MASKING_SALT).numpy()
    assert not (a == b).any() and not (a == c).any() and not (a == d).any()


def test_example_keys_in_graph_mode_match_eager():
    seed = tf.constant([1, 2])
    fn = tf.function(lambda s, f, n: seeds_lib.example_keys(s, f, n, salt=2))
    np.testing.assert_array_equal(
        fn(seed, tf.constant(2), tf.constant(3)).numpy(), seeds_lib.example_keys(seed, 2, 3, 2).numpy())


def test_eval_stream_counts_down_from_the_top_of_int32():
    np.testing.assert_array_equal(seeds_lib.eval_seed(7, 0).numpy(), [7, 2 ** 31 - 1])
    np.testing.assert_array_equal(seeds_lib.eval_seed(2 ** 32 - 1, 5).numpy(), [-1, 2 ** 31 - 6])


def test_replica_example_offset_outside_and_inside_mirrored_strategy(mirrored_strategy):
    assert int(seeds_lib.replica_example_offset(4)) == 0
    strategy = mirrored_strategy  # shared: see tests/conftest.py

    @tf.function
    def step():
        return strategy.run(lambda: seeds_lib.replica_example_offset(tf.constant(4)))

    per_replica = strategy.experimental_local_results(step())
    assert sorted(int(x) for x in per_replica) == [0, 4]
