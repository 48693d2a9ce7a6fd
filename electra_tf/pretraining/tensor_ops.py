"""Gathering from and scattering into per-example sequences at given positions.

Behaviour of the official `pretrain/pretrain_helpers.py` `gather_positions` and `scatter_update`,
including the quirks the objective relies on: updates aimed at position 0 are ignored (that is how
unused masked-LM slots, which point to position 0, become no-ops), and duplicate positions take the
mean of their updates (floor of the mean for integer tensors).
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf


def gather_positions(sequence: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
    """Gathers, for every example, the entries of its sequence at the given positions.

    Args:
        sequence: [batch_size, seq_length] or [batch_size, seq_length, depth] tensor.
        positions: int [batch_size, n_positions] indices into the sequence axis. Duplicates are
            allowed and are gathered repeatedly.

    Returns:
        [batch_size, n_positions] or [batch_size, n_positions, depth], with the sequence's dtype:
        `result[b, j] = sequence[b, positions[b, j]]`.
    """
    return tf.gather(sequence, positions, batch_dims=1)


def scatter_update(
    sequence: tf.Tensor, updates: tf.Tensor, positions: tf.Tensor
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Writes `updates` into `sequence` at `positions`, with the official duplicate semantics.

    - Updates aimed at position 0 are ignored (position 0 is always [CLS]; unused slots point
      there).
    - Several updates at one position are summed and divided by their count: true division for
      floating tensors, floor division for integer tensors. Equal duplicates therefore give that
      value; different integer duplicates give the floor of their mean (official quirk, issue #41).

    The official code blends with `(1 - mask) * sequence + mask * updates`; this uses `tf.where`,
    which gives the same values for finite inputs and does not turn an infinite or NaN entry
    elsewhere into NaN.

    Args:
        sequence: [batch_size, seq_length] (typically int32 ids) or
            [batch_size, seq_length, depth] (typically float32) tensor.
        updates: [batch_size, n_positions] or [batch_size, n_positions, depth], same dtype as
            `sequence`.
        positions: int [batch_size, n_positions], values in [0, seq_length).

    Returns:
        updated_sequence: same shape and dtype as `sequence`.
        updates_mask: int32 [batch_size, seq_length], 1 where a position was updated (never at
            position 0), else 0.
    """
    sequence = tf.convert_to_tensor(sequence)
    updates = tf.convert_to_tensor(updates, dtype=sequence.dtype)
    positions = tf.convert_to_tensor(positions)
    has_depth = sequence.shape.rank == 3
    if not has_depth:
        sequence = sequence[:, :, tf.newaxis]
        updates = updates[:, :, tf.newaxis]

    summed, counts = _sum_and_count(sequence, updates, positions)
    not_first_token = tf.range(tf.shape(sequence)[1]) > 0
    counts = tf.where(not_first_token[tf.newaxis, :], counts, tf.zeros_like(counts))

    counts_3d = tf.cast(counts[:, :, tf.newaxis], sequence.dtype)
    if sequence.dtype.is_floating:
        updated = summed / tf.maximum(tf.ones_like(counts_3d), counts_3d)
    else:
        updated = tf.math.floordiv(summed, tf.maximum(tf.ones_like(counts_3d), counts_3d))

    updates_mask = tf.minimum(counts, 1)
    updated_sequence = tf.where(updates_mask[:, :, tf.newaxis] > 0, updated, sequence)
    if not has_depth:
        updated_sequence = updated_sequence[:, :, 0]
    return updated_sequence, updates_mask


def _sum_and_count(sequence: tf.Tensor, updates: tf.Tensor, positions: tf.Tensor):
    """Per position, the sum of the updates aimed at it and their count.

    Args:
        sequence: [batch_size, seq_length, depth].
        updates: [batch_size, n_positions, depth].
        positions: int [batch_size, n_positions].

    Returns:
        summed: like `sequence`; counts: int32 [batch_size, seq_length].
    """
    shape = tf.shape(sequence)
    batch_size, seq_length, depth = shape[0], shape[1], shape[2]
    positions = tf.cast(positions, tf.int32)
    offsets = tf.range(batch_size, dtype=tf.int32)[:, tf.newaxis] * seq_length
    flat_positions = tf.reshape(positions + offsets, [-1, 1])
    # scatter_nd sums updates that share an index: the numerator of the duplicate mean.
    summed = tf.scatter_nd(
        flat_positions, tf.reshape(updates, [-1, depth]), tf.stack([batch_size * seq_length, depth])
    )
    counts = tf.scatter_nd(
        flat_positions, tf.ones_like(flat_positions[:, 0]), tf.reshape(batch_size * seq_length, [1])
    )
    return tf.reshape(summed, shape), tf.reshape(counts, [batch_size, seq_length])
