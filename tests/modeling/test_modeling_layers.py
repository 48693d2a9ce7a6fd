"""Every Keras layer of electra_tf.modeling, declaratively (tests/layer_test_case.py): shapes and
dtypes, get_config / from_config, .keras saving, on TensorFlow (with its default kernels and with
the keras.ops kernels) and on JAX and PyTorch, where each layer given TensorFlow's weights and
seed-generator states computes TensorFlow's outputs, dropout included."""

import numpy as np
import pytest

from electra_tf.modeling import kernel_settings
from electra_tf.modeling.embeddings import ElectraEmbeddings
from electra_tf.modeling.encoder import ElectraEncoder, TransformerLayer
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead
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


@pytest.mark.parametrize("name", CASES)
def test_keras_file_saving(name, tmp_path):
    run_saving_test(CASES[name], tmp_path)


# JAX dispatches the layers op by op in eager calls (~15 s; PyTorch ~7 s).
SLOW_ON_JAX = [pytest.param("jax", marks=pytest.mark.slow), "torch"]


@pytest.mark.parametrize("backend", SLOW_ON_JAX)
def test_every_layer_on_another_backend(backend):
    run_backend_test(backend, list(CASES.values()))
