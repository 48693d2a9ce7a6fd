"""MLM and RTD losses: exact values, float32 math, global-batch averaging (items 20, 24, 25)."""

import numpy as np
import tensorflow as tf

from electra_tf.pretraining import losses, masking, sampling, seeds as seeds_lib
from electra_tf.pretraining.tensor_ops import gather_positions
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=100, cls_id=101, sep_id=102, mask_id=103)


def _log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _sigmoid_ce(logits, labels):
    x = logits.astype(np.float64)
    return np.maximum(x, 0) - x * labels + np.log1p(np.exp(-np.abs(x)))


def test_mlm_loss_exact_with_duplicates_and_unused_slots():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 11)).astype(np.float32) * 2
    # row 0: slots 1 and 2 are a duplicate position (same target) and count twice; slot 3 unused.
    ids = np.array([[3, 7, 7, 0], [1, 2, 3, 4]], np.int32)
    weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    nll = -np.take_along_axis(_log_softmax(logits), ids[..., None], -1)[..., 0]
    expected = (weights * nll).sum() / (weights.sum() + 1e-6)
    for fn in (losses.mlm_loss, tf.function(losses.mlm_loss)):
        out = fn(tf.constant(logits), tf.constant(ids), tf.constant(weights))
        np.testing.assert_allclose(out.per_position_nll.numpy(), nll, rtol=1e-5)
        np.testing.assert_allclose(out.loss.numpy(), expected, rtol=1e-6)
        np.testing.assert_array_equal(out.predictions.numpy(), logits.argmax(-1))
        assert out.loss.dtype == tf.float32 and out.predictions.dtype == tf.int32


def test_mlm_loss_denominator_epsilon():
    logits = tf.constant([[[0.0, np.log(3.0)]]], tf.float32)  # p(target 0) = 1/4
    one = losses.mlm_loss(logits, tf.constant([[0]]), tf.constant([[1.0]])).loss.numpy()
    np.testing.assert_allclose(one, np.log(4.0) / (1 + 1e-6), rtol=2e-7)
    assert one < np.float32(np.log(4.0))  # the +1e-6 is visible in float32
    zero = losses.mlm_loss(logits, tf.constant([[0]]), tf.constant([[0.0]])).loss.numpy()
    assert zero == 0.0  # no used slot: 0 / 1e-6, not NaN


def test_mlm_gradient_matches_hand_formula():
    rng = np.random.default_rng(1)
    logits = tf.Variable(rng.normal(size=(2, 3, 5)).astype(np.float32))
    ids = np.array([[0, 1, 2], [3, 4, 0]], np.int32)
    w = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    with tf.GradientTape() as tape:
        loss = losses.mlm_loss(logits, tf.constant(ids), tf.constant(w)).loss
    grad = tape.gradient(loss, logits).numpy()
    p = np.exp(_log_softmax(logits.numpy()))
    expected = (p - np.eye(5)[ids]) * w[..., None] / (w.sum() + 1e-6)
    np.testing.assert_allclose(grad, expected, atol=1e-6)


def test_rtd_loss_exact_per_example_probs_preds():
    logits = np.array([[2.0, -1.0, 0.0, 3.0, 5.0], [-0.5, 0.25, 4.0, 0.0, -2.0]], np.float32)
    labels = np.array([[0, 1, 0, 1, 1], [1, 0, 1, 0, 0]], np.int32)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], np.int32)
    ce = _sigmoid_ce(logits, labels) * mask
    for fn in (losses.rtd_loss, tf.function(losses.rtd_loss)):
        out = fn(tf.constant(logits), tf.constant(labels), tf.constant(mask))
        np.testing.assert_allclose(out.loss.numpy(), ce.sum() / (mask.sum() + 1e-6), rtol=1e-6)
        np.testing.assert_allclose(out.per_example_loss.numpy(), ce.sum(1) / (mask.sum(1) + 1e-6), rtol=1e-6)
        np.testing.assert_allclose(out.probs.numpy(), 1 / (1 + np.exp(-logits)), rtol=1e-6)
        # preds = 1 iff logit > 0; logit exactly 0 gives 0 (official round-half-even of 0.5)
        np.testing.assert_array_equal(out.preds.numpy(), [[1, 0, 0, 1, 1], [0, 1, 1, 0, 0]])
        assert out.preds.dtype == tf.int32


def test_rtd_loss_is_token_mean_over_batch_not_mean_of_sequence_means():
    labels = tf.zeros([2, 4], tf.int32)
    # row 0: 4 tokens costing ~10 each; row 1: 1 token costing log 2. Token mean over the batch is
    # (40 + 0.69) / 5, a mean of sequence means would be (10 + 0.69) / 2.
    logits = tf.constant([[10.0, 10.0, 10.0, 10.0], [0.0, 0.0, 0.0, 0.0]])
    mask = tf.constant([[1, 1, 1, 1], [1, 0, 0, 0]])
    out = losses.rtd_loss(logits, labels, mask)
    ce0 = _sigmoid_ce(np.float32(10.0), 0)
    np.testing.assert_allclose(out.loss.numpy(), (4 * ce0 + np.log(2)) / (5 + 1e-6), rtol=1e-6)


def test_losses_are_float32_from_bfloat16_logits():
    rng = np.random.default_rng(2)
    mlm_logits = tf.cast(tf.constant(rng.normal(size=(2, 3, 7)).astype(np.float32)), tf.bfloat16)
    ids, w = tf.constant([[1, 2, 3], [4, 5, 6]]), tf.ones([2, 3])
    out = losses.mlm_loss(mlm_logits, ids, w)
    ref = losses.mlm_loss(tf.cast(mlm_logits, tf.float32), ids, w)
    assert out.loss.dtype == tf.float32 and out.per_position_nll.dtype == tf.float32
    assert out.loss.numpy() == ref.loss.numpy()  # same math, all in float32
    disc_logits = tf.cast(tf.constant(rng.normal(size=(2, 5)).astype(np.float32)), tf.bfloat16)
    r = losses.rtd_loss(disc_logits, tf.ones([2, 5], tf.int32), tf.ones([2, 5], tf.int32))
    r32 = losses.rtd_loss(tf.cast(disc_logits, tf.float32), tf.ones([2, 5], tf.int32), tf.ones([2, 5], tf.int32))
    assert r.loss.dtype == r.probs.dtype == r.per_example_loss.dtype == tf.float32
    assert r.loss.numpy() == r32.loss.numpy()


def test_global_sum_is_identity_without_strategy():
    x = tf.constant(3.5)
    assert losses.global_sum(x) is x


# ------------------------------------------------------- two replicas == one device, same global batch

VOCAB, HIDDEN, LENGTH, N_SLOTS, GLOBAL_BATCH = 120, 8, 24, 4, 8
DISC_WEIGHT = 50.0  # official default


def _global_batch():
    rng = np.random.default_rng(3)
    ids = rng.integers(104, VOCAB, size=(GLOBAL_BATCH, LENGTH)).astype(np.int32)
    lengths = rng.integers(6, LENGTH + 1, size=GLOBAL_BATCH)
    mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
    ids = ids * mask
    ids[:, 0] = SPECIAL.cls_id
    ids[np.arange(GLOBAL_BATCH), lengths - 1] = SPECIAL.sep_id
    return ids, mask


def _objective(table, disc_vector, ids, mask, step_seed):
    """mask -> toy generator -> sample -> toy discriminator -> gen + 50 * disc, for one (local) batch."""
    local_batch = tf.shape(ids)[0]
    first = seeds_lib.replica_example_offset(local_batch)
    masked = masking.mask_inputs(
        ids, mask, tf.zeros_like(ids), special=SPECIAL, mask_prob=0.15, max_predictions_per_seq=N_SLOTS,
        keys=seeds_lib.example_keys(step_seed, first, local_batch, seeds_lib.MASKING_SALT))
    hidden = gather_positions(tf.gather(table, masked.input_ids), masked.masked_lm_positions)
    mlm_logits = tf.einsum("bnh,vh->bnv", hidden, table)
    mlm = losses.mlm_loss(mlm_logits, masked.masked_lm_ids, masked.masked_lm_weights)
    fake = sampling.make_fake_inputs(
        masked, mlm_logits, keys=seeds_lib.example_keys(step_seed, first, local_batch, seeds_lib.SAMPLING_SALT))
    disc_logits = tf.einsum("blh,h->bl", tf.gather(table, fake.input_ids), disc_vector)
    rtd = losses.rtd_loss(disc_logits, fake.is_fake, mask)
    return mlm.loss + DISC_WEIGHT * rtd.loss, masked.masked_lm_positions, fake.sampled_ids


def _init_values():
    rng = np.random.default_rng(4)
    return (rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32) * 0.5,
            rng.normal(size=(HIDDEN,)).astype(np.float32))


def test_two_replica_mirrored_loss_and_gradients_equal_one_device(mirrored_strategy):
    ids, mask = _global_batch()
    step_seed = tf.constant([17, 3], tf.int64)
    table0, vec0 = _init_values()

    # one device, whole global batch
    table, vec = tf.Variable(table0), tf.Variable(vec0)
    with tf.GradientTape() as tape:
        loss_1, positions_1, sampled_1 = tf.function(_objective)(table, vec, tf.constant(ids), tf.constant(mask),
                                                                 step_seed)
    grads_1 = tape.gradient(loss_1, [table, vec])

    # two replicas, each holding half of the global batch
    strategy = mirrored_strategy  # shared: see tests/conftest.py
    with strategy.scope():
        m_table, m_vec = tf.Variable(table0), tf.Variable(vec0)
    half = GLOBAL_BATCH // 2

    def shard(ctx):
        r = ctx.replica_id_in_sync_group
        return tf.constant(ids[r * half:(r + 1) * half]), tf.constant(mask[r * half:(r + 1) * half])

    local = strategy.experimental_distribute_values_from_function(shard)

    @tf.function
    def step(local):
        def replica_fn(batch):
            with tf.GradientTape() as t:
                loss, positions, sampled = _objective(m_table, m_vec, batch[0], batch[1], step_seed)
            g_table, g_vec = t.gradient(loss, [m_table, m_vec])
            return loss, tf.convert_to_tensor(g_table), g_vec, positions, sampled
        loss, g_table, g_vec, positions, sampled = strategy.run(replica_fn, args=(local,))
        sum_ = tf.distribute.ReduceOp.SUM
        return (strategy.reduce(sum_, loss, axis=None), strategy.reduce(sum_, g_table, axis=None),
                strategy.reduce(sum_, g_vec, axis=None), strategy.gather(positions, axis=0),
                strategy.gather(sampled, axis=0))

    loss_2, g_table_2, g_vec_2, positions_2, sampled_2 = step(local)
    # the same examples got the same masks and samples on either layout
    np.testing.assert_array_equal(positions_2.numpy(), positions_1.numpy())
    np.testing.assert_array_equal(sampled_2.numpy(), sampled_1.numpy())
    np.testing.assert_allclose(loss_2.numpy(), loss_1.numpy(), rtol=1e-6)
    np.testing.assert_allclose(g_table_2.numpy(), tf.convert_to_tensor(grads_1[0]).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g_vec_2.numpy(), grads_1[1].numpy(), rtol=1e-5, atol=1e-7)
    # and the per-replica values are contributions, not replica means: each is below the total
    per_replica = strategy.experimental_local_results(
        strategy.run(tf.function(lambda b: _objective(m_table, m_vec, b[0], b[1], step_seed)[0]), args=(local,)))
    np.testing.assert_allclose(sum(float(x) for x in per_replica), loss_1.numpy(), rtol=1e-6)
