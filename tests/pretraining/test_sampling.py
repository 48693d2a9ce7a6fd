"""Gumbel-max sampling by index and the discriminator input (checklist items 21, 22).

Every test runs with both Gumbel noise streams (`kernel_settings.SAMPLING_RNG` "philox" and "hash"), except
the two that pin one stream's exact formula.
"""


import numpy as np
import pytest
import tensorflow as tf

from electra_tf.modeling import kernel_settings
from electra_tf.pretraining import masking, sampling, seeds as seeds_lib
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=100, cls_id=101, sep_id=102, mask_id=103)
SEED = tf.constant([99, 1], tf.int32)


@pytest.fixture(autouse=True, params=kernel_settings.SAMPLING_RNG_CHOICES)
def sampling_rng(request):
    with kernel_settings.kernel_options(sampling_rng=request.param):
        yield request.param


def _seeds(batch_size, first=0):
    return seeds_lib.example_keys(SEED, first, batch_size, salt=seeds_lib.SAMPLING_SALT)


def _official_reference(logits, noise, temperature, disallow_ids=None):
    """The official formula with an explicit one-hot, in float32 numpy."""
    scores = logits.astype(np.float32) / np.float32(temperature)
    if disallow_ids is not None:
        one_hot = np.eye(logits.shape[-1], dtype=np.float32)[disallow_ids]
        scores = scores - np.float32(1000.0) * one_hot
    return np.argmax(scores + noise, axis=-1)


def test_gumbel_noise_formula_and_per_example_streams(sampling_rng):
    if sampling_rng != "philox":
        pytest.skip("the Philox stream's formula")
    keys = _seeds(3)
    noise = sampling.gumbel_noise([3, 4, 5], keys).numpy()
    assert noise.shape == (3, 4, 5) and noise.dtype == np.float32
    for b in range(3):
        u = tf.random.stateless_uniform([4, 5], tf.stack([keys[b], sampling._PHILOX_SALT]),
                                        alg="philox").numpy()
        expected = -np.log(-np.log(u + np.float32(1e-9)) + np.float32(1e-9))
        np.testing.assert_allclose(noise[b], expected, rtol=1e-5)  # TF's log vs numpy's
    assert not np.allclose(noise[0], noise[1])


def _fmix32(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))


def _hash_uniform_reference(keys, n, v):
    """The documented "hash" stream, in numpy: u[b, i, j] from example key b, slot i, id j."""
    keys = np.asarray(keys, np.int32).view(np.uint32)
    with np.errstate(over="ignore"):
        slot = _fmix32(keys[:, None] ^ (np.arange(n, dtype=np.uint32) * np.uint32(0x7FEB352D))[None])
        bits = _fmix32(slot[:, :, None] ^ (np.arange(v, dtype=np.uint32) * np.uint32(0xC2B2AE3D))[None, None])
    return ((bits >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -24)


def test_hash_gumbel_noise_formula(sampling_rng):
    if sampling_rng != "hash":
        pytest.skip("the hash stream's formula")
    keys = seeds_lib.example_keys(tf.constant([-7, 2 ** 31 - 1], tf.int32), 2 ** 31 - 10, 3,
                                  salt=seeds_lib.SAMPLING_SALT)  # negative seed, large index
    noise = sampling.gumbel_noise([3, 4, 50], keys).numpy()
    u = _hash_uniform_reference(keys.numpy(), 4, 50)
    assert noise.dtype == np.float32
    eps = np.float32(1e-9)
    np.testing.assert_allclose(noise, -np.log(-np.log(u + eps) + eps), rtol=1e-6, atol=1e-6)
    # every bit of a key matters: flipping one changes the noise of that example only
    for row, bit in ((0, 0), (1, 16), (2, 31)):
        other = keys.numpy().copy()
        other[row] ^= np.int32(-2 ** 31) if bit == 31 else np.int32(1 << bit)
        changed = sampling.gumbel_noise([3, 4, 50], tf.constant(other)).numpy()
        assert not np.isclose(changed[row], noise[row]).mean() > 0.05
        np.testing.assert_array_equal(np.delete(changed, row, 0), np.delete(noise, row, 0))


def test_noise_is_standard_gumbel_and_independent_across_slots_and_ids():
    noise = sampling.gumbel_noise([64, 19, 2000], _seeds(64)).numpy().astype(np.float64)
    euler_gamma, variance = 0.5772156649, np.pi ** 2 / 6
    n = noise.size
    assert abs(noise.mean() - euler_gamma) < 5 * np.sqrt(variance / n)
    assert abs(noise.var() / variance - 1) < 0.01
    # CDF exp(-exp(-g)) at a few quantiles
    for q in (0.01, 0.25, 0.5, 0.75, 0.99):
        g = -np.log(-np.log(q))
        assert abs((noise < g).mean() - q) < 5 * np.sqrt(q * (1 - q) / n), q
    # no correlation between neighbouring ids, neighbouring slots, or examples
    flat = noise - noise.mean()
    for a, b in ((flat[..., 1:], flat[..., :-1]), (flat[:, 1:], flat[:, :-1]), (flat[1:], flat[:-1])):
        corr = (a * b).mean() / flat.var()
        assert abs(corr) < 5 / np.sqrt(a.size), corr


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_disallow", [False, True])
def test_sample_with_given_noise_matches_official_formula_exactly(temperature, with_disallow):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 50)).astype(np.float32) * 3
    noise = sampling.gumbel_noise([3, 4, 50], _seeds(3)).numpy()
    # disallow the id that would win otherwise, so the penalty decides every slot
    disallow = np.argmax(logits / np.float32(temperature) + noise, -1).astype(np.int32) if with_disallow else None
    expected = _official_reference(logits, noise, temperature, disallow)
    got = sampling.sample_ids(tf.constant(logits), keys=None, temperature=temperature,
                              disallow_ids=None if disallow is None else tf.constant(disallow),
                              noise=tf.constant(noise))
    np.testing.assert_array_equal(got.numpy(), expected)
    if with_disallow:
        assert not (got.numpy() == disallow).any()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_disallow", [False, True])
def test_drawn_noise_is_gumbel_noise_of_the_seeds(temperature, with_disallow):
    # Logits of width 1: many near-ties, so any difference in the noise would show.
    logits = tf.random.stateless_normal([4, 3, 400], seed=[1, 2])
    seeds = _seeds(4)
    noise = sampling.gumbel_noise(tf.shape(logits), seeds)
    disallow = (tf.argmax(logits / temperature + noise, -1, output_type=tf.int32) if with_disallow
                else None)
    expected = _official_reference(logits.numpy(), noise.numpy(), temperature,
                                   None if disallow is None else disallow.numpy())
    got = sampling.sample_ids(logits, keys=seeds, temperature=temperature, disallow_ids=disallow)
    np.testing.assert_array_equal(got.numpy(), expected)
    graph = tf.function(lambda l, s: sampling.sample_ids(l, keys=s, temperature=temperature,
                                                         disallow_ids=disallow))(logits, seeds)
    np.testing.assert_array_equal(graph.numpy(), expected)


def test_tiny_temperature_gives_argmax_and_disallow_gives_runner_up():
    # Gaps of >= 0.1 between logits; at T = 1e-3 they become >= 100, far above the Gumbel noise
    # range (about [-3.1, 20.8] given the 1e-9 offsets).
    rng = np.random.default_rng(1)
    logits = np.stack([rng.permutation(30) * 0.1 for _ in range(6)]).reshape(2, 3, 30).astype(np.float32)
    top = np.argmax(logits, -1)
    second = np.argsort(logits, -1)[..., -2]
    got = sampling.sample_ids(tf.constant(logits), keys=_seeds(2), temperature=1e-3)
    np.testing.assert_array_equal(got.numpy(), top)
    got = sampling.sample_ids(tf.constant(logits), keys=_seeds(2), temperature=1e-3,
                              disallow_ids=tf.constant(top, tf.int32))
    np.testing.assert_array_equal(got.numpy(), second)


def test_samples_follow_softmax_of_logits_over_temperature():
    logits = np.array([0.0, 1.0, 2.0, -1.0, 0.5], np.float32)
    batch, n = 400, 50  # 20000 draws
    tiled = tf.constant(np.tile(logits, (batch, n, 1)))
    for temperature in (1.0, 2.0):
        ids = tf.function(lambda: sampling.sample_ids(tiled, keys=_seeds(batch), temperature=temperature))()
        freq = np.bincount(ids.numpy().ravel(), minlength=5) / (batch * n)
        p = np.exp(logits / temperature) / np.exp(logits / temperature).sum()
        sd = np.sqrt(p * (1 - p) / (batch * n))
        assert (np.abs(freq - p) < 5 * sd).all(), (temperature, freq, p)


def test_bfloat16_logits_sampled_in_float32():
    logits = tf.random.stateless_normal([2, 3, 20], seed=[3, 4])
    a = sampling.sample_ids(tf.cast(logits, tf.bfloat16), keys=_seeds(2))
    b = sampling.sample_ids(tf.cast(tf.cast(logits, tf.bfloat16), tf.float32), keys=_seeds(2))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert a.dtype == tf.int32


def test_samples_carry_no_gradient():
    logits = tf.Variable(tf.random.stateless_normal([2, 3, 10], seed=[5, 6]))
    with tf.GradientTape() as tape:
        ids = sampling.sample_ids(logits, keys=_seeds(2))
        fake = tf.reduce_sum(tf.cast(ids, tf.float32))
    assert tape.gradient(fake, logits) is None


def test_sampling_seed_invariance_under_batch_split():
    logits = tf.random.stateless_normal([8, 5, 64], seed=[7, 8])
    whole = sampling.sample_ids(logits, keys=_seeds(8))
    halves = [sampling.sample_ids(logits[i:i + 4], keys=_seeds(4, first=i)) for i in (0, 4)]
    np.testing.assert_array_equal(whole.numpy(), np.concatenate([h.numpy() for h in halves]))


# -------------------------------------------------------------------------- make_fake_inputs

def _masked_example():
    """Two rows, hand-built MaskedInputs with a duplicate slot and unused slots."""
    original = np.array([[101, 11, 12, 13, 14, 102, 0],
                         [101, 21, 22, 23, 24, 25, 102]], np.int32)
    positions = np.array([[1, 3, 4, 0], [2, 2, 5, 1]], np.int32)
    weights = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32)
    masked_ids = original.copy()
    masked_ids[0, [1, 3]] = SPECIAL.mask_id  # position 4 is one of the 15% kept unmasked
    masked_ids[1, [2, 5, 1]] = SPECIAL.mask_id
    return original, masking.MaskedInputs(
        input_ids=tf.constant(masked_ids),
        input_mask=tf.constant((original != 0).astype(np.int32)),
        segment_ids=tf.zeros_like(masked_ids),
        masked_lm_positions=tf.constant(positions),
        masked_lm_ids=tf.constant(np.take_along_axis(original, positions, 1) * weights.astype(np.int32)),
        masked_lm_weights=tf.constant(weights))


def _peaked_logits(targets, vocab=64, height=1.0):
    """Logits whose T -> 0 sample is `targets` [B, N]."""
    logits = np.zeros(targets.shape + (vocab,), np.float32)
    np.put_along_axis(logits, targets[..., None], height, -1)
    return tf.constant(logits)


def test_fake_inputs_exact_labels_and_duplicates():
    original, masked = _masked_example()
    # row 0: slot 0 samples the original (11) -> labelled real; slot 1 samples 40 at [MASK]ed
    #        position 3; slot 2 samples 41 at the UNMASKED position 4 (still replaced); slot 3 is
    #        unused (position 0) and ignored.
    # row 1: slots 0 and 1 hit position 2 with samples 30 and 33 -> floor((30 + 33) / 2) = 31;
    #        slot 2 samples 25 (the original at 5) -> real; slot 3 samples 50 at position 1.
    targets = np.array([[11, 40, 41, 63], [30, 33, 25, 50]], np.int32)
    for fn in (sampling.make_fake_inputs, tf.function(sampling.make_fake_inputs)):
        fake = fn(masked, _peaked_logits(targets), keys=_seeds(2), temperature=1e-3)
        np.testing.assert_array_equal(fake.sampled_ids.numpy(), targets)
        np.testing.assert_array_equal(fake.input_ids.numpy(), [[101, 11, 12, 40, 41, 102, 0],
                                                                [101, 50, 31, 23, 24, 25, 102]])
        np.testing.assert_array_equal(fake.is_fake.numpy(), [[0, 0, 0, 1, 1, 0, 0],
                                                              [0, 1, 1, 0, 0, 0, 0]])
    electric = sampling.make_fake_inputs(masked, _peaked_logits(targets), keys=_seeds(2), temperature=1e-3,
                                         electric_objective=True)
    np.testing.assert_array_equal(electric.is_fake.numpy(), [[0, 1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 1, 0]])


def test_disallow_correct_never_samples_the_original():
    original, masked = _masked_example()
    targets = masked.masked_lm_ids.numpy()  # logits peaked at the originals
    # height 5: without the disallow, each slot would draw its original with p = 0.7
    fake = sampling.make_fake_inputs(masked, _peaked_logits(targets, height=5.0), keys=_seeds(2),
                                     disallow_correct=True)
    used = masked.masked_lm_weights.numpy() > 0
    assert not (fake.sampled_ids.numpy()[used] == targets[used]).any()


def test_fake_inputs_statistics_labels_only_at_updated_positions():
    rng = np.random.default_rng(2)
    batch, length = 256, 32
    ids = rng.integers(200, 240, size=(batch, length)).astype(np.int32)  # ordinary ids 200..239
    ids[:, 0], ids[:, -1] = SPECIAL.cls_id, SPECIAL.sep_id
    input_mask = np.ones_like(ids)
    masked = masking.mask_inputs(
        tf.constant(ids), tf.constant(input_mask), tf.zeros_like(ids), special=SPECIAL, mask_prob=0.15,
        max_predictions_per_seq=5, keys=seeds_lib.example_keys(SEED, 0, batch, seeds_lib.MASKING_SALT))
    # a generator uniform over the ordinary ids 200..239 (so it never proposes [MASK] itself)
    logits = tf.constant(np.where(np.arange(240) >= 200, 0.0, -100.0), tf.float32)[None, None] * tf.ones([batch, 5, 1])
    fake = tf.function(lambda: sampling.make_fake_inputs(masked, logits, keys=_seeds(batch)))()
    fake_ids, is_fake = fake.input_ids.numpy(), fake.is_fake.numpy()
    np.testing.assert_array_equal(is_fake, (fake_ids != ids).astype(np.int32))  # label = differs
    selected = np.zeros_like(ids, bool)
    np.put_along_axis(selected, masked.masked_lm_positions.numpy(), masked.masked_lm_weights.numpy() > 0, 1)
    assert not (is_fake.astype(bool) & ~selected).any()
    assert (fake_ids[~selected] == ids[~selected]).all()
    assert SPECIAL.mask_id not in fake_ids[selected]  # no [MASK] left in the discriminator input
    # about 1/40 of the replaced positions draw their original id and are labelled real
    real_rate = 1 - is_fake[selected].mean()
    assert 0.5 / 40 < real_rate < 2 / 40, real_rate
