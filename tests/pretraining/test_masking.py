"""Masking: exact counts, candidates, 85/15 split, duplicates, unmask, seed invariance (items 9-14, 17)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.pretraining import masking, seeds as seeds_lib
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=100, cls_id=101, sep_id=102, mask_id=103)
SEED = tf.constant([2024, 7], tf.int32)


def _seeds(batch_size, first=0, seed=SEED):
    return seeds_lib.example_keys(seed, first, batch_size, salt=seeds_lib.MASKING_SALT)


def _batch(lengths, seq_length, seed=0, low=1000, high=30000):
    """[CLS] tokens [SEP] + padding rows with random ordinary ids."""
    rng = np.random.default_rng(seed)
    b = len(lengths)
    ids = np.zeros((b, seq_length), np.int32)
    mask = np.zeros((b, seq_length), np.int32)
    for r, n in enumerate(lengths):
        ids[r, :n] = rng.integers(low, high, size=n)
        ids[r, 0] = SPECIAL.cls_id
        ids[r, n - 1] = SPECIAL.sep_id
        mask[r, :n] = 1
    return ids, mask, (np.arange(seq_length)[None, :] >= 5).astype(np.int32) * mask


def _mask(ids, mask, seg, keys=None, **kw):
    kw.setdefault("mask_prob", 0.15)
    kw.setdefault("max_predictions_per_seq", 19)
    return masking.mask_inputs(
        tf.constant(ids), tf.constant(mask), tf.constant(seg), special=SPECIAL,
        keys=_seeds(len(ids)) if keys is None else keys, **kw)


@pytest.mark.parametrize("n,expected", [
    (2, 1), (6, 1), (10, 2), (30, 4), (50, 8), (70, 10), (110, 16), (127, 19), (128, 19)])
def test_num_to_predict_official_rounding(n, expected):
    input_mask = tf.constant([[1] * n + [0] * (128 - n)])
    assert int(masking.num_to_predict(input_mask, 0.15, 19)[0]) == expected


def test_weights_counts_and_unused_slots():
    lengths = [30, 10, 50, 128, 3]
    ids, mask, seg = _batch(lengths, 128)
    out = _mask(ids, mask, seg)
    k = out.masked_lm_weights.numpy().sum(axis=1)
    np.testing.assert_array_equal(k, [4, 2, 8, 19, 1])
    for r, kr in enumerate(k.astype(int)):
        np.testing.assert_array_equal(out.masked_lm_weights.numpy()[r], [1] * kr + [0] * (19 - kr))
        assert (out.masked_lm_positions.numpy()[r, kr:] == 0).all()
        assert (out.masked_lm_ids.numpy()[r, kr:] == 0).all()
        assert (out.masked_lm_positions.numpy()[r, :kr] > 0).all()  # never 0 when weight is 1
    assert out.masked_lm_positions.dtype == tf.int32 and out.masked_lm_ids.dtype == tf.int32
    assert out.masked_lm_weights.dtype == tf.float32 and out.input_ids.dtype == tf.int32
    # input_mask and segment_ids pass through unchanged; masked_lm_ids are the originals.
    np.testing.assert_array_equal(out.input_mask.numpy(), mask)
    np.testing.assert_array_equal(out.segment_ids.numpy(), seg)
    pos = out.masked_lm_positions.numpy()
    np.testing.assert_array_equal(
        out.masked_lm_ids.numpy(), np.take_along_axis(ids, pos, 1) * out.masked_lm_weights.numpy())


def test_mask_prob_1_single_candidate_exact_tensors():
    # Only one candidate (id 7): every used slot must draw it; k = min(N, 3) = 3.
    ids = np.array([[101, 7, 102, 0, 0]], np.int32)
    mask = np.array([[1, 1, 1, 0, 0]], np.int32)
    seg = np.zeros_like(ids)
    out = _mask(ids, mask, seg, mask_prob=1.0, max_predictions_per_seq=4, mask_token_prob=1.0)
    np.testing.assert_array_equal(out.masked_lm_positions.numpy(), [[1, 1, 1, 0]])
    np.testing.assert_array_equal(out.masked_lm_ids.numpy(), [[7, 7, 7, 0]])
    np.testing.assert_array_equal(out.masked_lm_weights.numpy(), [[1, 1, 1, 0]])
    np.testing.assert_array_equal(out.input_ids.numpy(), [[101, 103, 102, 0, 0]])
    kept = _mask(ids, mask, seg, mask_prob=1.0, max_predictions_per_seq=4, mask_token_prob=0.0)
    np.testing.assert_array_equal(kept.input_ids.numpy(), ids)


def test_mask_prob_1_without_replacement_masks_exactly_the_candidates():
    # [UNK] is a candidate; [CLS], [SEP], an existing [MASK] and padding are not.
    ids = np.array([[101, 100, 103, 55, 102, 66, 77, 102, 0, 0],
                    [101, 9, 102, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    mask = (ids != 0).astype(np.int32)
    seg = np.zeros_like(ids)
    fn = tf.function(lambda s: _mask(ids, mask, seg, keys=s, mask_prob=1.0, max_predictions_per_seq=10,
                                     mask_token_prob=1.0, with_replacement=False))
    out = fn(_seeds(2))
    # k = min(N, n_tokens, n_candidates): 4 candidates in row 0, 1 in row 1.
    np.testing.assert_array_equal(out.masked_lm_weights.numpy().sum(1), [4, 1])
    np.testing.assert_array_equal(np.sort(out.masked_lm_positions.numpy()[0, :4]), [1, 3, 5, 6])
    np.testing.assert_array_equal(out.masked_lm_positions.numpy()[1], [1] + [0] * 9)
    np.testing.assert_array_equal(
        out.input_ids.numpy(),
        [[101, 103, 103, 103, 102, 103, 103, 102, 0, 0], [101, 103, 102, 0, 0, 0, 0, 0, 0, 0]])


def test_more_slots_than_sequence_without_replacement():
    ids = np.array([[101, 5, 6, 102]], np.int32)
    out = _mask(ids, np.ones_like(ids), np.zeros_like(ids), mask_prob=1.0, max_predictions_per_seq=6,
                with_replacement=False)
    np.testing.assert_array_equal(out.masked_lm_weights.numpy(), [[1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(np.sort(out.masked_lm_positions.numpy()[0, :2]), [1, 2])


@pytest.mark.parametrize("with_replacement", [True, False])
def test_row_without_candidates_is_left_alone_without_nan(with_replacement):
    ids = np.array([[101, 102, 0, 0], [101, 103, 102, 0]], np.int32)
    mask = (ids != 0).astype(np.int32)
    out = _mask(ids, mask, np.zeros_like(ids), max_predictions_per_seq=3, with_replacement=with_replacement)
    np.testing.assert_array_equal(out.masked_lm_weights.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(out.masked_lm_positions.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(out.input_ids.numpy(), ids)


@pytest.mark.parametrize("with_replacement", [True, False])
def test_unmask_restores_original_ids(with_replacement):
    ids, mask, seg = _batch([128, 70, 12, 40], 128, seed=3)
    out = _mask(ids, mask, seg, with_replacement=with_replacement)
    assert (out.input_ids.numpy() != ids).any()
    np.testing.assert_array_equal(masking.unmask(out).numpy(), ids)
    np.testing.assert_array_equal(tf.function(masking.unmask)(out).numpy(), ids)


def test_fixed_seeds_are_deterministic_and_graph_matches_eager():
    ids, mask, seg = _batch([128, 64], 128)
    eager = _mask(ids, mask, seg)
    graph = tf.function(lambda: _mask(ids, mask, seg))()
    again = _mask(ids, mask, seg)
    other = _mask(ids, mask, seg, keys=_seeds(2, seed=tf.constant([1, 1], tf.int64)))
    for a, b in ((eager, graph), (eager, again)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert (eager.masked_lm_positions.numpy() != other.masked_lm_positions.numpy()).any()


@pytest.mark.parametrize("with_replacement", [True, False])
def test_per_example_seed_invariance_under_batch_split(with_replacement):
    ids, mask, seg = _batch([128, 100, 90, 30, 128, 17, 64, 50], 128, seed=5)
    whole = _mask(ids, mask, seg, keys=_seeds(8), with_replacement=with_replacement)
    halves = [_mask(ids[i:i + 4], mask[i:i + 4], seg[i:i + 4], keys=_seeds(4, first=i),
                    with_replacement=with_replacement) for i in (0, 4)]
    for field in masking.MaskedInputs._fields:
        np.testing.assert_array_equal(
            getattr(whole, field).numpy(),
            np.concatenate([getattr(h, field).numpy() for h in halves]), err_msg=field)


# ---------------------------------------------------------------- statistical tests (fixed seeds)

def _many(batch_size, length, **kw):
    """A batch of identical rows: [CLS] + (length - 2) candidates + [SEP], then masked."""
    ids, mask, seg = _batch([length] * batch_size, length, seed=11)
    # Graph mode: eagerly, the per-example map_fn is a Python loop (slow for thousands of rows).
    return ids, tf.function(lambda: _mask(ids, mask, seg, keys=_seeds(batch_size), **kw))()


def test_positions_uniform_over_candidates_with_replacement():
    # 3000 rows x 19 slots over 30 candidates (positions 1..30): chi-square vs uniform.
    _, out = _many(3000, 32, mask_prob=1.0, max_predictions_per_seq=19)
    pos = out.masked_lm_positions.numpy()
    assert pos.min() == 1 and pos.max() == 30  # never [CLS] (0) or [SEP] (31)
    counts = np.bincount(pos.ravel(), minlength=32)[1:31]
    expected = pos.size / 30
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 70.0, chi2  # 29 dof: p(chi2 > 70) ~ 3e-5


def test_duplicate_rate_matches_independent_draws():
    # 19 draws with replacement over 30 candidates: E[distinct] = 30 * (1 - (29/30)^19).
    _, out = _many(3000, 32, mask_prob=1.0, max_predictions_per_seq=19)
    distinct = np.array([len(set(r)) for r in out.masked_lm_positions.numpy()])
    expected = 30 * (1 - (29 / 30) ** 19)
    # per-row sd of the distinct count is ~1.6, so the mean's sd is ~0.03
    assert abs(distinct.mean() - expected) < 0.15, (distinct.mean(), expected)


def test_no_duplicates_without_replacement_and_still_uniform():
    _, out = _many(3000, 32, mask_prob=1.0, max_predictions_per_seq=19, with_replacement=False)
    pos = out.masked_lm_positions.numpy()
    assert all(len(set(r)) == 19 for r in pos)
    counts = np.bincount(pos.ravel(), minlength=32)[1:31]
    expected = pos.size / 30
    # Each row contributes 19 distinct of 30, so counts are less variable than multinomial;
    # the multinomial threshold is conservative here.
    assert ((counts - expected) ** 2 / expected).sum() < 70.0


def test_85_15_split_and_no_random_tokens():
    ids, out = _many(2000, 128, with_replacement=False)
    masked = out.input_ids.numpy()
    pos = out.masked_lm_positions.numpy()
    w = out.masked_lm_weights.numpy().astype(bool)
    at_slots = np.take_along_axis(masked, pos, 1)[w]
    originals = out.masked_lm_ids.numpy()[w]
    frac_mask = (at_slots == SPECIAL.mask_id).mean()
    n = at_slots.size  # 38000 slots: sd of the fraction ~0.0018
    assert abs(frac_mask - 0.85) < 5 * math.sqrt(0.85 * 0.15 / n), frac_mask
    # every other selected slot keeps exactly its original token: no random replacement
    np.testing.assert_array_equal(at_slots[at_slots != SPECIAL.mask_id], originals[at_slots != SPECIAL.mask_id])
    # outside the selected positions nothing changes
    changed = masked != ids
    selected = np.zeros_like(changed)
    np.put_along_axis(selected, pos, w, 1)
    assert not (changed & ~selected).any()
    assert set(np.unique(masked[changed])) == {SPECIAL.mask_id}


def test_position_drawn_twice_is_masked_if_either_draw_passes():
    # One candidate and k draws that all hit it: it stays unmasked only if all k draws fail,
    # so the [MASK] rate is 1 - 0.15^k (k = 3: 0.996625; k = 2: 0.9775).
    for row, mask_prob, k, rows in (([101, 7, 102], 1.0, 3, 4000), ([101, 7, 102, 0], 0.5, 2, 4000)):
        ids = np.tile(np.array([row], np.int32), (rows, 1))
        mask = (ids != 0).astype(np.int32)
        out = tf.function(lambda: _mask(ids, mask, np.zeros_like(ids), mask_prob=mask_prob,
                                        max_predictions_per_seq=k))()
        # k = 2 on 3 tokens at p = 0.5: round(1.5) = 2 (half to even)
        assert (out.masked_lm_weights.numpy().sum(1) == k).all()
        assert (out.masked_lm_positions.numpy()[:, :k] == 1).all()
        rate = (out.input_ids.numpy()[:, 1] == SPECIAL.mask_id).mean()
        p = 1 - 0.15 ** k
        assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / rows), (k, rate)
