"""The ELECTRA layers under tf.distribute.MirroredStrategy on two logical CPU devices."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead

CFG = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
           intermediate_size=32, embedding_size=8, max_position_embeddings=32)
GEN = dict(CFG, hidden_size=8, num_attention_heads=1, intermediate_size=16)
BATCH = 4


@pytest.fixture
def strategy(mirrored_strategy):
    """conftest's session-wide two-replica strategy (one per process avoids collective clashes)."""
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs the two logical CPU devices set up by conftest.py")
    return mirrored_strategy


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, size=(BATCH, 10)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    seg = np.zeros_like(ids)
    seg[:, 5:] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": seg,
            "masked_lm_positions": np.tile(np.array([[1, 2, 3]], np.int32), (BATCH, 1)),
            "masked_lm_ids": rng.integers(1, 50, size=(BATCH, 3)).astype(np.int32)}


def _build():
    disc = ElectraEncoder(**CFG)
    gen = ElectraEncoder(**GEN, embeddings=disc.embeddings, name="generator")
    disc_head = DiscriminatorHead(16)
    disc_head.build((None, None, 16))
    gen_head = GeneratorHead(8, 50)
    gen_head.build((None, None, 8))
    return disc, gen, disc_head, gen_head


def _per_example_loss(models, batch, training):
    """A small ELECTRA-like objective, per example: [batch] float32."""
    disc, gen, disc_head, gen_head = models
    enc_inputs = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}
    hidden = gen(enc_inputs, training=training)["sequence_output"]
    gathered = tf.gather(hidden, batch["masked_lm_positions"], batch_dims=1)
    mlm_logits = gen_head(gathered, disc.embeddings.word_embeddings.embeddings)
    mlm = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(batch["masked_lm_ids"], mlm_logits), -1)
    disc_logits = disc_head(disc(enc_inputs, training=training)["sequence_output"])
    labels = tf.cast(enc_inputs["input_ids"] % 2, tf.float32)
    mask = tf.cast(enc_inputs["input_mask"], tf.float32)
    rtd = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels, disc_logits) * mask, -1)
    return mlm + rtd


def _variables(models):
    seen = {}
    for m in models:
        for v in m.trainable_variables:
            seen.setdefault(id(v), v)
    return list(seen.values())


def _unique_weights(models):
    """All weights of the models in a fixed order, shared ones once."""
    seen = {}
    for m in models:
        for v in m.weights:
            seen.setdefault(id(v), v)
    return list(seen.values())


def test_two_replica_forward_backward_matches_one_device(strategy):
    keras.utils.set_random_seed(3)
    single = _build()
    with strategy.scope():
        mirrored = _build()
        optimizer = keras.optimizers.SGD(0.1)
        variables = _variables(mirrored)
        optimizer.build(variables)
    for a, b in zip(_unique_weights(single), _unique_weights(mirrored)):
        b.assign(a)
    table = mirrored[0].embeddings.word_embeddings.embeddings
    assert isinstance(table.value, tf.distribute.DistributedValues)

    batch = _batch()
    single_vars = _variables(single)
    with tf.GradientTape() as tape:
        single_loss = tf.reduce_sum(_per_example_loss(single, batch, training=False)) / BATCH
    single_grads = tape.gradient(single_loss, single_vars)

    dataset = tf.data.Dataset.from_tensors(batch).unbatch().batch(BATCH)
    dist_batch = next(iter(strategy.experimental_distribute_dataset(dataset)))

    @tf.function
    def step(inputs, training):
        def replica_fn(inputs):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(_per_example_loss(mirrored, inputs, training)) / BATCH
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica_fn, args=(inputs,)), axis=None)

    before = [v.numpy() for v in variables]
    loss = step(dist_batch, False)
    np.testing.assert_allclose(loss.numpy(), single_loss.numpy(), rtol=1e-5)
    # SGD: new = old - 0.1 * all-reduced gradient, identical on both replicas.
    for v, old, g in zip(variables, before, single_grads):
        g = tf.convert_to_tensor(g).numpy()
        copies = [c.numpy() for c in v.value.values]
        np.testing.assert_array_equal(copies[0], copies[1])
        np.testing.assert_allclose(copies[0], old - 0.1 * g, atol=1e-6, err_msg=v.path)

    loss = step(dist_batch, True)  # training mode (dropout) also runs under the strategy
    assert np.isfinite(loss.numpy())
    for v in variables:
        copies = [c.numpy() for c in v.value.values]
        np.testing.assert_array_equal(copies[0], copies[1])
