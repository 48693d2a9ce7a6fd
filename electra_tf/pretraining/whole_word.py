"""Whole-word masking: masked-LM positions chosen as whole words (`masking: "whole_word"`).

The official `mask()` picks single WordPieces, so a word split into "play ##ing" can be half
masked and the generator predicts "##ing" from "play". With whole-word masking every piece of a
chosen word is masked together. The rule, per example (k = the official count
max(1, min(N, round_half_even(n * mask_prob))), N = max_predictions_per_seq):

1. Words: a word starts at a candidate token that is a word start (for a WordPiece vocab, a token
   whose string does not begin with "##"; for a SentencePiece vocab, a piece that begins with
   the word-start marker "▁", or with punctuation, a CJK ideograph or kana, which BERT makes
   words of their own, or a special token) or that follows a non-candidate, and runs through the
   candidate continuation pieces after it. Candidates are as official: real tokens other than
   [CLS], [SEP] and [MASK].
2. Budget: the words are visited in a uniformly random order (each example its own permutation,
   from its seed) and a word is taken if all its pieces still fit in k (taken so far + its
   length <= k); one that does not fit is skipped and the next one tried (the rule of BERT's
   whole-word `create_pretraining_data.py`). So exactly k tokens are masked whenever the words
   left over allow it, fewer only when every untaken word is longer than the remaining budget,
   never more.
3. If not even one word fits (every word is longer than k, e.g. k = 1 and no one-piece word),
   the first word of the random order is taken alone if it fits in the N slots, so that an
   example with candidates keeps at least one prediction (the official max(1, ...)); a word
   longer than N is never split.
4. Positions are distinct (words are drawn without replacement) and fill the first `count`
   slots in sequence order; as in the default masking, each slot independently becomes [MASK]
   with probability 0.85 and otherwise keeps its original token.

Word boundaries come from the ids (`word_starts_from_ids`, with the vocab's continuation ids), or
from the caller: `mask_inputs(..., word_starts=)` takes a bool [B, L] tensor, for languages whose
words are not marked in the vocab (e.g. Chinese, where every character is its own token and a
word segmenter knows the words).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, List, Sequence, Tuple

import numpy as np
from keras import ops

# WordPiece marks a piece that continues a word with this prefix ("play", "##ing").
CONTINUATION_PREFIX = "##"
# SentencePiece marks a piece that starts a word (follows a space) with this character
# (sentencepiece_vocab.WORD_START_MARKER; repeated here: this module is free of TensorFlow).
WORD_START_MARKER = "\u2581"
# Characters that start a word of their own after a SentencePiece piece without the marker, as
# in BERT's BasicTokenizer (unicode_tables.CJK_RANGES): CJK ideographs, plus Japanese kana, whose
# text has no spaces either (else a whole sentence would be one word, too long to mask).
_OWN_WORD_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2CEAF), (0xF900, 0xFAFF),
                    (0x2F800, 0x2FA1F), (0x3040, 0x30FF))


# SentencePiece's byte-fallback pieces (<0x00>..<0xFF>): parts of the character they spell.
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def _starts_own_word(piece: str) -> bool:
    if not piece:
        return True
    if _BYTE_PIECE.fullmatch(piece):
        return False
    cp = ord(piece[0])
    return (unicodedata.category(piece[0]).startswith("P") or 33 <= cp <= 47 or 58 <= cp <= 64
            or 91 <= cp <= 96 or 123 <= cp <= 126
            or any(lo <= cp <= hi for lo, hi in _OWN_WORD_RANGES))


def continuation_ids(tokens: Sequence[str], kind: str = "wordpiece",
                     special_ids: Iterable[int] = ()) -> List[int]:
    """Ids of the vocab's word-continuation pieces, in increasing order.

    Args:
        tokens: the vocab's token strings in id order (`Vocab.tokens`).
        kind: `Vocab.kind`. "wordpiece": the tokens "##x". "sentencepiece": the pieces that do
            not begin with the word-start marker "▁", punctuation, a CJK ideograph or kana
            (byte-fallback pieces <0xNN> continue).
        special_ids: ids that always start a word (SentencePiece: the vocab's `SpecialTokens`,
            so that [UNK] does not join the word before it).

    Returns:
        list of int.
    """
    if kind == "wordpiece":
        return [i for i, token in enumerate(tokens)
                if token.startswith(CONTINUATION_PREFIX) and len(token) > len(CONTINUATION_PREFIX)]
    if kind != "sentencepiece":
        raise ValueError(f"unknown vocab kind {kind!r}")
    special = set(int(i) for i in special_ids)
    return [i for i, piece in enumerate(tokens)
            if i not in special and not piece.startswith(WORD_START_MARKER)
            and not _starts_own_word(piece)]


def word_starts_from_ids(input_ids, continuation: Iterable[int]):
    """True where a token is not a continuation piece.

    Args:
        input_ids: int [batch_size, seq_length].
        continuation: the continuation ids (`continuation_ids`); ids outside the list (including
            ids beyond its largest entry) are word starts.

    Returns:
        bool [batch_size, seq_length].
    """
    continuation = sorted(set(int(i) for i in continuation))
    ids = ops.cast(input_ids, "int32")
    if not continuation:
        return ops.ones_like(ids, dtype="bool")
    size = continuation[-1] + 1
    table = np.zeros([size], np.bool_)
    table[continuation] = True
    in_table = ops.logical_and(ids >= 0, ids < size)
    is_continuation = ops.logical_and(
        ops.take(ops.convert_to_tensor(table), ops.clip(ids, 0, size - 1)), in_table)
    return ops.logical_not(is_continuation)


def choose_positions(selection) -> Tuple:
    """The "whole_word" masking strategy (`masking.STRATEGIES`; `selection` a
    `masking.Selection` with `word_starts`): `draw_whole_words` with the keys of distinct
    positions (one per token index), used as one per word index."""
    return draw_whole_words(selection.candidates, selection.word_starts, selection.count,
                            selection.n_slots, selection.draws.position_keys())


def draw_whole_words(candidates, word_starts, count, n_slots: int, keys) -> Tuple:
    """Chooses whole words within the per-example budget (rule in the module docstring).

    Args:
        candidates: bool [batch_size, seq_length]. Tokens that may be masked.
        word_starts: bool [batch_size, seq_length]. Word starts (any value off the candidates).
        count: int32 [batch_size]. The budget k (0 for a row without candidates).
        n_slots: int N.
        keys: int32 [batch_size, seq_length], >= 0. Uniform random keys, one per example and word
            index: word w (1-based, in sequence order) is visited in decreasing order of
            keys[:, w - 1].

    Returns:
        positions: int32 [batch_size, N]. The chosen positions in sequence order in the first
            `taken` slots (the values after them are arbitrary: callers zero them).
        taken: int32 [batch_size]. The number of chosen tokens (<= N).
    """
    seq_length = candidates.shape[1]
    previous_candidate = ops.pad(candidates[:, :-1], [[0, 0], [1, 0]], constant_values=False)
    unit_start = ops.logical_and(
        candidates, ops.logical_or(word_starts, ops.logical_not(previous_candidate)))
    word = ops.cumsum(ops.cast(unit_start, "int32"), axis=1) * ops.cast(candidates, "int32")
    lengths = _word_lengths(word)  # [B, L]; lengths[:, w - 1] of word w, 0 past the last word

    # Words in random order: a key below every real one (-1) for no word, so they sort last.
    keys = ops.where(lengths > 0, keys, -1)
    order = ops.top_k(keys, k=seq_length, sorted=True)[1]  # [B, L] word index - 1
    ordered_lengths = ops.take_along_axis(lengths, order, axis=1)
    taken_in_order = _greedy_fill(ordered_lengths, count, n_slots)  # bool [B, L]

    # Back from the visiting order to word index (the inverse permutation), then to positions.
    taken_by_word = ops.take_along_axis(ops.cast(taken_in_order, "int32"),
                                        ops.argsort(order, axis=1), axis=1)
    taken_by_word = ops.pad(taken_by_word, [[0, 0], [1, 0]])  # index 0: no word
    chosen = ops.take_along_axis(taken_by_word, word, axis=1) * ops.cast(candidates, "int32")
    taken = ops.sum(chosen, axis=1)

    # Chosen positions first, in sequence order; padding keeps k <= width when N > seq_length.
    position_keys = ops.where(chosen > 0, seq_length - ops.arange(seq_length)[None, :], -1)
    if n_slots > seq_length:
        position_keys = ops.pad(position_keys, [[0, 0], [0, n_slots - seq_length]],
                                constant_values=-1)
    positions = ops.top_k(position_keys, k=n_slots, sorted=True)[1]
    return ops.cast(positions, "int32"), taken


def _word_lengths(word):
    """Pieces per word: int32 [B, L], entry w - 1 for word w (0 where there is no such word)."""
    seq_length = word.shape[1]
    # [B, L, L]: position i belongs to word w (w = 1..L; word 0, the non-candidates, is dropped).
    belongs = ops.equal(ops.expand_dims(word, -1), ops.arange(1, seq_length + 1)[None, None, :])
    return ops.sum(ops.cast(belongs, "int32"), axis=1)


def _greedy_fill(ordered_lengths, count, n_slots: int):
    """Which words to take, visiting them in order: a word is taken if it fits the budget.

    Args:
        ordered_lengths: int32 [B, W]. Word lengths in visiting order (0 = no word).
        count: int32 [B]. The budget k.
        n_slots: int N. A lone word that overshoots k must still fit here.

    Returns:
        bool [B, W].
    """
    def visit(total, length):
        fits = ops.logical_and(length > 0, total + length <= count)
        total = total + ops.where(fits, length, 0)
        return total, total

    # One pass over the visiting ranks, vectorised over the batch (the budget makes each
    # decision depend on the previous ones).
    _, totals = ops.scan(visit, ops.zeros_like(count), ops.transpose(ordered_lengths))
    totals = ops.transpose(totals)
    previous = ops.pad(totals[:, :-1], [[0, 0], [1, 0]])
    taken = totals > previous
    # Nothing fitted: the first word alone, if the row has one and it fits in the slots.
    first = ordered_lengths[:, 0]
    fallback = ops.logical_and(ops.logical_and(totals[:, -1] == 0, count > 0),
                               ops.logical_and(first > 0, first <= n_slots))
    first_rank = ops.equal(ops.arange(ordered_lengths.shape[1]), 0)[None, :]
    return ops.logical_or(taken, ops.logical_and(ops.expand_dims(fallback, -1), first_rank))
