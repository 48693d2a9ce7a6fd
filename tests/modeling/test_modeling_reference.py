"""Numerical parity of the keras / keras-hub based layers with the official BERT/ELECTRA math.

The reference below is an independent float64 numpy transcription of spec section 7 (official
model/modeling.py) and 5.3 / 5.5 (heads). Weights are drawn in the official layout ([in, out]
kernels, [H, H] attention kernels) and copied into the Keras variables through the name mapping
documented in electra_tf/modeling/encoder.py, so these tests also check that mapping.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.modeling import kernel_settings
from electra_tf.modeling.embeddings import ElectraEmbeddings
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead

ATOL = 1e-5
_erf = np.vectorize(math.erf)


# --- Independent reference (official math, float64) ---------------------------------------------

def ref_layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def ref_gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def ref_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def ref_encoder(w, cfg, input_ids, input_mask, segment_ids, act=ref_gelu, mask_value=-10000.0):
    """Official BertModel forward in eval mode. Returns (sequence_output, per-layer outputs)."""
    batch, length = input_ids.shape
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    size = hidden // heads
    x = (w["embeddings/word_embeddings"][input_ids] + w["embeddings/token_type_embeddings"][segment_ids]
         + w["embeddings/position_embeddings"][:length][None])
    x = ref_layer_norm(x, w["embeddings/LayerNorm/gamma"], w["embeddings/LayerNorm/beta"])
    if "embeddings_project/kernel" in w:
        x = x @ w["embeddings_project/kernel"] + w["embeddings_project/bias"]
    # Official: attention mask from input_mask only, broadcast over queries; adder (1-m)*-10000.
    adder = (1.0 - input_mask[:, None, None, :].astype(np.float64)) * mask_value

    def split(t):
        return t.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder/layer_{i}/"
        q = split(x @ w[p + "attention/self/query/kernel"] + w[p + "attention/self/query/bias"])
        k = split(x @ w[p + "attention/self/key/kernel"] + w[p + "attention/self/key/bias"])
        v = split(x @ w[p + "attention/self/value/kernel"] + w[p + "attention/self/value/bias"])
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size) + adder
        context = (ref_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        attn = context @ w[p + "attention/output/dense/kernel"] + w[p + "attention/output/dense/bias"]
        a = ref_layer_norm(attn + x, w[p + "attention/output/LayerNorm/gamma"],
                           w[p + "attention/output/LayerNorm/beta"])
        h = act(a @ w[p + "intermediate/dense/kernel"] + w[p + "intermediate/dense/bias"])
        out = h @ w[p + "output/dense/kernel"] + w[p + "output/dense/bias"]
        x = ref_layer_norm(out + a, w[p + "output/LayerNorm/gamma"], w[p + "output/LayerNorm/beta"])
    return x


def official_weights(cfg, rng, scale=0.3):
    """Random weights in the official checkpoint layout (spec 5.9), large enough to matter."""
    V, E, H, I = cfg["vocab_size"], cfg["embedding_size"], cfg["hidden_size"], cfg["intermediate_size"]
    P, T = cfg["max_position_embeddings"], cfg["type_vocab_size"]

    def n(*shape):
        return rng.normal(0.0, scale, size=shape)

    w = {
        "embeddings/word_embeddings": n(V, E), "embeddings/token_type_embeddings": n(T, E),
        "embeddings/position_embeddings": n(P, E),
        "embeddings/LayerNorm/gamma": 1 + n(E), "embeddings/LayerNorm/beta": n(E),
    }
    if E != H:
        w["embeddings_project/kernel"] = n(E, H)
        w["embeddings_project/bias"] = n(H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder/layer_{i}/"
        for name in ("query", "key", "value"):
            w[p + f"attention/self/{name}/kernel"] = n(H, H)
            w[p + f"attention/self/{name}/bias"] = n(H)
        w[p + "attention/output/dense/kernel"] = n(H, H)
        w[p + "attention/output/dense/bias"] = n(H)
        w[p + "attention/output/LayerNorm/gamma"] = 1 + n(H)
        w[p + "attention/output/LayerNorm/beta"] = n(H)
        w[p + "intermediate/dense/kernel"] = n(H, I)
        w[p + "intermediate/dense/bias"] = n(I)
        w[p + "output/dense/kernel"] = n(I, H)
        w[p + "output/dense/bias"] = n(H)
        w[p + "output/LayerNorm/gamma"] = 1 + n(H)
        w[p + "output/LayerNorm/beta"] = n(H)
    return w


def keras_name(official: str) -> str:
    """Official variable name (without scope) -> Keras path (without the encoder's name)."""
    if official.startswith("embeddings/"):
        rest = official[len("embeddings/"):]
        return "embeddings/" + (rest + "/embeddings" if not rest.startswith("LayerNorm") else rest)
    if official.startswith("embeddings_project/"):
        return official
    _, layer, rest = official.split("/", 2)
    table = {
        "attention/self/query": "self_attention_layer/query",
        "attention/self/key": "self_attention_layer/key",
        "attention/self/value": "self_attention_layer/value",
        "attention/output/dense": "self_attention_layer/attention_output",
        "attention/output/LayerNorm": "self_attention_layer_norm",
        "intermediate/dense": "feedforward_intermediate_dense",
        "output/dense": "feedforward_output_dense",
        "output/LayerNorm": "feedforward_layer_norm",
    }
    module, leaf = rest.rsplit("/", 1)
    return f"{layer}/{table[module]}/{leaf}"


def load_official(encoder, w):
    """Copies official-layout weights into an ElectraEncoder (reshaping attention kernels)."""
    by_path = {v.path.split("/", 1)[1]: v for v in encoder.weights}
    assert len(by_path) == len(w) == len(encoder.weights)
    for name, value in w.items():
        var = by_path.pop(keras_name(name))
        var.assign(np.asarray(value, np.float32).reshape(var.shape))
    assert not by_path


CFG = dict(vocab_size=30, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
           intermediate_size=20, embedding_size=6, max_position_embeddings=16, type_vocab_size=2)


def batch_with_padding(rng, batch=3, length=7, vocab=30, lengths=(7, 4, 2)):
    ids = rng.integers(1, vocab, size=(batch, length)).astype(np.int32)
    mask = (np.arange(length)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    seg = np.zeros((batch, length), np.int32)
    seg[0, 4:] = 1
    seg[1, 2:4] = 1
    ids[mask == 0] = 0
    return ids, mask, seg


def as_inputs(ids, mask, seg):
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask), "segment_ids": tf.constant(seg)}


@pytest.fixture(params=["projected", "square"])
def loaded(request):
    cfg = dict(CFG) if request.param == "projected" else dict(CFG, embedding_size=12)
    rng = np.random.default_rng(7)
    w = official_weights(cfg, rng)
    encoder = ElectraEncoder(**cfg)
    load_official(encoder, w)
    return cfg, w, encoder


# --- Encoder parity (checklist 28) ---------------------------------------------------------------

def test_encoder_matches_official_reference_with_padding(loaded):
    cfg, w, encoder = loaded
    ids, mask, seg = batch_with_padding(np.random.default_rng(1))
    expected = ref_encoder(w, cfg, ids, mask, seg)
    out = encoder(as_inputs(ids, mask, seg), training=False)
    # Every position, padded queries included (official computes them too).
    np.testing.assert_allclose(out["sequence_output"].numpy(), expected, atol=ATOL, rtol=0)
    np.testing.assert_array_equal(out["pooled_output"].numpy(), out["sequence_output"].numpy()[:, 0])
    assert out["sequence_output"].dtype == tf.float32


@pytest.mark.parametrize("kernels", kernel_settings.KERNEL_CHOICES)
def test_training_call_without_dropout_matches_official_reference(kernels):
    # Training calls run other kernels than the eval call above (modeling/fused.py: XLA
    # elementwise clusters by default); with dropout off they compute the official function too.
    cfg = dict(CFG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    w = official_weights(CFG, np.random.default_rng(7))
    ids, mask, seg = batch_with_padding(np.random.default_rng(1))
    expected = ref_encoder(w, cfg, ids, mask, seg)
    with kernel_settings.kernel_options(kernels, "hash"):
        encoder = ElectraEncoder(**cfg)
        load_official(encoder, w)
        out = encoder(as_inputs(ids, mask, seg), training=True)["sequence_output"].numpy()
    np.testing.assert_allclose(out, expected, atol=ATOL, rtol=0)


def test_reference_is_sensitive_to_gelu_form_and_mask(loaded):
    """The parity test above would catch a tanh GELU or a missing padding mask."""
    cfg, w, encoder = loaded
    ids, mask, seg = batch_with_padding(np.random.default_rng(1))
    out = encoder(as_inputs(ids, mask, seg), training=False)["sequence_output"].numpy()
    tanh = ref_encoder(w, cfg, ids, mask, seg, act=ref_gelu_tanh)
    assert np.abs(out - tanh).max() > 10 * ATOL
    unmasked = ref_encoder(w, cfg, ids, np.ones_like(mask), seg)
    real = mask.astype(bool)
    assert np.abs(out[real] - unmasked[real]).max() > 100 * ATOL


def test_padding_invariance(loaded):
    _, _, encoder = loaded
    rng = np.random.default_rng(3)
    ids, mask, seg = batch_with_padding(rng)
    base = encoder(as_inputs(ids, mask, seg))["sequence_output"].numpy()
    junk_ids, junk_seg = ids.copy(), seg.copy()
    pad = mask == 0
    junk_ids[pad] = rng.integers(1, 30, size=pad.sum())
    junk_seg[pad] = 1
    other = encoder(as_inputs(junk_ids, mask, junk_seg))["sequence_output"].numpy()
    np.testing.assert_allclose(other[~pad], base[~pad], atol=1e-6, rtol=0)
    assert np.abs(other[pad] - base[pad]).max() > 1e-3  # padded queries did see their new ids
    # Extra padding columns change nothing at real positions either.
    longer = [np.pad(t, ((0, 0), (0, 3))) for t in (ids, mask, seg)]
    wide = encoder(as_inputs(*longer))["sequence_output"].numpy()
    np.testing.assert_allclose(wide[:, :7][~pad], base[~pad], atol=1e-6, rtol=0)


def test_embeddings_match_official_and_skip_projection():
    rng = np.random.default_rng(11)
    emb = ElectraEmbeddings(30, 6, max_position_embeddings=16, hidden_dropout_prob=0.1)
    emb.build()
    tables = [rng.normal(size=s) for s in ((30, 6), (2, 6), (16, 6))]
    gamma, beta = 1 + rng.normal(size=6), rng.normal(size=6)
    for var, value in zip((emb.word_embeddings.embeddings, emb.token_type_embeddings.embeddings,
                           emb.position_embeddings.position_embeddings, emb.layer_norm.gamma,
                           emb.layer_norm.beta), tables + [gamma, beta]):
        var.assign(value.astype(np.float32))
    ids, _, seg = batch_with_padding(rng)
    expected = ref_layer_norm(tables[0][ids] + tables[1][seg] + tables[2][:7][None], gamma, beta)
    out = emb(tf.constant(ids), tf.constant(seg), training=False)
    assert out.shape == (3, 7, 6)
    np.testing.assert_allclose(out.numpy(), expected, atol=ATOL, rtol=0)


def test_layer_norm_epsilon_is_1e_12():
    """A near-constant row: eps 1e-12 normalises it, a Keras-default 1e-3 would not."""
    emb = ElectraEmbeddings(4, 8, max_position_embeddings=4, hidden_dropout_prob=0.0)
    emb.build()
    row = np.float32(1e-3) * np.array([1, -1, 1, -1, 1, -1, 1, -1], np.float32)
    emb.word_embeddings.embeddings.assign(np.tile(row, (4, 1)))
    emb.token_type_embeddings.embeddings.assign(np.zeros((2, 8), np.float32))
    emb.position_embeddings.position_embeddings.assign(np.zeros((4, 8), np.float32))
    out = emb(tf.constant([[1]]), tf.constant([[0]])).numpy()[0, 0]
    np.testing.assert_allclose(out, np.sign(row), atol=1e-4)


# --- Heads (checklist 19, 23) ---------------------------------------------------------------------

def test_generator_head_matches_official():
    rng = np.random.default_rng(5)
    hg, e, v = 4, 6, 30
    head = GeneratorHead(e, v)
    hidden = rng.normal(size=(2, 3, hg))
    table = rng.normal(size=(v, e))
    head(tf.constant(hidden, tf.float32), tf.constant(table, tf.float32))
    kernel, bias = rng.normal(0, 0.5, (hg, e)), rng.normal(0, 0.5, e)
    gamma, beta, out_bias = 1 + rng.normal(0, 0.3, e), rng.normal(0, 0.3, e), rng.normal(size=v)
    for var, value in ((head.dense.kernel, kernel), (head.dense.bias, bias), (head.layer_norm.gamma, gamma),
                       (head.layer_norm.beta, beta), (head.output_bias, out_bias)):
        var.assign(value.astype(np.float32))
    x = ref_layer_norm(ref_gelu(hidden @ kernel + bias), gamma, beta)
    expected = x @ table.T + out_bias
    table_var = tf.Variable(table.astype(np.float32))
    logits = head(tf.constant(hidden, tf.float32), table_var)
    assert logits.shape == (2, 3, v) and logits.dtype == tf.float32
    np.testing.assert_allclose(logits.numpy(), expected, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="word_embeddings_table must be"):
        head(tf.constant(hidden, tf.float32), tf.zeros([v, e + 1]))


@pytest.mark.parametrize("training", [False, True])  # True: XLA bias + GELU (fused.py)
def test_discriminator_head_matches_official(training):
    rng = np.random.default_rng(6)
    h = 12
    head = DiscriminatorHead(h)
    seq = rng.normal(size=(2, 5, h))
    head(tf.constant(seq, tf.float32))
    k1, b1 = rng.normal(0, 0.5, (h, h)), rng.normal(0, 0.5, h)
    k2, b2 = rng.normal(size=(h, 1)), rng.normal(size=1)
    for var, value in ((head.dense.kernel, k1), (head.dense.bias, b1), (head.dense_1.kernel, k2),
                       (head.dense_1.bias, b2)):
        var.assign(value.astype(np.float32))
    expected = (ref_gelu(seq @ k1 + b1) @ k2 + b2)[..., 0]
    with kernel_settings.kernel_options("xla"):
        logits = head(tf.constant(seq, tf.float32), training=training)
    assert logits.shape == (2, 5) and logits.dtype == tf.float32
    np.testing.assert_allclose(logits.numpy(), expected, atol=ATOL, rtol=0)


# --- Dropout (checklist 28) -----------------------------------------------------------------------

def _run(encoder, inputs, training):
    return encoder(inputs, training=training)["sequence_output"].numpy()


def test_eval_is_deterministic_and_training_is_not(loaded):
    _, _, encoder = loaded
    inputs = as_inputs(*batch_with_padding(np.random.default_rng(2)))
    eval_a, eval_b = _run(encoder, inputs, False), _run(encoder, inputs, False)
    default = _run(encoder, inputs, None)
    np.testing.assert_array_equal(eval_a, eval_b)
    np.testing.assert_array_equal(eval_a, default)
    train_a, train_b = _run(encoder, inputs, True), _run(encoder, inputs, True)
    assert np.abs(train_a - eval_a).max() > 1e-3
    assert np.abs(train_a - train_b).max() > 1e-3


@pytest.mark.parametrize("hidden, attention, changes", [
    (0.0, 0.0, False), (0.3, 0.0, True), (0.0, 0.3, True)])
def test_hidden_and_attention_dropout_are_separate(hidden, attention, changes):
    cfg = dict(CFG, hidden_dropout_prob=hidden, attention_probs_dropout_prob=attention)
    encoder = ElectraEncoder(**cfg)
    load_official(encoder, official_weights(cfg, np.random.default_rng(7)))
    inputs = as_inputs(*batch_with_padding(np.random.default_rng(2)))
    diff = np.abs(_run(encoder, inputs, True) - _run(encoder, inputs, False)).max()
    assert (diff > 1e-3) == changes, diff
    for layer in encoder.encoder_layers:
        assert layer.attention_dropout == attention and layer.dropout == hidden
    if not changes:  # training calls run fused kernels (modeling/fused.py): float rounding
        assert diff < 1e-5
    # The attention sublayer alone is stochastic exactly when attention_probs_dropout_prob > 0.
    attention_layer = encoder.encoder_layers[0]._self_attention_layer
    x = tf.random.stateless_normal([2, 5, 12], seed=[0, 1])
    attn_diff = np.abs(attention_layer(query=x, value=x, training=True)
                       - attention_layer(query=x, value=x, training=False)).max()
    assert (attn_diff > 1e-4) == (attention > 0), attn_diff


def test_embedding_dropout_is_inverted_and_after_layer_norm():
    emb = ElectraEmbeddings(30, 64, max_position_embeddings=16, hidden_dropout_prob=0.25)
    ids = tf.constant(np.random.default_rng(4).integers(0, 30, size=(8, 16)), tf.int32)
    seg = tf.zeros_like(ids)
    clean = emb(ids, seg, training=False).numpy()
    noisy = emb(ids, seg, training=True).numpy()
    dropped = noisy == 0
    assert abs(dropped.mean() - 0.25) < 0.03  # 8192 draws: SE 0.005
    # Training calls run the fused LayerNorm + dropout (modeling/fused.py): float rounding.
    np.testing.assert_allclose(noisy[~dropped], clean[~dropped] / 0.75, rtol=1e-6, atol=1e-6)


def test_seeded_construction_reproduces_weights_and_dropout():
    inputs = as_inputs(*batch_with_padding(np.random.default_rng(2)))
    runs = []
    for _ in range(2):
        keras.utils.set_random_seed(42)
        encoder = ElectraEncoder(**CFG)
        runs.append(([w.numpy() for w in encoder.weights], _run(encoder, inputs, True)))
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
