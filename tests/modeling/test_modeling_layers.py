"""Every Keras layer of electra_tf.modeling, declaratively (tests/layer_test_case.py): shapes and
dtypes, get_config / from_config, .keras saving, on TensorFlow (with its default kernels and with
the keras.ops kernels) and on JAX and PyTorch, where each layer given TensorFlow's weights and
seed-generator states computes TensorFlow's outputs, dropout included; and the config round trip
of further constructor arguments (`CONFIG_VARIANTS`).

(`DisentangledEmbeddings` has no case: it is built around a live `ElectraEmbeddings` and has no
config of its own; the pretrainer re-creates it, tests/pretraining/test_embedding_sharing.py.)"""

import numpy as np
import pytest

from electra_tf.modeling import kernel_settings
from electra_tf.modeling.embeddings import ElectraEmbeddings
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead
from electra_tf.modeling.transformer_layer import TransformerLayer
from tests import backends
from tests.layer_test_case import (
    LayerCase,
    run_backend_test,
    run_layer_test,
    run_saving_test,
    run_serialization_test,
)

BATCH, SEQ, VOCAB, EMBEDDING, HIDDEN = 3, 16, 100, 16, 32
_rng = np.random.default_rng(0)
IDS = _rng.integers(5, VOCAB, (BATCH, SEQ)).astype(np.int32)
MASK = (np.arange(SEQ)[None, :] < np.array([[SEQ], [11], [4]])).astype(np.int32)
SEGMENTS = ((np.arange(SEQ)[None, :] >= 6) & (MASK > 0)).astype(np.int32)
HIDDEN_STATES = _rng.normal(size=(BATCH, SEQ, HIDDEN)).astype(np.float32)

CASES = {
    "embeddings": LayerCase(
        ElectraEmbeddings,
        {"vocab_size": VOCAB, "embedding_size": EMBEDDING, "max_position_embeddings": 32,
         "hidden_dropout_prob": 0.1},
        {"input_ids": IDS, "segment_ids": SEGMENTS},
        expected_output_shape=(BATCH, SEQ, EMBEDDING)),
    "transformer_layer": LayerCase(
        TransformerLayer,
        {"intermediate_dim": 64, "num_heads": 2, "dropout": 0.1, "attention_dropout": 0.2,
         "activation": "gelu", "layer_norm_epsilon": 1e-12},
        {"inputs": HIDDEN_STATES, "padding_mask": MASK},
        expected_output_shape=(BATCH, SEQ, HIDDEN)),
    "encoder": LayerCase(
        ElectraEncoder,
        {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 64, "embedding_size": EMBEDDING,
         "max_position_embeddings": 32},
        {"inputs": {"input_ids": IDS, "input_mask": MASK, "segment_ids": SEGMENTS}},
        expected_output_shape={"sequence_output": (BATCH, SEQ, HIDDEN),
                               "pooled_output": (BATCH, HIDDEN)}),
    "generator_head": LayerCase(
        GeneratorHead, {"embedding_size": EMBEDDING, "vocab_size": VOCAB},
        {"hidden": HIDDEN_STATES[:, :5],
         "word_embeddings_table": _rng.normal(size=(VOCAB, EMBEDDING)).astype(np.float32)},
        expected_output_shape=(BATCH, 5, VOCAB), expected_output_dtype="float32",
        # Logits up to ~10 (sums of 16 products of unit-scale values): float32 rounding of
        # ~1e-6 there, so the absolute tolerance is 1e-6 of that scale.
        training=False, atol=1e-5),
    "discriminator_head": LayerCase(
        DiscriminatorHead, {"hidden_size": HIDDEN}, {"sequence_output": HIDDEN_STATES},
        expected_output_shape=(BATCH, SEQ), expected_output_dtype="float32"),
}

# Constructor arguments beyond the cases above (names, activations, rates, initializers, an
# encoder without the embedding projection), each through get_config / from_config / JSON on
# TensorFlow's default kernels.
IDS_40 = IDS % 40
CONFIG_VARIANTS = {
    "embeddings_named": LayerCase(
        ElectraEmbeddings,
        {"vocab_size": 40, "embedding_size": 8, "max_position_embeddings": 24,
         "type_vocab_size": 3, "hidden_dropout_prob": 0.2, "initializer_range": 0.05,
         "name": "embeddings"},
        {"input_ids": IDS_40, "segment_ids": SEGMENTS},
        expected_output_shape=(BATCH, SEQ, 8)),
    "transformer_layer_attention_dropout": LayerCase(
        TransformerLayer,
        {"intermediate_dim": 32, "num_heads": 2, "dropout": 0.1, "attention_dropout": 0.25,
         "activation": "gelu", "layer_norm_epsilon": 1e-12},
        {"inputs": HIDDEN_STATES, "padding_mask": MASK},
        expected_output_shape=(BATCH, SEQ, HIDDEN)),
    "encoder_projected": LayerCase(
        ElectraEncoder,
        {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 32, "embedding_size": 8, "max_position_embeddings": 24,
         "name": "disc"},
        {"inputs": {"input_ids": IDS_40, "input_mask": MASK, "segment_ids": SEGMENTS}},
        expected_output_shape={"sequence_output": (BATCH, SEQ, 16),
                               "pooled_output": (BATCH, 16)}),
    "encoder_relu_dropouts": LayerCase(
        ElectraEncoder,
        {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 32, "embedding_size": 16, "max_position_embeddings": 24,
         "hidden_act": "relu", "hidden_dropout_prob": 0.2, "attention_probs_dropout_prob": 0.3,
         "name": "disc"},
        {"inputs": {"input_ids": IDS_40, "input_mask": MASK, "segment_ids": SEGMENTS}},
        expected_output_shape={"sequence_output": (BATCH, SEQ, 16),
                               "pooled_output": (BATCH, 16)}),
    "generator_head_initializer": LayerCase(
        GeneratorHead, {"embedding_size": 8, "vocab_size": 40, "initializer_range": 0.1},
        {"hidden": _rng.normal(size=(2, 3, 4)).astype(np.float32),
         "word_embeddings_table": _rng.normal(size=(40, 8)).astype(np.float32)},
        expected_output_shape=(2, 3, 40), expected_output_dtype="float32", training=False),
    "discriminator_head_tanh": LayerCase(
        DiscriminatorHead, {"hidden_size": 16, "hidden_act": "tanh", "initializer_range": 0.1},
        {"sequence_output": _rng.normal(size=(2, 5, 16)).astype(np.float32)},
        expected_output_shape=(2, 5), expected_output_dtype="float32"),
}


@pytest.fixture(params=["xla", "ops"])
def kernels(request):
    """TensorFlow's default kernels, and the keras.ops kernels every backend runs."""
    with kernel_settings.kernel_options(request.param):
        yield request.param


@pytest.mark.parametrize("name", CASES)
def test_layer(name, kernels):
    run_layer_test(CASES[name])


@pytest.mark.parametrize("name", CASES)
def test_serialization(name, kernels):
    run_serialization_test(CASES[name])


@pytest.mark.parametrize("name", CONFIG_VARIANTS)
def test_config_variant(name):
    run_layer_test(CONFIG_VARIANTS[name])
    run_serialization_test(CONFIG_VARIANTS[name])


@pytest.mark.parametrize("name, rate", [("encoder_projected", 0.1),
                                        ("encoder_relu_dropouts", 0.3)])
def test_rebuilt_encoder_layers_keep_the_attention_dropout(name, rate):
    revived = run_serialization_test(CONFIG_VARIANTS[name])
    assert revived.name == "disc"
    assert [layer.attention_dropout for layer in revived.encoder_layers] == [rate, rate]


def test_rebuilt_transformer_layer_keeps_the_attention_dropout():
    revived = run_serialization_test(CONFIG_VARIANTS["transformer_layer_attention_dropout"])
    assert revived.attention_dropout == 0.25


@pytest.mark.parametrize("name", CASES)
def test_keras_file_saving(name, tmp_path):
    run_saving_test(CASES[name], tmp_path)


# JAX dispatches the layers op by op in eager calls (~15 s; PyTorch ~7 s).
SLOW_ON_JAX = [pytest.param("jax", marks=pytest.mark.slow), "torch"]


@pytest.mark.parametrize("backend", SLOW_ON_JAX)
def test_every_layer_on_another_backend(backend):
    run_backend_test(backend, list(CASES.values()))
