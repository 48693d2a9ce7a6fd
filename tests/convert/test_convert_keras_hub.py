"""to-keras-hub: our discriminator / generator as a keras_hub.models.ElectraBackbone preset.

keras-hub's ElectraBackbone hard-codes the tanh-approximate GELU, so its outputs differ from
ELECTRA's exact-GELU ones; the test measures that difference, and shows it is the ONLY difference:
with the exact GELU swapped into the loaded backbone, outputs agree to float32 rounding.
"""

import json
import os

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.convert import keras_hub as kh_convert
from electra_tf.convert.names import ConversionError

from tests import convert_fixtures as cf

EXACT_TOLERANCE = 1e-4  # mapping check (exact GELU swapped in), float32
# Measured tanh-vs-erf GELU effect on sequence_output for these random weights (2 layers, unit-scale
# activations): ~1e-3 (see docs/conversion.md). The bound leaves room for other seeds, and is far
# below the output scale (LayerNorm outputs of order 1).
GELU_TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    vocab = cf.text_vocab_path(str(root), real=False)
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab))
    directory, model, _ = cf.make_model_dir(str(root), hparams, vocab, seed=9, step=20)
    return directory, model, vocab


def backbone_inputs(ids, mask, seg):
    return {"token_ids": tf.constant(ids), "segment_ids": tf.constant(seg), "padding_mask": tf.constant(mask)}


def with_exact_gelu(backbone):
    for layer in backbone.transformer_layers:
        layer._feedforward_intermediate_dense.activation = keras.activations.gelu  # erf form
    return backbone


@pytest.mark.parametrize("part", ["discriminator", "generator"])
def test_backbone_reproduces_our_encoder(tmp_path, run, part):
    directory, model, vocab = run
    out = str(tmp_path / part)
    kh_convert.export_keras_hub(directory, out, part=part)
    ids, mask, seg = cf.encode_text(vocab)
    encoder = model.discriminator if part == "discriminator" else model.generator
    ours = encoder({"input_ids": tf.constant(ids), "input_mask": tf.constant(mask),
                    "segment_ids": tf.constant(seg)}, training=False)["sequence_output"].numpy()
    real = mask == 1

    # keras-hub's own loader, and the plain constructor + load_weights route.
    backbone = keras_hub.models.ElectraBackbone.from_preset(out)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)["config"]
    plain = keras_hub.models.ElectraBackbone(**config)
    plain.load_weights(os.path.join(out, "model.weights.h5"))
    for a, b in zip(backbone.weights, plain.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    theirs = backbone(backbone_inputs(ids, mask, seg), training=False)["sequence_output"].numpy()
    gelu_diff = cf.max_abs_diff(ours[real], theirs[real])
    print(f"keras-hub {part} sequence_output (tanh GELU): max abs diff {gelu_diff:.3g}, "
          f"mean {np.abs(ours[real] - theirs[real]).mean():.3g}")
    assert 1e-6 < gelu_diff <= GELU_TOLERANCE

    exact = with_exact_gelu(backbone)(backbone_inputs(ids, mask, seg), training=False)["sequence_output"].numpy()
    exact_diff = cf.max_abs_diff(ours, exact)  # every position, padding included
    print(f"keras-hub {part} sequence_output (exact GELU swapped in): max abs diff {exact_diff:.3g}")
    assert exact_diff <= EXACT_TOLERANCE

    tokenizer = keras_hub.tokenizers.ElectraTokenizer.from_preset(out)
    first = cf.SENTENCES[2][0]
    np.testing.assert_array_equal(np.asarray(tokenizer(first)), ids[2][1:mask[2].sum() - 1])


def test_pooler_is_left_at_its_seeded_initialisation(tmp_path, run):
    directory, _, _ = run
    kh_convert.export_keras_hub(directory, str(tmp_path / "a"))
    kh_convert.export_keras_hub(directory, str(tmp_path / "b"))
    a = keras_hub.models.ElectraBackbone.from_preset(str(tmp_path / "a"))
    b = keras_hub.models.ElectraBackbone.from_preset(str(tmp_path / "b"))
    kernel = a.pooled_dense.kernel.numpy()
    np.testing.assert_array_equal(kernel, b.pooled_dense.kernel.numpy())
    assert np.abs(kernel).std() < 0.05  # truncated normal 0.02: the initialiser, no trained weight
    with pytest.raises(ConversionError, match="pass --overwrite"):
        kh_convert.export_keras_hub(directory, str(tmp_path / "a"))
    kh_convert.export_keras_hub(directory, str(tmp_path / "a"), overwrite=True)
    again = keras_hub.models.ElectraBackbone.from_preset(str(tmp_path / "a"))
    np.testing.assert_array_equal(again.token_embedding.embeddings.numpy(), a.token_embedding.embeddings.numpy())


def test_backbone_kwargs_refuse_activations_keras_hub_lacks():
    from electra_tf.config.model_config import ModelConfig

    config = ModelConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16, embedding_size=8, hidden_act="relu")
    with pytest.raises(ConversionError, match="hidden_act 'relu'"):
        kh_convert.backbone_kwargs(config)
