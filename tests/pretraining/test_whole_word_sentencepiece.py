"""Whole-word masking with a SentencePiece vocab: words from the word-start marker."""

import numpy as np

from electra_tf.pretraining.whole_word import continuation_ids, word_starts_from_ids
from electra_tf.vocab import SpecialTokens

PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581play", "ing", "\u2581the", ",",
          "\u2581", "東", "京", "です", "<0xF0>", "\u2581문장", "입니다", "."]
SPECIAL = SpecialTokens(0, 1, 2, 3, 4)


def test_continuations_are_pieces_without_the_marker():
    ids = continuation_ids(PIECES, "sentencepiece", SPECIAL)
    # The byte piece and the Korean ending continue their word; punctuation, CJK ideographs,
    # kana ("です") and the specials start words of their own, as in BERT.
    assert [PIECES[i] for i in ids] == ["ing", "<0xF0>", "입니다"]


def test_word_starts_follow_the_marker():
    ids = continuation_ids(PIECES, "sentencepiece", SPECIAL)
    index = {p: i for i, p in enumerate(PIECES)}
    seq = [[index[p] for p in ["[CLS]", "\u2581play", "ing", ",", "\u2581문장", "입니다", "[UNK]",
                               "[SEP]"]]]
    starts = np.asarray(word_starts_from_ids(np.array(seq, np.int32), ids))
    assert starts.tolist() == [[True, True, False, True, True, False, True, True]]


def test_wordpiece_rule_unchanged():
    assert continuation_ids(["[PAD]", "play", "##ing", "##"]) == [2]
