"""gather_positions / scatter_update: exact official semantics (checklist items 15, 16)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.pretraining.tensor_ops import gather_positions, scatter_update


def _both_modes(fn):
    """Runs fn eagerly and inside tf.function; both results must agree."""
    return fn(), tf.function(fn)()


def test_gather_positions_2d_and_3d_match_row_indexing_with_duplicates():
    seq = np.arange(2 * 6).reshape(2, 6).astype(np.int32) * 10
    pos = np.array([[0, 3, 3, 5], [1, 1, 2, 0]], np.int32)
    expected = np.stack([seq[b, pos[b]] for b in range(2)])
    for got in _both_modes(lambda: gather_positions(tf.constant(seq), tf.constant(pos))):
        np.testing.assert_array_equal(got.numpy(), expected)

    seq3 = np.random.default_rng(0).normal(size=(2, 6, 3)).astype(np.float32)
    got3 = gather_positions(tf.constant(seq3), tf.constant(pos)).numpy()
    assert got3.shape == (2, 4, 3)
    np.testing.assert_array_equal(got3, np.stack([seq3[b, pos[b]] for b in range(2)]))


def test_scatter_update_int_ignores_position_0_and_floor_means_duplicates():
    seq = np.array([[101, 11, 12, 13, 14, 102], [101, 21, 22, 23, 24, 102]], np.int32)
    updates = np.array([[7, 8, 50, 0], [5, 6, 9, 4]], np.int32)
    pos = np.array([[1, 3, 3, 0], [2, 2, 4, 0]], np.int32)

    def run():
        return scatter_update(tf.constant(seq), tf.constant(updates), tf.constant(pos))

    for updated, mask in _both_modes(run):
        # row 0: pos 1 <- 7; pos 3 <- floor((8 + 50) / 2) = 29; the update at position 0 is ignored.
        # row 1: pos 2 <- floor((5 + 6) / 2) = 5 (floor mean, an arbitrary id); pos 4 <- 9.
        np.testing.assert_array_equal(
            updated.numpy(), [[101, 7, 12, 29, 14, 102], [101, 21, 5, 23, 9, 102]])
        np.testing.assert_array_equal(mask.numpy(), [[0, 1, 0, 1, 0, 0], [0, 0, 1, 0, 1, 0]])
        assert updated.dtype == tf.int32 and mask.dtype == tf.int32


def test_scatter_update_equal_duplicates_keep_their_value():
    seq = tf.constant([[1, 2, 3, 4]], tf.int32)
    updated, mask = scatter_update(seq, tf.constant([[9, 9, 9]]), tf.constant([[2, 2, 2]]))
    np.testing.assert_array_equal(updated.numpy(), [[1, 2, 9, 4]])
    np.testing.assert_array_equal(mask.numpy(), [[0, 0, 1, 0]])


def test_scatter_update_all_slots_at_position_0_is_a_no_op():
    seq = tf.constant([[101, 5, 6, 102]], tf.int32)
    updated, mask = scatter_update(seq, tf.constant([[77, 88]]), tf.constant([[0, 0]]))
    np.testing.assert_array_equal(updated.numpy(), seq.numpy())
    np.testing.assert_array_equal(mask.numpy(), [[0, 0, 0, 0]])


def test_scatter_update_float_true_mean_of_duplicates_3d():
    seq = np.zeros((1, 4, 2), np.float32)
    seq[0, :, :] = [[1, 1], [2, 2], [3, 3], [4, 4]]
    updates = np.array([[[1.0, 10.0], [2.0, 20.0], [5.0, 5.0], [9.0, 9.0]]], np.float32)
    pos = np.array([[1, 1, 3, 0]], np.int32)
    for updated, mask in _both_modes(
            lambda: scatter_update(tf.constant(seq), tf.constant(updates), tf.constant(pos))):
        expected = seq.copy()
        expected[0, 1] = [1.5, 15.0]  # true mean, not floor
        expected[0, 3] = [5.0, 5.0]
        np.testing.assert_array_equal(updated.numpy(), expected)
        np.testing.assert_array_equal(mask.numpy(), [[0, 1, 0, 1]])


def test_scatter_update_float_2d():
    seq = tf.constant([[0.5, 0.5, 0.5]])
    updated, _ = scatter_update(seq, tf.constant([[1.0, 2.0]]), tf.constant([[2, 2]]))
    np.testing.assert_array_equal(updated.numpy(), [[0.5, 0.5, 1.5]])


def test_scatter_update_rejects_mismatched_dtype():
    with pytest.raises((TypeError, ValueError)):
        scatter_update(tf.constant([[1, 2]], tf.int32), tf.constant([[1.5]]), tf.constant([[1]]))


def test_scatter_update_matches_a_reference_loop_on_random_inputs():
    rng = np.random.default_rng(1)
    b, length, n = 5, 9, 7
    seq = rng.integers(0, 1000, size=(b, length)).astype(np.int32)
    updates = rng.integers(0, 1000, size=(b, n)).astype(np.int32)
    pos = rng.integers(0, 4, size=(b, n)).astype(np.int32)  # many duplicates and zeros
    expected = seq.copy()
    expected_mask = np.zeros_like(seq)
    for r in range(b):
        for p in range(1, length):
            hits = updates[r][pos[r] == p]
            if len(hits):
                expected[r, p] = hits.sum() // len(hits)
                expected_mask[r, p] = 1
    updated, mask = scatter_update(tf.constant(seq), tf.constant(updates), tf.constant(pos))
    np.testing.assert_array_equal(updated.numpy(), expected)
    np.testing.assert_array_equal(mask.numpy(), expected_mask)
