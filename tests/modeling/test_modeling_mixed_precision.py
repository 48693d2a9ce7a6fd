"""The ELECTRA layers under the mixed_bfloat16 policy: dtypes, numerical sanity, gradients."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead

CFG = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=64, embedding_size=16, max_position_embeddings=32)
GEN = dict(CFG, hidden_size=16, num_attention_heads=1, intermediate_size=32)


def _inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, size=(4, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    mask[3, 3:] = 0
    ids[mask == 0] = 0
    seg = np.zeros_like(ids)
    seg[:, 6:] = 1
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask), "segment_ids": tf.constant(seg)}


def _build(dtype):
    disc = ElectraEncoder(**CFG, dtype=dtype)
    gen = ElectraEncoder(**GEN, embeddings=disc.embeddings, dtype=dtype, name="generator")
    disc_head = DiscriminatorHead(32, dtype=dtype)
    gen_head = GeneratorHead(16, 50, dtype=dtype)
    inputs = _inputs()
    disc_head(disc(inputs)["sequence_output"])
    gen_head(gen(inputs)["sequence_output"][:, :3], disc.embeddings.word_embeddings.embeddings)
    return disc, gen, disc_head, gen_head


def _unique_weights(models):
    """All weights of the models in a fixed order, shared ones once."""
    seen = {}
    for m in models:
        for v in m.weights:
            seen.setdefault(id(v), v)
    return list(seen.values())


@pytest.fixture(scope="module")
def models():
    keras.utils.set_random_seed(0)
    fp32 = _build("float32")
    bf16 = _build("mixed_bfloat16")
    for a, b in zip(_unique_weights(fp32), _unique_weights(bf16)):
        assert a.path == b.path
        b.assign(a)
    return fp32, bf16


def _forward(disc, gen, disc_head, gen_head, training=False):
    inputs = _inputs()
    d = disc(inputs, training=training)
    g = gen(inputs, training=training)
    disc_logits = disc_head(d["sequence_output"])
    mlm_logits = gen_head(g["sequence_output"][:, 1:4], disc.embeddings.word_embeddings.embeddings)
    return d, disc_logits, mlm_logits


def test_dtypes_under_mixed_bfloat16(models):
    _, (disc, gen, disc_head, gen_head) = models
    for module in (disc, gen, disc_head, gen_head):
        assert module.compute_dtype == "bfloat16"
        assert all(v.dtype == "float32" for v in module.weights), module.name
    d, disc_logits, mlm_logits = _forward(disc, gen, disc_head, gen_head)
    assert d["sequence_output"].dtype == tf.bfloat16 and d["pooled_output"].dtype == tf.bfloat16
    assert disc_logits.dtype == tf.float32 and mlm_logits.dtype == tf.float32


def test_bfloat16_outputs_track_float32(models):
    (f_disc, f_gen, f_dh, f_gh), (b_disc, b_gen, b_dh, b_gh) = models
    fd, f_disc_logits, f_mlm = _forward(f_disc, f_gen, f_dh, f_gh)
    bd, b_disc_logits, b_mlm = _forward(b_disc, b_gen, b_dh, b_gh)
    seq_f = fd["sequence_output"].numpy()
    seq_b = tf.cast(bd["sequence_output"], tf.float32).numpy()
    assert np.all(np.isfinite(seq_b))
    # bfloat16 keeps 8 mantissa bits (relative step 2^-8); outputs are LayerNorm'd, O(1).
    assert np.abs(seq_b - seq_f).mean() < 0.02
    assert np.abs(seq_b - seq_f).max() < 0.15
    np.testing.assert_allclose(b_disc_logits.numpy(), f_disc_logits.numpy(), atol=0.1)
    np.testing.assert_allclose(b_mlm.numpy(), f_mlm.numpy(), atol=0.1)


def test_bfloat16_layer_norm_and_softmax_are_sane(models):
    _, (disc, *_rest) = models
    inputs = _inputs()
    emb = disc.embeddings(inputs["input_ids"], inputs["segment_ids"], training=False)
    emb = tf.cast(emb, tf.float32).numpy()  # gamma=1, beta=0: zero mean, unit variance per token
    np.testing.assert_allclose(emb.mean(-1), 0.0, atol=2e-2)
    np.testing.assert_allclose(emb.std(-1), 1.0, atol=2e-2)
    layer = disc.encoder_layers[0]
    x = tf.cast(tf.random.stateless_normal([4, 12, 32], seed=[1, 2]), tf.bfloat16)
    _, probs = layer(x, padding_mask=inputs["input_mask"], return_attention_scores=True)
    probs = tf.cast(probs, tf.float32).numpy()  # [B, heads, L, L]
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=2e-2)
    padded = inputs["input_mask"].numpy() == 0
    assert np.all(probs.transpose(0, 2, 1, 3)[np.broadcast_to(padded[:, None, None, :], (4, 12, 2, 12))] == 0)


def test_bfloat16_gradients_are_float32_and_finite(models):
    _, (disc, gen, disc_head, gen_head) = models
    variables = (disc.trainable_variables + gen.trainable_variables + disc_head.trainable_variables
                 + gen_head.trainable_variables)
    variables = list({id(v): v for v in variables}.values())
    with tf.GradientTape() as tape:
        _, disc_logits, mlm_logits = _forward(disc, gen, disc_head, gen_head, training=True)
        rtd = tf.nn.sigmoid_cross_entropy_with_logits(tf.zeros_like(disc_logits), disc_logits)
        mlm = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.ones([4, 3], tf.int32), mlm_logits)
        loss = tf.reduce_mean(rtd) + tf.reduce_mean(mlm)
    assert loss.dtype == tf.float32
    grads = tape.gradient(loss, variables)
    for v, g in zip(variables, grads):
        assert g is not None, v.path
        g = tf.convert_to_tensor(g)
        assert g.dtype == tf.float32 and bool(tf.reduce_all(tf.math.is_finite(g))), v.path


def test_global_policy_is_followed():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        encoder = ElectraEncoder(**CFG)
        head = DiscriminatorHead(32)
    finally:
        keras.config.set_dtype_policy("float32")
    out = encoder(_inputs())["sequence_output"]
    assert out.dtype == tf.bfloat16
    assert encoder.encoder_layers[0].compute_dtype == "bfloat16"
    assert head(out).dtype == tf.float32
