"""Dynamic masking of the generator input: the official `pretrain_helpers.mask` and `unmask`.

Per example, with n = sum(input_mask) (including [CLS] and [SEP]) and N = max_predictions_per_seq:

1. k = max(1, min(N, round_half_even(float32(n) * float32(mask_prob)))) slots are used; their
   `masked_lm_weights` are 1 (the first k slots), the rest 0.
2. Candidates are real tokens (input_mask = 1) other than [CLS], [SEP] and [MASK]; [UNK] is a
   candidate. The k positions are drawn uniformly over the candidates, by default WITH replacement
   (official: N independent `tf.random.categorical` draws), so a position can be drawn twice.
   `with_replacement=False` draws k distinct positions instead (the fix the maintainer suggested
   in issue #41); k is then also capped at the number of candidates.
3. Unused slots get position 0 and id 0. `masked_lm_ids` are the original ids at the positions.
4. Each used slot independently becomes [MASK] with probability 0.85 and otherwise keeps its
   ORIGINAL token; no random tokens. The [MASK] writes go through `scatter_update`, so a position
   drawn twice becomes [MASK] if either of its draws passes (official semantics).

Rows without any candidate (impossible for the official builder's examples) are left unmasked with
all weights 0 instead of the official NaN probabilities; they then contribute nothing to the MLM
loss, and the loss's +1e-6 keeps even an all-empty batch finite.

Randomness comes from stateless ops keyed by the per-example `seeds` (see `seeds.py`), so an
example's mask depends only on its own seed and ids, never on its batch neighbours.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from electra_tf.pretraining import seeds as seeds_lib
from electra_tf.pretraining.tensor_ops import gather_positions, scatter_update
from electra_tf.vocab import SpecialTokens

# Official pretrain_helpers.mask: `tf.less(tf.random.uniform([B, N]), 0.85)` decides which
# selected positions are replaced by [MASK]; the others keep the original token.
MASK_TOKEN_PROB = 0.85


class MaskedInputs(NamedTuple):
    """The generator's input plus the masked-LM targets (the official `Inputs` after `mask`).

    Attributes:
        input_ids: int32 [batch_size, seq_length]. Ids with the selected positions set to [MASK]
            (85%) or left unchanged (15%).
        input_mask: [batch_size, seq_length], unchanged.
        segment_ids: [batch_size, seq_length], unchanged.
        masked_lm_positions: int32 [batch_size, max_predictions_per_seq]. Selected positions; 0 in
            unused slots.
        masked_lm_ids: int32 [batch_size, max_predictions_per_seq]. Original ids at the positions;
            0 in unused slots.
        masked_lm_weights: float32 [batch_size, max_predictions_per_seq]. 1 for used slots.
    """

    input_ids: tf.Tensor
    input_mask: tf.Tensor
    segment_ids: tf.Tensor
    masked_lm_positions: tf.Tensor
    masked_lm_ids: tf.Tensor
    masked_lm_weights: tf.Tensor


def num_to_predict(input_mask: tf.Tensor, mask_prob: float, max_predictions_per_seq: int) -> tf.Tensor:
    """Official per-example count max(1, min(N, round_half_even(float32(n) * float32(mask_prob)))).

    Args:
        input_mask: int [batch_size, seq_length].
        mask_prob: float. Fraction of tokens to mask.
        max_predictions_per_seq: int N.

    Returns:
        int32 [batch_size].
    """
    num_tokens = tf.cast(tf.reduce_sum(tf.cast(input_mask, tf.int32), axis=-1), tf.float32)
    # tf.round rounds half to even, like the official code; the product is float32 on purpose
    # (n = 50, p = 0.15 gives 7.5000005, which rounds to 8).
    count = tf.cast(tf.round(num_tokens * tf.constant(mask_prob, tf.float32)), tf.int32)
    return tf.maximum(1, tf.minimum(max_predictions_per_seq, count))


def candidates_mask(input_ids: tf.Tensor, input_mask: tf.Tensor, special: SpecialTokens) -> tf.Tensor:
    """Official `get_candidates_mask`: real tokens other than [CLS], [SEP] and [MASK].

    Args:
        input_ids: int [batch_size, seq_length].
        input_mask: int [batch_size, seq_length].
        special: SpecialTokens. Ids of the special tokens.

    Returns:
        bool [batch_size, seq_length].
    """
    excluded = (
        tf.equal(input_ids, special.cls_id)
        | tf.equal(input_ids, special.sep_id)
        | tf.equal(input_ids, special.mask_id)
    )
    return tf.cast(input_mask, tf.bool) & ~excluded


def mask_inputs(
    input_ids: tf.Tensor,
    input_mask: tf.Tensor,
    segment_ids: tf.Tensor,
    *,
    special: SpecialTokens,
    mask_prob: float,
    max_predictions_per_seq: int,
    seeds: tf.Tensor,
    with_replacement: bool = True,
    mask_token_prob: float = MASK_TOKEN_PROB,
) -> MaskedInputs:
    """Selects masked-LM positions and masks them (official `pretrain_helpers.mask`).

    Args:
        input_ids: int [batch_size, seq_length]. Original ids (cast to int32).
        input_mask: int [batch_size, seq_length]. 1 on real tokens, 0 on padding.
        segment_ids: int [batch_size, seq_length]. Passed through.
        special: SpecialTokens. Ids of [CLS], [SEP] and [MASK] (never read from a file here).
        mask_prob: float. Fraction of tokens to mask (official `mask_prob`, 0.15).
        max_predictions_per_seq: int N. Number of masked-LM slots.
        seeds: int [batch_size, 2]. One stateless seed per example (`seeds.example_seeds`).
        with_replacement: bool. True (official) draws positions with replacement; False draws
            distinct positions.
        mask_token_prob: float. Probability that a selected slot becomes [MASK] (official 0.85);
            other values are for tests and experiments.

    Returns:
        A `MaskedInputs`.
    """
    input_ids = tf.cast(input_ids, tf.int32)
    n_slots = int(max_predictions_per_seq)

    candidates = candidates_mask(input_ids, input_mask, special)
    num_candidates = tf.reduce_sum(tf.cast(candidates, tf.int32), axis=-1)
    count = num_to_predict(input_mask, mask_prob, n_slots)
    if not with_replacement:
        count = tf.minimum(count, num_candidates)
    count = tf.where(num_candidates > 0, count, 0)  # no candidates: nothing to mask (see module doc)
    masked_lm_weights = tf.sequence_mask(count, n_slots, dtype=tf.float32)
    used = tf.cast(masked_lm_weights, tf.int32)
    positions, keep_u = _draw_positions(candidates, num_candidates, n_slots, seeds, with_replacement)

    masked_lm_positions = positions * used
    masked_lm_ids = gather_positions(input_ids, masked_lm_positions) * used
    replace_with_mask = tf.cast(keep_u < mask_token_prob, tf.int32)
    masked_ids, _ = scatter_update(
        input_ids,
        tf.fill(tf.shape(masked_lm_positions), tf.constant(special.mask_id, tf.int32)),
        masked_lm_positions * replace_with_mask,
    )
    return MaskedInputs(
        input_ids=tf.stop_gradient(masked_ids),
        input_mask=input_mask,
        segment_ids=segment_ids,
        masked_lm_positions=masked_lm_positions,
        masked_lm_ids=masked_lm_ids,
        masked_lm_weights=masked_lm_weights,
    )


def _draw_positions(candidates: tf.Tensor, num_candidates: tf.Tensor, n_slots: int,
                    seeds: tf.Tensor, with_replacement: bool):
    """Random candidate positions for the N slots, and each slot's [MASK]-or-keep draw.

    Args:
        candidates: bool [batch_size, seq_length]. Positions that may be masked.
        num_candidates: int32 [batch_size]. Their count per row.
        n_slots: int N.
        seeds: int [batch_size, 2]. One stateless seed per example.
        with_replacement: bool. See `mask_inputs`.

    Returns:
        positions: int32 [batch_size, N], candidate positions (to be zeroed beyond the count).
        keep_u: float32 [batch_size, N], uniform draws deciding [MASK] vs keep.
    """
    seq_length = tf.shape(candidates)[1]

    def draws(b, seed):
        position_seed, keep_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 2, alg=seeds_lib.RNG_ALG))
        keep_u = tf.random.stateless_uniform([n_slots], keep_seed, alg=seeds_lib.RNG_ALG)
        if with_replacement:
            position_u = tf.random.stateless_uniform([n_slots], position_seed, alg=seeds_lib.RNG_ALG)
            return position_u, keep_u
        # Full-range int64 keys: ties (which would favour lower positions) have probability
        # ~L^2 / 2^64 instead of ~L^2 / 2^24 with float keys.
        keys = tf.random.stateless_uniform(
            [seq_length], position_seed, minval=None, maxval=None, dtype=tf.int64, alg=seeds_lib.RNG_ALG)
        return keys, keep_u

    position_dtype = tf.float32 if with_replacement else tf.int64
    position_draws, keep_u = seeds_lib.map_examples(
        draws, seeds,
        fn_output_signature=(tf.TensorSpec(None, position_dtype), tf.TensorSpec([n_slots], tf.float32)))

    if with_replacement:
        # Slot j takes the idx-th candidate (in sequence order), idx uniform in [0, num_candidates).
        idx = tf.cast(position_draws * tf.cast(num_candidates[:, tf.newaxis], tf.float32), tf.int32)
        idx = tf.minimum(idx, num_candidates[:, tf.newaxis] - 1)
        candidate_rank = tf.cumsum(tf.cast(candidates, tf.int32), axis=-1)  # 1-based rank at candidates
        positions = tf.searchsorted(candidate_rank, idx + 1, side="left", out_type=tf.int32)
    else:
        # Random keys on the candidates, lowest possible key elsewhere: the top-k are k distinct
        # candidates in uniformly random order. Padding keeps k <= width even when N > seq_length.
        keys = tf.where(candidates, position_draws, tf.int64.min)
        keys = tf.pad(keys, [[0, 0], [0, tf.maximum(0, n_slots - seq_length)]], constant_values=tf.int64.min)
        positions = tf.math.top_k(keys, k=n_slots, sorted=True).indices
    return positions, keep_u


def unmask(masked: MaskedInputs) -> tf.Tensor:
    """Restores the original ids at the masked positions (official `unmask`).

    Args:
        masked: MaskedInputs.

    Returns:
        int32 [batch_size, seq_length]. Unused slots (position 0, id 0) are ignored.
    """
    updated, _ = scatter_update(masked.input_ids, masked.masked_lm_ids, masked.masked_lm_positions)
    return updated
