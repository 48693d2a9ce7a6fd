"""Gathering from and scattering into per-example sequences at given positions.

Behaviour of the official `pretrain/pretrain_helpers.py` `gather_positions` and `scatter_update`,
including the quirks the objective relies on: updates aimed at position 0 are ignored (that is how
unused masked-LM slots, which point to position 0, become no-ops), and duplicate positions take the
mean of their updates (floor of the mean for integer tensors).
"""

from __future__ import annotations

from typing import Tuple

import keras
from keras import ops


def gather_positions(sequence, positions):
    """Gathers, for every example, the entries of its sequence at the given positions.

    Args:
        sequence: [batch_size, seq_length] or [batch_size, seq_length, depth] tensor.
        positions: int [batch_size, n_positions] indices into the sequence axis. Duplicates are
            allowed and are gathered repeatedly.

    Returns:
        [batch_size, n_positions] or [batch_size, n_positions, depth], with the sequence's dtype:
        `result[b, j] = sequence[b, positions[b, j]]`.
    """
    positions = ops.cast(positions, "int32")
    if len(sequence.shape) == 3:
        positions = ops.expand_dims(positions, -1)
    return ops.take_along_axis(sequence, positions, axis=1)


def scatter_update(sequence, updates, positions) -> Tuple:
    """Writes `updates` into `sequence` at `positions`, with the official duplicate semantics.

    - Updates aimed at position 0 are ignored (position 0 is always [CLS]; unused slots point
      there).
    - Several updates at one position are summed and divided by their count: true division for
      floating tensors, floor division for integer tensors. Equal duplicates therefore give that
      value; different integer duplicates give the floor of their mean (official quirk, issue #41).

    The official code blends with `(1 - mask) * sequence + mask * updates`; this selects with
    `where`, which gives the same values for finite inputs and does not turn an infinite or NaN
    entry elsewhere into NaN. The sums go through a [batch, n_positions, seq_length] one-hot
    (N x L per example, a few thousand elements for ELECTRA's N = 19 slots): the same arithmetic
    on every backend, no scatter kernel.

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
    sequence = ops.convert_to_tensor(sequence)
    dtype = keras.backend.standardize_dtype(sequence.dtype)
    updates = ops.convert_to_tensor(updates)
    if keras.backend.standardize_dtype(updates.dtype) != dtype:
        raise TypeError(f"scatter_update: updates are "
                        f"{keras.backend.standardize_dtype(updates.dtype)}, the sequence {dtype}")
    has_depth = len(sequence.shape) == 3
    if not has_depth:
        sequence = ops.expand_dims(sequence, -1)
        updates = ops.expand_dims(updates, -1)
    seq_length = sequence.shape[1]
    if seq_length is None:
        seq_length = ops.shape(sequence)[1]
    # [B, N, L]: slot j aims at position p; position 0 is never updated.
    hits = ops.one_hot(ops.cast(positions, "int32"), seq_length, dtype="int32")
    not_first = ops.cast(ops.greater(ops.arange(seq_length), 0), "int32")
    hits = hits * not_first
    counts = ops.sum(hits, axis=1)  # [B, L]
    summed = ops.sum(ops.expand_dims(ops.cast(hits, dtype), -1) * ops.expand_dims(updates, 2),
                     axis=1)  # [B, L, depth]
    divisor = ops.cast(ops.expand_dims(ops.maximum(counts, 1), -1), dtype)
    if "float" in str(dtype):
        updated = summed / divisor
    else:
        updated = ops.floor_divide(summed, divisor)
    updates_mask = ops.minimum(counts, 1)
    updated_sequence = ops.where(ops.expand_dims(updates_mask > 0, -1), updated, sequence)
    if not has_depth:
        updated_sequence = updated_sequence[:, :, 0]
    return updated_sequence, updates_mask
