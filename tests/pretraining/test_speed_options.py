"""The pretraining model's speed options (issue 45): `vocab_padding_multiple` (the MLM head on the
vocabulary padded to a multiple of 128, the pad masked out) and `fused_attention`
(`keras.ops.dot_product_attention`) compute what the model computes without them: the same
losses, samples, metrics and gradients (float32 rounding), over the same variables and configs.
TensorFlow here; JAX in a child process, TensorFlow unimportable there."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import PADDED_LOGIT, GeneratorHead
from electra_tf.modeling.transformer_layer import TransformerLayer
from electra_tf.training.pretrainer import ElectraPretrainer
from tests import backends
from tests.pretraining.test_pretrainer import NO_DROPOUT, SEED, SPECIAL, VOCAB, batch, tiny_config

# Hidden dropout on (its masks must stay the same), attention dropout off (fused_attention's
# requirement).
NO_ATTENTION_DROPOUT = {"attention_probs_dropout_prob": 0.0}


def _model(**options):
    keras.utils.set_random_seed(1)
    model = ElectraPretrainer.from_pretraining_config(
        tiny_config(overrides=NO_ATTENTION_DROPOUT), SPECIAL, **options)
    model.build_from_sequence_length(24)
    return model


def _copy_variables(source, target):
    """The same values in every variable (weights and seed-generator states) of two models whose
    variables have the same paths and shapes."""
    def names(model):  # seed generators and models are numbered per process
        return [(re.sub(r"(seed_generator|electra_pretrainer)_\d+", r"\1", v.path),
                 tuple(v.shape)) for v in model.variables]

    assert names(source) == names(target)
    for a, b in zip(source.variables, target.variables):
        b.assign(a)


def _step(model, inputs):
    """Losses, metric inputs and gradients of one training call (dropout on)."""
    with tf.GradientTape() as tape:
        out = model(inputs, seed=SEED, training=True)
    grads = tape.gradient(out["total_loss"], model.trainable_variables)
    flat = {k: np.asarray(out[k]) for k in ("total_loss", "masked_lm_loss", "disc_loss")}
    flat.update({f"metric_{k}": np.asarray(v) for k, v in out["metric_inputs"].items()})
    flat.update({f"grad_{i}": np.asarray(tf.convert_to_tensor(g)) for i, g in enumerate(grads)})
    return flat


def _assert_same_step(got, want):
    assert got.keys() == want.keys()
    for key in want:
        if want[key].dtype.kind in "iu":  # samples, predictions, labels: exactly
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        else:
            np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=1e-6, err_msg=key)


# ------------------------------------------------------------------------------------------------
# Vocabulary padding
# ------------------------------------------------------------------------------------------------
def test_padded_head_has_the_unpadded_variables_and_masked_pad_columns():
    head = GeneratorHead(embedding_size=8, vocab_size=100, vocab_padding_multiple=128)
    head.build((None, None, 16))
    assert head.padded_vocab_size == 128
    assert ("generator_predictions/output_bias", (100,)) in [
        (w.path, tuple(w.shape)) for w in head.weights]
    table = np.random.default_rng(0).normal(size=(100, 8)).astype("float32")
    hidden = np.random.default_rng(1).normal(size=(2, 3, 16)).astype("float32")
    padded = np.asarray(head(hidden, table, padded_logits=True))
    sliced = np.asarray(head(hidden, table))
    assert padded.shape == (2, 3, 128) and sliced.shape == (2, 3, 100)
    assert np.all(padded[..., 100:] == PADDED_LOGIT)
    plain = GeneratorHead(embedding_size=8, vocab_size=100)
    plain.build((None, None, 16))
    plain.set_weights(head.get_weights())
    np.testing.assert_allclose(sliced, np.asarray(plain(hidden, table)), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(padded[..., :100], sliced)
    with pytest.raises(ValueError, match="vocab_padding_multiple must be an int >= 1"):
        GeneratorHead(embedding_size=8, vocab_size=100, vocab_padding_multiple=0)


def test_vocab_padding_changes_no_loss_sample_metric_or_gradient():
    plain, padded = _model(), _model(vocab_padding_multiple=128)
    _copy_variables(plain, padded)
    inputs = batch()
    _assert_same_step(_step(padded, inputs), _step(plain, inputs))
    # The MLM logits really are padded: 100 -> 128 columns.
    assert padded.generator_head.padded_vocab_size == 128 and VOCAB == 100


def test_padded_model_checkpoint_loads_into_an_unpadded_one(tmp_path):
    padded, plain = _model(vocab_padding_multiple=128), _model()
    for v in padded.trainable_variables:  # values unlike plain's
        v.assign(v + 0.01)
    path = str(tmp_path / "ckpt")
    tf.train.Checkpoint(model=padded).write(path)
    tf.train.Checkpoint(model=plain).read(path).assert_consumed()
    for a, b in zip(padded.weights, plain.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_speed_options_round_trip_get_config():
    model = _model(vocab_padding_multiple=128, fused_attention=True)
    config = model.get_config()
    assert config["vocab_padding_multiple"] == 128 and config["fused_attention"] is True
    again = ElectraPretrainer.from_config(config)
    assert again.vocab_padding_multiple == 128 and again.fused_attention
    assert again.generator_head.vocab_padding_multiple == 128
    assert all(layer.fused_attention for encoder in (again.discriminator, again.generator)
               for layer in encoder.encoder_layers)
    assert again.get_config() == config
    head = GeneratorHead(8, 100, vocab_padding_multiple=64)
    assert GeneratorHead.from_config(head.get_config()).get_config() == head.get_config()
    # Without the options the configs hold their defaults (older configs, without the keys, load).
    plain = _model().get_config()
    assert plain["vocab_padding_multiple"] == 1 and plain["fused_attention"] is False
    del plain["vocab_padding_multiple"], plain["fused_attention"]
    assert ElectraPretrainer.from_config(plain).vocab_padding_multiple == 1


# ------------------------------------------------------------------------------------------------
# Fused attention
# ------------------------------------------------------------------------------------------------
def test_fused_attention_refuses_attention_dropout():
    with pytest.raises(ValueError, match="no dropout on the attention probabilities"):
        TransformerLayer(64, 2, dropout=0.1, fused_attention=True)  # attention dropout = 0.1
    layer = TransformerLayer(64, 2, dropout=0.1, attention_dropout=0.0, fused_attention=True)
    assert TransformerLayer.from_config(layer.get_config()).fused_attention
    encoder = ElectraEncoder(100, 32, 1, 2, 64, attention_probs_dropout_prob=0.0,
                             fused_attention=True)
    assert ElectraEncoder.from_config(encoder.get_config()).fused_attention
    with pytest.raises(ValueError, match="no dropout on the attention probabilities"):
        keras.utils.set_random_seed(1)
        ElectraPretrainer.from_pretraining_config(tiny_config(), SPECIAL, fused_attention=True)


def test_fused_attention_equals_the_attention_on_tensorflow():
    plain, fused = _model(), _model(fused_attention=True)
    _copy_variables(plain, fused)
    inputs = batch()
    _assert_same_step(_step(fused, inputs), _step(plain, inputs))


# ------------------------------------------------------------------------------------------------
# JAX (the backend the options are for)
# ------------------------------------------------------------------------------------------------
_JAX_CHILD = """
import jax
import keras

from electra_tf.config import PretrainingConfig
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
config = PretrainingConfig.create("t", "/tmp/unused", {
    "vocab_size": 100, "max_seq_length": 24, "embedding_size": 32,
    "model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2,
                               "attention_probs_dropout_prob": 0.0}})
inputs = {k: inp[k] for k in ("input_ids", "input_mask", "segment_ids")}


def step(**options):
    keras.utils.set_random_seed(1)
    model = ElectraPretrainer.from_pretraining_config(config, SPECIAL, **options)
    model.build_from_sequence_length(24)
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def loss(trainable):
        out, _ = model.stateless_call(trainable, others, inputs, seed=inp["seed"], training=True)
        return out["total_loss"], out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(trainable)
    flat = {k: out[k] for k in ("total_loss", "masked_lm_loss", "disc_loss")}
    flat.update({"metric_" + k: v for k, v in out["metric_inputs"].items()})
    flat.update({"grad_" + str(i): g for i, g in enumerate(grads)})
    return flat


for name, options in (("plain", {}), ("padded", {"vocab_padding_multiple": 128}),
                      ("fused", {"fused_attention": True})):
    for key, value in step(**options).items():
        out[name + "/" + key] = value
"""


@pytest.mark.slow  # three models compiled in a JAX child: ~2 min on a loaded 2-core CPU
def test_speed_options_change_nothing_on_jax():
    backends.require("jax")
    arrays = dict(batch(), seed=np.array([3, 7], np.int32))
    got = backends.run_on_backend("jax", _JAX_CHILD, arrays)
    runs = {name: {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith(name + "/")}
            for name in ("plain", "padded", "fused")}
    assert runs["plain"]  # the child ran
    _assert_same_step(runs["padded"], runs["plain"])
    _assert_same_step(runs["fused"], runs["plain"])
