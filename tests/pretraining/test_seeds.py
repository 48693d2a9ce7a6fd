"""Per-example seeds: derivation, batch-split invariance and replica offsets."""

import numpy as np
import tensorflow as tf

from electra_tf.pretraining import seeds as seeds_lib


def test_example_seeds_equal_nested_fold_in():
    seed = tf.constant([12, 34], tf.int64)
    got = seeds_lib.example_seeds(seed, 3, 4, salt=seeds_lib.MASKING_SALT).numpy()
    stream = tf.random.experimental.stateless_fold_in(
        seed, tf.constant(seeds_lib.MASKING_SALT, tf.int64), alg=seeds_lib.RNG_ALG)
    for i in range(4):
        expected = tf.random.experimental.stateless_fold_in(
            stream, tf.constant(3 + i, tf.int64), alg=seeds_lib.RNG_ALG).numpy()
        np.testing.assert_array_equal(got[i], expected)
    assert got.shape == (4, 2) and got.dtype == np.int64


def test_example_seeds_depend_on_global_index_not_on_the_split():
    seed = tf.constant([5, 6], tf.int32)
    whole = seeds_lib.example_seeds(seed, 0, 8, salt=1).numpy()
    first = seeds_lib.example_seeds(seed, 0, 4, salt=1).numpy()
    second = seeds_lib.example_seeds(seed, tf.constant(4), tf.constant(4), salt=1).numpy()
    np.testing.assert_array_equal(np.concatenate([first, second]), whole)
    assert len({tuple(r) for r in whole}) == 8


def test_salts_and_seeds_separate_streams():
    seed = tf.constant([5, 6])
    a = seeds_lib.example_seeds(seed, 0, 4, salt=seeds_lib.MASKING_SALT).numpy()
    b = seeds_lib.example_seeds(seed, 0, 4, salt=seeds_lib.SAMPLING_SALT).numpy()
    c = seeds_lib.example_seeds(tf.constant([5, 7]), 0, 4, salt=seeds_lib.MASKING_SALT).numpy()
    assert not (a == b).all(axis=1).any()
    assert not (a == c).all(axis=1).any()


def test_example_seeds_in_graph_mode_match_eager():
    seed = tf.constant([1, 2])
    fn = tf.function(lambda s, f, n: seeds_lib.example_seeds(s, f, n, salt=2))
    np.testing.assert_array_equal(
        fn(seed, tf.constant(2), tf.constant(3)).numpy(), seeds_lib.example_seeds(seed, 2, 3, 2).numpy())


def test_replica_example_offset_outside_and_inside_mirrored_strategy(mirrored_strategy):
    assert int(seeds_lib.replica_example_offset(4)) == 0
    strategy = mirrored_strategy  # shared: see tests/conftest.py

    @tf.function
    def step():
        return strategy.run(lambda: seeds_lib.replica_example_offset(tf.constant(4)))

    per_replica = strategy.experimental_local_results(step())
    assert sorted(int(x) for x in per_replica) == [0, 4]
