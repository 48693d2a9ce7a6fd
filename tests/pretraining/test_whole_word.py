"""Whole-word masking: whole words only, the budget rule, uniform words, 85/15, seeds (option off
by default: the default masking and its tests are unchanged)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.pretraining import masking, seeds as seeds_lib, whole_word
from electra_tf.pretraining.layers import ElectraMasking
from electra_tf.pretraining.masking import MaskingOptions
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
# Ids 5..49 start a word, 50..99 continue one ("##x").
CONTINUATION = list(range(50, 100))
SEED = tf.constant([77, 3], tf.int32)


def _seeds(batch_size, first=0):
    return seeds_lib.example_keys(SEED, first, batch_size, salt=seeds_lib.MASKING_SALT)


def _rows(word_lengths_per_row, seq_length, rng):
    """[CLS] words [SEP] + padding; each word a start id and length - 1 continuation ids.
    Returns ids, input_mask and each row's list of word position lists."""
    ids = np.zeros((len(word_lengths_per_row), seq_length), np.int32)
    words = []
    for r, lengths in enumerate(word_lengths_per_row):
        row, row_words = [SPECIAL.cls_id], []
        for length in lengths:
            row_words.append(list(range(len(row), len(row) + length)))
            row += [int(rng.integers(5, 50))] + [int(x) for x in rng.integers(50, 100, length - 1)]
        row.append(SPECIAL.sep_id)
        assert len(row) <= seq_length
        ids[r, :len(row)] = row
        words.append(row_words)
    return ids, (ids > 0).astype(np.int32), words


def _mask(ids, mask, keys=None, **kw):
    kw.setdefault("mask_prob", 0.15)
    kw.setdefault("max_predictions_per_seq", 19)
    fn = tf.function(lambda s: masking.mask_inputs(
        tf.constant(ids), tf.constant(mask), tf.zeros_like(tf.constant(ids)), special=SPECIAL,
        keys=s, masking="whole_word",
        word_starts=whole_word.word_starts_from_ids(tf.constant(ids), CONTINUATION), **kw))
    return fn(_seeds(len(ids)) if keys is None else keys)


def _random_lengths(rng, rows, seq_length):
    """Word lengths 1, 2, 3 pieces (p = 0.6, 0.3, 0.1) filling up to seq_length - 2 tokens."""
    out = []
    for _ in range(rows):
        budget = int(rng.integers(10, seq_length - 1))
        lengths = []
        while True:
            length = int(rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1]))
            if sum(lengths) + length > budget:
                break
            lengths.append(length)
        out.append(lengths)
    return out


def test_continuation_ids_and_word_starts():
    assert whole_word.continuation_ids(["[PAD]", "play", "##ing", "##", "#x", "##s"]) == [2, 5]
    ids = tf.constant([[2, 7, 55, 56, 8, 3, 0, 120]])
    np.testing.assert_array_equal(whole_word.word_starts_from_ids(ids, CONTINUATION).numpy(),
                                  [[1, 1, 0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(whole_word.word_starts_from_ids(ids, []).numpy(), [[1] * 8])


def test_every_candidate_masked_in_sequence_order_at_mask_prob_1():
    # [CLS] w ##a ##b [MASK] ##c w [SEP]: "##c" after [MASK] (not a candidate) is its own word.
    ids = np.array([[2, 7, 55, 56, 4, 57, 8, 3, 0]], np.int32)
    out = _mask(ids, (ids > 0).astype(np.int32), mask_prob=1.0, max_predictions_per_seq=9,
                mask_token_prob=1.0)
    np.testing.assert_array_equal(out.masked_lm_positions.numpy(), [[1, 2, 3, 5, 6, 0, 0, 0, 0]])
    np.testing.assert_array_equal(out.masked_lm_weights.numpy(), [[1] * 5 + [0] * 4])
    np.testing.assert_array_equal(out.masked_lm_ids.numpy(), [[7, 55, 56, 57, 8, 0, 0, 0, 0]])
    np.testing.assert_array_equal(out.input_ids.numpy(), [[2, 4, 4, 4, 4, 4, 4, 3, 0]])
    np.testing.assert_array_equal(masking.unmask(out).numpy(), ids)


def test_whole_words_and_the_budget_rule():
    rng = np.random.default_rng(1)
    lengths = _random_lengths(rng, 600, 64)
    ids, mask, words = _rows(lengths, 64, rng)
    out = _mask(ids, mask, max_predictions_per_seq=9)
    k = np.maximum(1, np.minimum(9, np.round(mask.sum(1).astype(np.float32) * np.float32(0.15))))
    positions, weights = out.masked_lm_positions.numpy(), out.masked_lm_weights.numpy()
    counts = weights.sum(1).astype(int)
    overshoots = 0
    for r in range(len(ids)):
        chosen = set(positions[r, :counts[r]].tolist())
        assert len(chosen) == counts[r]  # distinct positions
        assert (weights[r, :counts[r]] == 1).all() and (positions[r, counts[r]:] == 0).all()
        taken = [w for w in words[r] if chosen & set(w)]
        for w in taken:
            assert set(w) <= chosen, (r, w, chosen)  # a chosen word is masked whole
        assert chosen == set().union(*map(set, taken)) if taken else not chosen
        left = [len(w) for w in words[r] if not chosen & set(w)]
        if counts[r] > k[r]:
            # Nothing fitted: one word alone, and every word was longer than the budget.
            overshoots += 1
            assert len(taken) == 1 and min(len(w) for w in words[r]) > k[r]
        else:
            # Every word left over is longer than the budget left (else it would have fitted).
            assert all(length > k[r] - counts[r] for length in left), (r, counts[r], k[r], left)
    assert counts.max() <= 9
    # Close to the official count: measured exactly k in 99.8% of rows, 0.9997 of the count.
    exact = np.mean(counts == k)
    assert exact > 0.98 and counts.sum() / k.sum() > 0.995, (exact, counts.sum() / k.sum())
    assert overshoots == 0  # every row here has one-piece words


def test_one_word_when_no_word_fits_the_budget():
    # 6 tokens: k = max(1, round(0.9)) = 1, and only two-piece words: the first word of the
    # random order is taken alone (2 > k tokens), so the example keeps a prediction.
    rng = np.random.default_rng(2)
    ids, mask, words = _rows([[2, 2]] * 200, 8, rng)
    out = _mask(ids, mask, max_predictions_per_seq=4)
    counts = out.masked_lm_weights.numpy().sum(1)
    assert (counts == 2).all()
    first = out.masked_lm_positions.numpy()[:, :2]
    assert {tuple(r) for r in first.tolist()} == {(1, 2), (3, 4)}
    # Both words are the lone pick about equally often (200 rows: sd 7).
    share = np.mean(first[:, 0] == 1)
    assert abs(share - 0.5) < 5 * math.sqrt(0.25 / 200), share
    # A word longer than the slots is never split: nothing is masked then.
    out = _mask(ids, mask, max_predictions_per_seq=1)
    assert out.masked_lm_weights.numpy().sum() == 0


def test_words_are_chosen_uniformly():
    # 2000 rows of 20 two-piece words (42 tokens: k = round(6.3) = 6, three words per row).
    rng = np.random.default_rng(3)
    ids, mask, words = _rows([[2] * 20] * 2000, 42, rng)
    out = _mask(ids, mask)
    positions = out.masked_lm_positions.numpy()[:, :6]
    assert (out.masked_lm_weights.numpy().sum(1) == 6).all()
    starts = positions[:, ::2]  # sequence order: each word's first piece, then its second
    np.testing.assert_array_equal(positions[:, 1::2], starts + 1)
    counts = np.bincount(((starts.ravel() - 1) // 2), minlength=20)
    expected = starts.size / 20
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 50.0, chi2  # 19 dof: p(chi2 > 50) ~ 1e-4


def test_85_15_split_per_token_and_no_random_tokens():
    rng = np.random.default_rng(4)
    ids, mask, _ = _rows(_random_lengths(rng, 2000, 128), 128, rng)
    out = _mask(ids, mask)
    masked, w = out.input_ids.numpy(), out.masked_lm_weights.numpy().astype(bool)
    at_slots = np.take_along_axis(masked, out.masked_lm_positions.numpy(), 1)[w]
    frac = (at_slots == SPECIAL.mask_id).mean()
    assert abs(frac - 0.85) < 5 * math.sqrt(0.85 * 0.15 / at_slots.size), frac
    kept = at_slots != SPECIAL.mask_id
    np.testing.assert_array_equal(at_slots[kept], out.masked_lm_ids.numpy()[w][kept])
    changed = masked != ids
    assert set(np.unique(masked[changed])) == {SPECIAL.mask_id}


def test_per_example_seeds_do_not_depend_on_the_batch_split():
    rng = np.random.default_rng(5)
    ids, mask, _ = _rows(_random_lengths(rng, 8, 64), 64, rng)
    whole = _mask(ids, mask, keys=_seeds(8))
    halves = [_mask(ids[i:i + 4], mask[i:i + 4], keys=_seeds(4, first=i)) for i in (0, 4)]
    for field in masking.MaskedInputs._fields:
        np.testing.assert_array_equal(
            getattr(whole, field).numpy(),
            np.concatenate([getattr(h, field).numpy() for h in halves]), err_msg=field)


def test_layer_takes_word_boundaries_from_the_vocab_or_the_batch():
    # Chinese-style input: every character its own token, words known to a segmenter.
    ids = np.array([[2, 10, 11, 12, 13, 14, 3]], np.int32)
    batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
             "word_starts": np.array([[1, 1, 0, 0, 1, 0, 1]], bool)}
    layer = ElectraMasking(SPECIAL, MaskingOptions(masking="whole_word", mask_prob=0.5,
                                                   max_predictions_per_seq=3))
    for step in range(20):
        positions = layer(batch, seed=step)["masked_lm_positions"].numpy()[0]
        # k = round(3.5) = 4 > 3 slots: N = 3 caps it; words {1,2,3} and {4,5}: one fits.
        assert positions.tolist() in ([1, 2, 3], [4, 5, 0])
    without = dict(batch)
    del without["word_starts"]
    with pytest.raises(ValueError, match="continuation_ids"):
        layer(without, seed=0)
    by_vocab = ElectraMasking(SPECIAL, MaskingOptions(
        masking="whole_word", mask_prob=1.0, max_predictions_per_seq=7,
        continuation_ids=[11, 12, 14]))
    out = by_vocab(without, seed=0)
    np.testing.assert_array_equal(out["masked_lm_positions"].numpy(), [[1, 2, 3, 4, 5, 0, 0]])
