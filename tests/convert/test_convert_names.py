"""The official-name mapping (electra_tf/convert/names.py) against the hand-written spec 5.9 layout."""

import numpy as np
import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.convert import names
from electra_tf.convert.names import ConversionError
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import SpecialTokens

from tests import convert_fixtures as cf

V = 40
SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)


def build(**hparams):
    config = PretrainingConfig.create("m", "/tmp/unused", cf.tiny_hparams(V, **hparams))
    model = ElectraPretrainer.from_pretraining_config(config, SPECIAL)
    model.build_from_sequence_length()
    return model


def shapes(weights):
    return {k: tuple(v.shape) for k, v in weights.items()}


@pytest.mark.parametrize("hparams, generator_hidden", [
    ({"generator_hidden_size": 1.0}, 128),  # Small++ (same-size generator), scaled down
    ({}, 32),  # official 1/4 generator
])
def test_model_names_and_shapes_are_exactly_the_official_layout(hparams, generator_hidden):
    model = build(**hparams)
    expected = shapes(cf.official_weights(V, generator_hidden))
    got = names.official_shapes(model)
    assert got == expected
    # Every variable of the model is covered exactly once (no weight left unconverted).
    entries = names.pretrainer_entries(model)
    assert len({id(e.variable) for e in entries}) == len(entries)
    assert {id(e.variable) for e in names.pretrainer_entries(model)} == {id(v) for v in model.weights}


def test_untied_generator_embeddings_use_the_generator_scope():
    model = build(untied_generator_embeddings=True)
    got = names.official_shapes(model)
    # Official: BertModel(scope="generator", embedding_size=None, untied_embeddings=True).
    assert got["generator/embeddings/word_embeddings"] == (V, 32)
    assert got["generator/embeddings/LayerNorm/gamma"] == (32,)
    assert "generator/embeddings_project/kernel" not in got  # E == Hg: no projection
    assert got["generator_predictions/dense/kernel"] == (32, 32)


def test_tied_generator_and_mlm_only_have_no_generator_scope():
    tied = names.official_shapes(build(untied_generator=False))
    assert not any(n.startswith("generator/") for n in tied)
    assert tied["generator_predictions/dense/kernel"] == (128, 64)
    assert "discriminator_predictions/dense_1/kernel" in tied
    mlm = names.official_shapes(build(electra_objective=False))
    assert {names.part_of(n) for n in mlm} == {"electra", "generator_predictions"}


def test_get_and_assign_round_trip_exactly_and_reach_the_variables():
    model = build()
    weights = cf.random_like(names.official_shapes(model), seed=3)
    assigned = names.assign_official_weights(model, weights)
    assert assigned == list(weights)
    back = names.get_official_weights(model)
    for name, value in weights.items():
        np.testing.assert_array_equal(back[name], value)
    # The attention kernels are reshaped, not transposed: column j of the official [H, H] query
    # kernel is head j // 64, unit j % 64 of keras-hub's [H, heads, 64].
    query = model.discriminator.encoder_layers[0]._self_attention_layer._query_dense.kernel.numpy()
    official = weights["electra/encoder/layer_0/attention/self/query/kernel"]
    np.testing.assert_array_equal(query[:, 1, 5], official[:, 64 + 5])
    out = model.discriminator.encoder_layers[1]._self_attention_layer._output_dense.kernel.numpy()
    official = weights["electra/encoder/layer_1/attention/output/dense/kernel"]
    np.testing.assert_array_equal(out[1, 5, :], official[64 + 5, :])


def test_assign_checks_names_shapes_and_dtypes_and_is_all_or_nothing():
    model = build()
    good = cf.random_like(names.official_shapes(model), seed=1)
    before = names.get_official_weights(model)

    missing = dict(good)
    del missing["generator/encoder/layer_1/output/LayerNorm/beta"]
    with pytest.raises(ConversionError, match=r"no variable generator/encoder/layer_1/output/LayerNorm/beta "
                                              r"\(the model needs shape \[32\]\)"):
        names.assign_official_weights(model, missing)

    wrong = dict(good, **{"electra/embeddings/word_embeddings": np.zeros([V + 1, 64], np.float32)})
    with pytest.raises(ConversionError, match=r"electra/embeddings/word_embeddings has shape \[41, 64\], "
                                              r"but the model needs \[40, 64\]"):
        names.assign_official_weights(model, wrong)

    ints = dict(good, **{"discriminator_predictions/dense_1/bias": np.zeros([1], np.int32)})
    with pytest.raises(ConversionError, match="discriminator_predictions/dense_1/bias has dtype int32"):
        names.assign_official_weights(model, ints)
    lossy = dict(good, **{"electra/embeddings/LayerNorm/beta": np.zeros([64], np.float64)})
    with pytest.raises(ConversionError, match="dtype float64"):
        names.assign_official_weights(model, lossy)
    # Nothing was assigned by the failed calls (checks run before any assignment).
    after = names.get_official_weights(model)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    # A lossless half-precision value is accepted (upcast).
    half = dict(good, **{"electra/embeddings/LayerNorm/beta": good["electra/embeddings/LayerNorm/beta"].astype(np.float16)})
    names.assign_official_weights(model, half)


def test_match_checkpoint_groups():
    expected = shapes(cf.official_weights(V, 32))
    full = dict(expected)
    assert names.match_checkpoint(expected, full).absent == ()

    disc_only = {k: v for k, v in expected.items() if names.part_of(k) in ("electra", "discriminator_predictions")}
    match = names.match_checkpoint(expected, disc_only)
    assert match.present == ("electra", "discriminator_predictions")
    assert match.absent == ("generator", "generator_predictions")

    partial = dict(expected)
    del partial["generator_predictions/output_bias"]
    with pytest.raises(ConversionError, match=r"lacks variable generator_predictions/output_bias "
                                              r"\(expected shape \[40\]"):
        names.match_checkpoint(expected, partial)

    no_disc = {k: v for k, v in expected.items() if not k.startswith("electra/")}
    with pytest.raises(ConversionError, match="no electra/\\* variables"):
        names.match_checkpoint(expected, no_disc)

    extra = dict(expected, **{"generator_ltr/encoder/layer_0/output/dense/bias": (32,)})
    with pytest.raises(ConversionError, match=r"no place for: generator_ltr/encoder/layer_0/output/dense/bias \[32\]"):
        names.match_checkpoint(expected, extra)

    reshaped = dict(expected, **{"generator/embeddings_project/kernel": (64, 128)})
    with pytest.raises(ConversionError, match=r"generator/embeddings_project/kernel has shape \[64, 128\], "
                                              r"but ctx expects \[64, 32\]"):
        names.match_checkpoint(expected, reshaped, context="ctx")


def test_skipped_checkpoint_entries():
    assert not names.is_weight_name("global_step")
    assert not names.is_weight_name("electra/encoder/layer_0/output/dense/kernel/adam_m")
    assert not names.is_weight_name("generator_predictions/output_bias/adam_v")
    assert names.is_weight_name("generator_predictions/output_bias")


def test_bare_encoder_entries_load_official_layout_weights():
    """A lone ElectraEncoder maps the same way (scope-relative names, as the modeling tests use)."""
    from electra_tf.modeling.encoder import ElectraEncoder

    encoder = ElectraEncoder(vocab_size=V, hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=512, embedding_size=64)
    entries = names.encoder_entries(encoder)
    official = {k: v for k, v in cf.official_weights(V, None, layers=1).items() if k.startswith("electra/")}
    assert {e.official_name: e.official_shape for e in entries} == shapes(official)
    for e in entries:
        e.variable.assign(official[e.official_name].reshape(e.variable.shape))
    np.testing.assert_array_equal(encoder.embeddings_project.kernel.numpy(), official["electra/embeddings_project/kernel"])
