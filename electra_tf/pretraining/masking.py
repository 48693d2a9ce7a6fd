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

Randomness comes from the counter-based hash keyed by the per-example `keys` (see `seeds.py`
and `electra_tf.modeling.rng`), so an example's mask depends only on its own key and ids, never on
its batch neighbours, and is the same on every Keras backend. Everything here is `keras.ops`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from keras import ops

from electra_tf.modeling import rng
from electra_tf.pretraining import whole_word
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

    input_ids: Any
    input_mask: Any
    segment_ids: Any
    masked_lm_positions: Any
    masked_lm_ids: Any
    masked_lm_weights: Any


def num_to_predict(input_mask, mask_prob: float, max_predictions_per_seq: int):
    """Official per-example count max(1, min(N, round_half_even(float32(n) * float32(mask_prob)))).

    Args:
        input_mask: int [batch_size, seq_length].
        mask_prob: float. Fraction of tokens to mask.
        max_predictions_per_seq: int N.

    Returns:
        int32 [batch_size].
    """
    num_tokens = ops.cast(ops.sum(ops.cast(input_mask, "int32"), axis=-1), "float32")
    # round rounds half to even, like the official tf.round; the product is float32 on purpose
    # (n = 50, p = 0.15 gives 7.5000005, which rounds to 8).
    count = ops.cast(ops.round(num_tokens * ops.cast(mask_prob, "float32")), "int32")
    return ops.maximum(1, ops.minimum(max_predictions_per_seq, count))


def candidates_mask(input_ids, input_mask, special: SpecialTokens):
    """Official `get_candidates_mask`: real tokens other than [CLS], [SEP] and [MASK].

    Args:
        input_ids: int [batch_size, seq_length].
        input_mask: int [batch_size, seq_length].
        special: SpecialTokens. Ids of the special tokens.

    Returns:
        bool [batch_size, seq_length].
    """
    excluded = ops.logical_or(
        ops.logical_or(ops.equal(input_ids, special.cls_id), ops.equal(input_ids, special.sep_id)),
        ops.equal(input_ids, special.mask_id))
    return ops.logical_and(ops.cast(input_mask, "bool"), ops.logical_not(excluded))


def mask_inputs(
    input_ids,
    input_mask,
    segment_ids,
    *,
    special: SpecialTokens,
    mask_prob: float,
    max_predictions_per_seq: int,
    keys,
    with_replacement: bool = True,
    mask_token_prob: float = MASK_TOKEN_PROB,
    whole_word_masking: bool = False,
    word_starts=None,
) -> MaskedInputs:
    """Selects masked-LM positions and masks them (official `pretrain_helpers.mask`).

    Args:
        input_ids: int [batch_size, seq_length]. Original ids (cast to int32).
        input_mask: int [batch_size, seq_length]. 1 on real tokens, 0 on padding.
        segment_ids: int [batch_size, seq_length]. Passed through.
        special: SpecialTokens. Ids of [CLS], [SEP] and [MASK] (never read from a file here).
        mask_prob: float. Fraction of tokens to mask (official `mask_prob`, 0.15).
        max_predictions_per_seq: int N. Number of masked-LM slots.
        keys: int32 [batch_size]. One random key per example (`seeds.example_keys`).
        with_replacement: bool. True (official) draws positions with replacement; False draws
            distinct positions.
        mask_token_prob: float. Probability that a selected slot becomes [MASK] (official 0.85);
            other values are for tests and experiments.
        whole_word_masking: bool. Choose whole words (`whole_word.draw_whole_words`: distinct
            positions, as close to the official count as word boundaries allow) instead of
            single tokens; `with_replacement` is then unused.
        word_starts: bool [batch_size, seq_length]. Word boundaries for `whole_word_masking`
            (e.g. `whole_word.word_starts_from_ids`); required with it.

    Returns:
        A `MaskedInputs`.
    """
    input_ids = ops.cast(input_ids, "int32")
    n_slots = int(max_predictions_per_seq)

    candidates = candidates_mask(input_ids, input_mask, special)
    num_candidates = ops.sum(ops.cast(candidates, "int32"), axis=-1)
    count = num_to_predict(input_mask, mask_prob, n_slots)
    if not with_replacement:
        count = ops.minimum(count, num_candidates)
    count = ops.where(num_candidates > 0, count, 0)  # no candidates: nothing to mask (module doc)
    draws = _Draws(keys, n_slots, _seq_length(candidates))
    if whole_word_masking:
        if word_starts is None:
            raise ValueError("whole_word_masking needs word_starts (the word boundaries)")
        # Keys as for distinct positions (one per token index), used as one per word index.
        positions, count = whole_word.draw_whole_words(
            candidates, ops.cast(word_starts, "bool"), count, n_slots, draws.position_keys())
    elif with_replacement:
        positions = _positions_with_replacement(candidates, num_candidates,
                                                draws.position_uniforms())
    else:
        positions = _distinct_positions(candidates, n_slots, draws.position_keys())
    return _apply_masks(input_ids, input_mask, segment_ids, positions, draws.keep_uniforms(),
                        count, n_slots, special.mask_id, mask_token_prob)


def _seq_length(x):
    return x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]


class _Draws:
    """The three draws of one example, each its own sub-stream of the example's key:
    [MASK]-or-keep uniforms [N], position uniforms [N] (with replacement), position keys [L]
    (distinct positions and whole words)."""

    KEEP, POSITIONS, POSITION_KEYS = 0, 1, 2

    def __init__(self, keys, n_slots: int, seq_length):
        self.keys, self.n_slots, self.seq_length = keys, n_slots, seq_length

    def _bits(self, purpose: int, size):
        return rng.element_bits(rng.subkeys(self.keys, purpose), [size])

    def keep_uniforms(self):
        return rng.uniform(self._bits(self.KEEP, self.n_slots))

    def position_uniforms(self):
        return rng.uniform(self._bits(self.POSITIONS, self.n_slots))

    def position_keys(self):
        # 31-bit non-negative keys: ties (which favour lower positions) have probability
        # ~L^2 / 2^32 per example.
        return rng.unsigned(self._bits(self.POSITION_KEYS, self.seq_length))


def _apply_masks(input_ids, input_mask, segment_ids, positions, keep_u, count, n_slots: int,
                 mask_id: int, mask_token_prob: float) -> MaskedInputs:
    """The first `count` of `positions` [B, N] are the masked-LM slots; those whose `keep_u`
    [B, N] draw is below `mask_token_prob` become [MASK], the others keep their token."""
    used = ops.cast(ops.less(ops.arange(n_slots)[None, :], ops.expand_dims(count, -1)), "int32")
    masked_lm_weights = ops.cast(used, "float32")

    masked_lm_positions = ops.cast(positions, "int32") * used
    masked_lm_ids = gather_positions(input_ids, masked_lm_positions) * used
    replace_with_mask = ops.cast(keep_u < mask_token_prob, "int32")
    masked_ids, _ = scatter_update(
        input_ids,
        ops.full(ops.shape(masked_lm_positions), mask_id, dtype="int32"),
        masked_lm_positions * replace_with_mask,
    )
    return MaskedInputs(
        input_ids=ops.stop_gradient(masked_ids),
        input_mask=input_mask,
        segment_ids=segment_ids,
        masked_lm_positions=masked_lm_positions,
        masked_lm_ids=masked_lm_ids,
        masked_lm_weights=masked_lm_weights,
    )


def _positions_with_replacement(candidates, num_candidates, position_u):
    """Slot j takes the idx-th candidate (in sequence order), idx uniform in [0, num_candidates):
    the official N independent categorical draws. int32 [B, N]."""
    num = ops.expand_dims(num_candidates, -1)
    idx = ops.minimum(ops.cast(position_u * ops.cast(num, "float32"), "int32"), num - 1)
    candidate_rank = ops.cumsum(ops.cast(candidates, "int32"), axis=-1)  # 1-based at candidates
    # The first position whose rank reaches idx + 1: how many positions rank below it.
    below = ops.less(ops.expand_dims(candidate_rank, 1), ops.expand_dims(idx + 1, -1))  # [B,N,L]
    return ops.sum(ops.cast(below, "int32"), axis=-1)


def _distinct_positions(candidates, n_slots: int, keys):
    """k distinct candidates in uniformly random order: the top-N random keys, the candidates'
    keys above every other position's (-1). Padding keeps N <= width when N > seq_length.
    int32 [B, N]."""
    keys = ops.where(candidates, keys, -1)
    missing = n_slots - keys.shape[1]
    if missing > 0:
        keys = ops.pad(keys, [[0, 0], [0, missing]], constant_values=-1)
    return ops.cast(ops.top_k(keys, k=n_slots, sorted=True)[1], "int32")


def unmask(masked: MaskedInputs):
    """Restores the original ids at the masked positions (official `unmask`).

    Args:
        masked: MaskedInputs.

    Returns:
        int32 [batch_size, seq_length]. Unused slots (position 0, id 0) are ignored.
    """
    updated, _ = scatter_update(masked.input_ids, masked.masked_lm_ids, masked.masked_lm_positions)
    return updated
