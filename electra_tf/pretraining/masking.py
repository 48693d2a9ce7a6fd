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

How positions are chosen is the masking strategy, a name (`masking`, the official
`proposal_distribution` seam of `mask()`): "random" is the above (official), "whole_word" chooses
whole words (`whole_word.py`). `STRATEGIES` maps each name to its function: a new strategy is a
module with one `choose_positions(selection)` function and one line there (and its name in
`hparam_checks.MASKINGS`, the hparam's values). `MaskingOptions` groups everything the masking layer
(`layers.ElectraMasking`) takes.

Randomness comes from the counter-based hash keyed by the per-example `keys` (see `seeds.py`
and `electra_tf.modeling.rng`), so an example's mask depends only on its own key and ids, never on
its batch neighbours, and is the same on every Keras backend. Everything here is `keras.ops`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Optional, Tuple

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
    masking: str = "random",
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
        masking: str. The strategy choosing the positions (`STRATEGIES`): "random" (official:
            single tokens) or "whole_word" (`whole_word.choose_positions`: whole words, distinct
            positions, as close to the official count as word boundaries allow;
            `with_replacement` is then unused).
        word_starts: bool [batch_size, seq_length]. Word boundaries for a strategy that needs
            them (`Strategy.needs_word_starts`: "whole_word"), e.g.
            `whole_word.word_starts_from_ids`; required with it.

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
    strategy = strategy_of(masking)
    if strategy.needs_word_starts and word_starts is None:
        raise ValueError(f"masking={masking!r} needs word_starts (the word boundaries)")
    draws = _Draws(keys, n_slots, _seq_length(candidates))
    positions, count = strategy.choose_positions(Selection(
        candidates, num_candidates, count, n_slots, draws, with_replacement,
        None if word_starts is None else ops.cast(word_starts, "bool")))
    return _apply_masks(input_ids, input_mask, segment_ids, positions, draws.keep_uniforms(),
                        count, n_slots, special.mask_id, mask_token_prob)


class Selection(NamedTuple):
    """What a strategy chooses the masked positions from (one batch).

    Attributes:
        candidates: bool [batch_size, seq_length]. Tokens that may be masked (`candidates_mask`).
        num_candidates: int32 [batch_size].
        count: int32 [batch_size]. The official budget k (0 for a row without candidates; at
            most `num_candidates` without replacement).
        n_slots: int N.
        draws: the example's random streams (`_Draws`: `position_uniforms()` [B, N],
            `position_keys()` [B, L]).
        with_replacement: bool. `mask_with_replacement`.
        word_starts: optional bool [batch_size, seq_length]. Word boundaries, for a strategy
            that needs them.
    """

    candidates: Any
    num_candidates: Any
    count: Any
    n_slots: int
    draws: Any
    with_replacement: bool
    word_starts: Any = None


class Strategy(NamedTuple):
    """A masking strategy: `choose_positions(selection)` -> (positions int32 [B, N] with the
    chosen ones in the first `count` slots, count int32 [B])."""

    choose_positions: Callable[[Selection], Tuple[Any, Any]]
    needs_word_starts: bool = False


def choose_random_positions(selection: Selection) -> Tuple[Any, Any]:
    """The official strategy ("random"): single tokens uniformly over the candidates, with
    replacement (official) or distinct."""
    if selection.with_replacement:
        positions = _positions_with_replacement(selection.candidates, selection.num_candidates,
                                                selection.draws.position_uniforms())
    else:
        positions = _distinct_positions(selection.candidates, selection.n_slots,
                                        selection.draws.position_keys())
    return positions, selection.count


# The `masking` hparam's strategies: one line per strategy.
STRATEGIES = {
    "random": Strategy(choose_random_positions),
    "whole_word": Strategy(whole_word.choose_positions, needs_word_starts=True),
}


def strategy_of(masking: str) -> Strategy:
    """The strategy named `masking`; ValueError naming the valid ones."""
    if masking not in STRATEGIES:
        raise ValueError(f"masking must be one of {', '.join(STRATEGIES)}, got {masking!r}")
    return STRATEGIES[masking]


@dataclasses.dataclass(frozen=True)
class MaskingOptions:
    """Everything that decides a batch's masks besides the seed (what `ElectraMasking` takes).

    The first four are the hparams of the same names (`config.PretrainingConfig`).

    Attributes:
        masking: str. The strategy (`STRATEGIES`): "random" (official) or "whole_word".
        mask_prob: float. Fraction of real tokens to mask (official 0.15).
        max_predictions_per_seq: int. N, the masked slots per example.
        mask_with_replacement: bool. Official True; False draws distinct positions.
        continuation_ids: optional tuple of int. The vocab's "##" pieces
            (`whole_word.continuation_ids(vocab.tokens)`), defining the words of a strategy that
            needs them unless the inputs carry `word_starts`.
    """

    masking: str = "random"
    mask_prob: float = 0.15
    max_predictions_per_seq: int = 19
    mask_with_replacement: bool = True
    continuation_ids: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        strategy_of(self.masking)
        if self.continuation_ids is not None:
            object.__setattr__(self, "continuation_ids",
                               tuple(int(i) for i in self.continuation_ids))

    @property
    def strategy(self) -> Strategy:
        return STRATEGIES[self.masking]

    @classmethod
    def of(cls, value) -> "MaskingOptions":
        """`value` itself, the options of a dict of their fields (`to_dict`), or the defaults
        for None."""
        if value is None or isinstance(value, MaskingOptions):
            return value or cls()
        return cls(**value)

    def to_dict(self) -> dict:
        """JSON-ready fields (`continuation_ids` as a list), as `get_config` writes them."""
        d = dataclasses.asdict(self)
        if self.continuation_ids is not None:
            d["continuation_ids"] = list(self.continuation_ids)
        return d


# get_config keys of `ElectraMasking` and the pretraining model before `MaskingOptions`
# (whole_word_masking was a bool): what `upgrade_config` moves into `masking_options`.
LEGACY_KEYS = ("mask_prob", "max_predictions_per_seq", "mask_with_replacement",
               "whole_word_masking", "continuation_ids")


def upgrade_config(config: Mapping[str, Any]) -> dict:
    """A layer or model config saved before `MaskingOptions` in today's form (others as given).

    Old configs (.keras files, get_config dicts) hold the masking arguments at the top level,
    the strategy as the bool `whole_word_masking` (a deprecated alias: true is "whole_word",
    false "random"); they become one `masking_options` dict.

    Raises:
        ValueError: old keys beside `masking_options`.
    """
    config = dict(config)
    legacy = {key: config.pop(key) for key in LEGACY_KEYS if key in config}
    if not legacy:
        return config
    if config.get("masking_options") is not None:
        raise ValueError(f"a config with masking_options and the older "
                         f"{', '.join(sorted(legacy))}: give masking_options only")
    whole_words = legacy.pop("whole_word_masking", False)
    config["masking_options"] = dict(legacy, masking="whole_word" if whole_words else "random")
    return config


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
