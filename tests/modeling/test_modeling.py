"""Structure of the ELECTRA modeling layers: sizes, initializers, sharing, configs, checkpoints.

Numerical parity with the official block lives in test_modeling_reference.py; mixed precision and
tf.distribute in test_modeling_distribute.py.
"""

import contextlib
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.config.model_config import get_bert_config, get_generator_config
from electra_tf.modeling.embeddings import get_activation
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead

TINY = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, embedding_size=8, max_position_embeddings=24)
TINY_GEN = dict(TINY, hidden_size=4, num_hidden_layers=2, num_attention_heads=1, intermediate_size=16)

# Truncated normal at 2 sigma: std = sigma * sqrt(1 - 2 * 2 * phi(2) / (Phi(2) - Phi(-2))).
_PHI2 = math.exp(-2.0) / math.sqrt(2 * math.pi)
_MASS2 = math.erf(2 / math.sqrt(2))
TRUNC_STD_RATIO = math.sqrt(1 - 4 * _PHI2 / _MASS2)  # 0.8796


def _count(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


def _ids(variables):
    return {id(v) for v in variables}


def _config(size, **hparams):
    return PretrainingConfig.create("test", "/nonexistent", dict(model_size=size, **hparams))


@contextlib.contextmanager
def _shapes_only():
    """Builds layers without materialising their variables (a "meta device" for counting).

    Variables created in a Keras StatelessScope with initialize_variables=False keep their shape
    but defer initialisation. Keras registers them globally for a later initialisation; they are
    unregistered on exit so no later scope ever allocates them (base + large would take 1.8 GB).
    """
    from keras.src.backend.common import global_state
    key = "uninitialized_variables"
    before = list(global_state.get_global_attribute(key, []) or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute(key, before)


@pytest.fixture(scope="module")
def small():
    """The real ELECTRA-small discriminator body and head, generator at 0.25, generator head."""
    keras.utils.set_random_seed(1234)
    config = _config("small")
    bert = get_bert_config(config)
    gen = get_generator_config(config, bert)
    disc = ElectraEncoder.from_model_config(bert)
    generator = ElectraEncoder.from_model_config(gen, embeddings=disc.embeddings, name="generator")
    disc_head = DiscriminatorHead(bert.hidden_size)
    disc_head.build((None, None, bert.hidden_size))
    gen_head = GeneratorHead(bert.embedding_size, bert.vocab_size)
    gen_head.build((None, None, gen.hidden_size))
    return dict(config=config, bert=bert, gen=gen, disc=disc, generator=generator,
                disc_head=disc_head, gen_head=gen_head)


# --- Parameter counts (checklist 27) --------------------------------------------------------

def test_small_discriminator_parameter_counts(small):
    disc = small["disc"]
    assert _count(disc.trainable_weights) == 13_483_008
    assert not disc.non_trainable_weights
    assert _count(disc.embeddings.trainable_weights) == 30522 * 128 + 512 * 128 + 2 * 128 + 2 * 128
    assert _count(disc.embeddings_project.trainable_weights) == 128 * 256 + 256
    assert _count(small["disc_head"].trainable_weights) == 66_049  # h^2 + 2h + 1


def test_small_generator_parameter_counts(small):
    generator, gen = small["generator"], small["gen"]
    assert (gen.hidden_size, gen.num_hidden_layers, gen.intermediate_size,
            gen.num_attention_heads, gen.embedding_size) == (64, 12, 256, 1, 128)
    assert _count(generator.embeddings_project.trainable_weights) == 8_256
    assert _count(w for layer in generator.encoder_layers for w in layer.trainable_weights) == 599_808
    assert _count(small["gen_head"].trainable_weights) == 39_098
    shared = _ids(generator.embeddings.trainable_weights)
    own = [w for w in generator.trainable_weights if id(w) not in shared]
    assert _count(own) == 8_256 + 599_808


@pytest.mark.parametrize("size, expected", [
    ("small", 13_483_008), ("base", 108_891_648), ("large", 334_092_288)])
def test_discriminator_body_parameter_counts_all_sizes(size, expected):
    bert = get_bert_config(_config(size))
    with _shapes_only():
        encoder = ElectraEncoder.from_model_config(bert)
    assert _count(encoder.trainable_weights) == expected
    assert (encoder.embeddings_project is None) == (size != "small")


def test_shape_only_build_counts_like_a_real_build(small):
    with _shapes_only():
        encoder = ElectraEncoder.from_model_config(small["bert"])
    assert ([tuple(v.shape) for v in encoder.weights]
            == [tuple(v.shape) for v in small["disc"].weights])


# --- Variable names (spec 5.9 mapping, documented in encoder.py) ------------------------------

def test_variable_paths_follow_official_scopes():
    encoder = ElectraEncoder(**TINY)
    generator = ElectraEncoder(**TINY_GEN, embeddings=encoder.embeddings, name="generator")
    paths = [v.path for v in encoder.weights]
    assert paths[:7] == [
        "electra/embeddings/word_embeddings/embeddings",
        "electra/embeddings/token_type_embeddings/embeddings",
        "electra/embeddings/position_embeddings/embeddings",
        "electra/embeddings/LayerNorm/gamma",
        "electra/embeddings/LayerNorm/beta",
        "electra/embeddings_project/kernel",
        "electra/embeddings_project/bias",
    ]
    assert "electra/layer_1/self_attention_layer/query/kernel" in paths
    assert "electra/layer_1/feedforward_layer_norm/gamma" in paths
    gen_paths = [v.path for v in generator.weights]
    assert gen_paths[0] == "electra/embeddings/word_embeddings/embeddings"  # shared, as official
    assert "generator/embeddings_project/kernel" in gen_paths
    assert "generator/layer_0/self_attention_layer/query/kernel" in gen_paths
    head = DiscriminatorHead(16)
    head.build((None, None, 16))
    assert sorted(v.path for v in head.weights) == [
        "discriminator_predictions/dense/bias", "discriminator_predictions/dense/kernel",
        "discriminator_predictions/dense_1/bias", "discriminator_predictions/dense_1/kernel"]
    gen_head = GeneratorHead(8, 40)
    gen_head.build((None, None, 4))
    assert sorted(v.path for v in gen_head.weights) == [
        "generator_predictions/LayerNorm/beta", "generator_predictions/LayerNorm/gamma",
        "generator_predictions/dense/bias", "generator_predictions/dense/kernel",
        "generator_predictions/output_bias"]


# --- Initializers (checklist 29, spec 7) -------------------------------------------------------

def _assert_truncated_normal(value, stddev, name):
    value = np.asarray(value, np.float64).ravel()
    n = value.size
    assert np.abs(value).max() <= 2 * stddev * (1 + 1e-6), name
    # Standard errors: mean sigma'/sqrt(n); std about sigma'/sqrt(2n). 6 SE keeps it robust.
    expected_std = TRUNC_STD_RATIO * stddev
    assert abs(value.mean()) < 6 * expected_std / math.sqrt(n), name
    assert abs(value.std() / expected_std - 1) < 6 / math.sqrt(2 * n) + 2e-3, name
    # Not a uniform or an untruncated normal with the same std: the mass within 1 sigma.
    within = np.mean(np.abs(value) <= stddev)
    expected_within = math.erf(1 / math.sqrt(2)) / _MASS2  # 0.7153
    assert abs(within - expected_within) < 6 * math.sqrt(0.25 / n), name


def _assert_glorot_uniform(value, name):
    value = np.asarray(value, np.float64)
    fan_in, fan_out = value.shape
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    flat = value.ravel()
    assert np.abs(flat).max() <= limit * (1 + 1e-6), name
    assert np.abs(flat).max() > 0.8 * limit, name  # fills the range: not a normal of the same std
    assert abs(flat.std() / (limit / math.sqrt(3)) - 1) < 6 / math.sqrt(2 * flat.size) + 0.05, name


def test_truncated_normal_initializers(small):
    disc, generator = small["disc"], small["generator"]
    emb = disc.embeddings
    for table in (emb.word_embeddings.embeddings, emb.position_embeddings.position_embeddings,
                  emb.token_type_embeddings.embeddings):
        _assert_truncated_normal(table.numpy(), 0.02, table.path)
    for encoder in (disc, generator):
        for layer in encoder.encoder_layers[:2]:
            for w in layer.weights:
                if w.path.endswith("kernel"):
                    _assert_truncated_normal(w.numpy(), 0.02, w.path)
    for head_dense in (small["disc_head"].dense, small["gen_head"].dense):
        _assert_truncated_normal(head_dense.kernel.numpy(), 0.02, head_dense.kernel.path)


def test_initializer_range_is_used():
    encoder = ElectraEncoder(**dict(TINY, vocab_size=4000, initializer_range=0.5))
    _assert_truncated_normal(encoder.embeddings.word_embeddings.embeddings.numpy(), 0.5, "word")


def test_layers_do_not_share_initial_values(small):
    layers = small["disc"].encoder_layers
    kernels = [layer.weights[0].numpy() for layer in layers[:3]]
    assert not np.array_equal(kernels[0], kernels[1])
    assert not np.array_equal(kernels[1], kernels[2])
    emb = small["disc"].embeddings
    assert not np.array_equal(emb.position_embeddings.position_embeddings.numpy()[:2],
                              emb.token_type_embeddings.embeddings.numpy())


def test_glorot_uniform_where_official_passes_no_initializer(small):
    _assert_glorot_uniform(small["disc"].embeddings_project.kernel.numpy(), "disc embeddings_project")
    _assert_glorot_uniform(small["generator"].embeddings_project.kernel.numpy(), "gen embeddings_project")
    kernel = small["disc_head"].dense_1.kernel.numpy()  # [256, 1]: too few values for the std test
    limit = math.sqrt(6.0 / (256 + 1))
    assert kernel.shape == (256, 1)
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.9 * limit
    assert 0.35 < np.mean(np.abs(kernel) <= limit / 2) < 0.65  # uniform: half the mass within l/2


def test_biases_zero_layer_norms_one_and_zero(small):
    modules = [small["disc"], small["generator"], small["disc_head"], small["gen_head"]]
    seen = 0
    for module in modules:
        for w in module.weights:
            name = w.path.rsplit("/", 1)[-1]
            if name in ("bias", "beta", "output_bias"):
                np.testing.assert_array_equal(w.numpy(), 0.0, err_msg=w.path)
                seen += 1
            elif name == "gamma":
                np.testing.assert_array_equal(w.numpy(), 1.0, err_msg=w.path)
                seen += 1
    assert seen > 100


def test_gelu_activation_is_erf_not_tanh():
    x = np.linspace(-4, 4, 81).astype(np.float32)
    erf_gelu = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    tanh_gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    assert np.abs(erf_gelu - tanh_gelu).max() > 1e-4  # the check below can tell them apart
    encoder = ElectraEncoder(**TINY)
    head = DiscriminatorHead(16)
    gen_head = GeneratorHead(8, 40)
    for fn in (get_activation("gelu"), encoder.encoder_layers[0].activation,
               head.dense.activation, gen_head.dense.activation):
        np.testing.assert_allclose(np.asarray(fn(tf.constant(x))), erf_gelu, atol=1e-6, rtol=0)


def test_unknown_activation_is_an_error():
    with pytest.raises(ValueError, match="hidden_act.*'swish'"):
        ElectraEncoder(**TINY, hidden_act="swish")


# --- Sharing (checklist 26, spec 5.2) ----------------------------------------------------------

def test_generator_shares_whole_embedding_block_but_not_projection():
    disc = ElectraEncoder(**TINY)
    gen = ElectraEncoder(**TINY_GEN, embeddings=disc.embeddings, name="generator")
    assert gen.embeddings is disc.embeddings
    shared = [disc.embeddings.word_embeddings.embeddings,
              disc.embeddings.token_type_embeddings.embeddings,
              disc.embeddings.position_embeddings.position_embeddings,
              disc.embeddings.layer_norm.gamma, disc.embeddings.layer_norm.beta]
    assert _ids(shared) == _ids(disc.embeddings.trainable_weights)
    gen_ids, disc_ids = _ids(gen.trainable_weights), _ids(disc.trainable_weights)
    assert gen_ids & disc_ids == _ids(shared)
    assert gen.embeddings_project is not disc.embeddings_project
    assert tuple(gen.embeddings_project.kernel.shape) == (8, 4)
    assert tuple(disc.embeddings_project.kernel.shape) == (8, 16)


def test_untied_generator_has_its_own_block():
    disc = ElectraEncoder(**TINY)
    gen = ElectraEncoder(**dict(TINY_GEN, embedding_size=4), name="generator")
    assert not _ids(gen.trainable_weights) & _ids(disc.trainable_weights)
    assert gen.embeddings_project is None


def test_generator_loss_reaches_every_shared_variable():
    disc = ElectraEncoder(**TINY)
    gen = ElectraEncoder(**TINY_GEN, embeddings=disc.embeddings, name="generator")
    head = GeneratorHead(8, 40)
    inputs = {"input_ids": tf.constant([[1, 5, 7, 2, 0]]), "input_mask": tf.constant([[1, 1, 1, 1, 0]]),
              "segment_ids": tf.constant([[0, 0, 1, 1, 0]])}
    table = disc.embeddings.word_embeddings.embeddings
    with tf.GradientTape() as tape:
        hidden = gen(inputs, training=False)["sequence_output"]
        logits = head(hidden[:, 1:3], table)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits([[3, 4]], logits))
    variables = disc.embeddings.trainable_weights + gen.embeddings_project.trainable_weights
    grads = tape.gradient(loss, variables + disc.embeddings_project.trainable_weights)
    for v, g in zip(variables, grads):
        assert g is not None and float(tf.reduce_max(tf.abs(tf.convert_to_tensor(g)))) > 0, v.path
    assert all(g is None for g in grads[len(variables):])  # discriminator's own weights: untouched
    # Row 30 is not in the input: its gradient comes only through the tied output layer.
    word_grad = tf.convert_to_tensor(grads[0])
    assert float(tf.reduce_max(tf.abs(word_grad[30]))) > 0


@pytest.mark.parametrize("key, value", [
    ("vocab_size", 41), ("embedding_size", 6), ("max_position_embeddings", 32), ("type_vocab_size", 3)])
def test_shared_embeddings_must_match(key, value):
    disc = ElectraEncoder(**TINY)
    with pytest.raises(ValueError, match=f"{key}="):
        ElectraEncoder(**dict(TINY_GEN, **{key: value}), embeddings=disc.embeddings, name="generator")


def test_shared_embeddings_must_be_an_embedding_block():
    disc = ElectraEncoder(**TINY)
    with pytest.raises(TypeError, match="ElectraEmbeddings"):
        ElectraEncoder(**TINY_GEN, embeddings=disc.embeddings_project, name="generator")


def test_heads_must_divide_hidden_size():
    with pytest.raises(ValueError, match="hidden_size 16 is not a multiple of num_attention_heads 3"):
        ElectraEncoder(**dict(TINY, num_attention_heads=3))


def test_sequence_longer_than_position_table_is_an_error():
    encoder = ElectraEncoder(**TINY)
    ids = tf.ones([1, 25], tf.int32)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings 24"):
        encoder({"input_ids": ids, "input_mask": ids, "segment_ids": ids * 0})


# --- Configs -------------------------------------------------------------------------------------

def test_shared_encoder_config_is_self_contained():
    disc = ElectraEncoder(**TINY)
    gen = ElectraEncoder(**TINY_GEN, embeddings=disc.embeddings, name="generator")
    config = gen.get_config()
    assert "embeddings" not in config
    clone = ElectraEncoder.from_config(config)
    assert clone.embeddings is not disc.embeddings  # the owner re-ties; config cannot
    assert clone.embedding_size == 8 and clone.embeddings_project is not None


def test_from_model_config_matches_constructor():
    bert = get_bert_config(_config("small", model_hparam_overrides={"num_hidden_layers": 1}))
    with _shapes_only():
        encoder = ElectraEncoder.from_model_config(bert, name="electra")
    config = encoder.get_config()
    for key, value in bert.to_dict().items():
        assert config[key] == value, key


# --- Checkpoints -----------------------------------------------------------------------------

def test_tf_checkpoint_saves_and_restores_every_weight(tmp_path):
    class Pair(keras.layers.Layer):  # like a pretraining model owning both encoders
        def __init__(self):
            super().__init__()
            self.discriminator = ElectraEncoder(**TINY)
            self.generator = ElectraEncoder(**TINY_GEN, embeddings=self.discriminator.embeddings,
                                            name="generator")

    pair = Pair()
    weights = pair.trainable_weights
    assert len(weights) == len(_ids(weights))  # shared variables listed once
    before = [w.numpy() for w in weights]
    path = tf.train.Checkpoint(model=pair).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if "VARIABLE_VALUE" in name]
    assert len(saved) >= len(weights)
    for w in weights:
        w.assign(tf.zeros_like(w))
    tf.train.Checkpoint(model=pair).restore(path).assert_existing_objects_matched()
    for w, value in zip(weights, before):
        np.testing.assert_array_equal(w.numpy(), value, err_msg=w.path)
