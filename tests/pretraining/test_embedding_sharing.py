"""`embedding_sharing` "gdes": DeBERTaV3's gradient-disentangled embedding sharing (issue 34)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config.hparams import ConfigError
from electra_tf.modeling.embeddings import DELTA_NAMES, DisentangledEmbeddings
from electra_tf.modeling.encoder import ElectraEncoder
from tests.pretraining.test_pretrainer import NO_DROPOUT, SEED, batch, make_model, run, tiny_config

GDES = {"embedding_sharing": "gdes"}
BLOCK_PATHS = ("electra/embeddings/word_embeddings/embeddings",
               "electra/embeddings/token_type_embeddings/embeddings",
               "electra/embeddings/position_embeddings/embeddings",
               "electra/embeddings/LayerNorm/gamma", "electra/embeddings/LayerNorm/beta")


def _gradients(model, loss_key, inputs):
    with tf.GradientTape() as tape:
        out = model(inputs, seed=SEED, training=True)
    grads = tape.gradient(out[loss_key], model.trainable_variables)
    return {v.path: (0.0 if g is None else float(tf.norm(tf.convert_to_tensor(g))))
            for v, g in zip(model.trainable_variables, grads)}


def test_gdes_block_is_the_generators_and_the_discriminator_reads_it_through_deltas():
    model = make_model(**GDES)
    embeddings = model.discriminator.embeddings
    assert isinstance(embeddings, DisentangledEmbeddings)
    assert model.generator.embeddings is embeddings.shared is model.shared_embeddings
    paths = [v.path for v in model.trainable_variables]
    assert len(paths) == len(set(paths))
    assert set(BLOCK_PATHS) <= set(paths)  # the tied model's paths
    deltas = [v.path for v in embeddings.deltas()]
    assert deltas == [f"electra/disentangled_embeddings/{n}" for n in DELTA_NAMES]
    for delta, shared in zip(embeddings.deltas(), embeddings.shared_variables()):
        assert tuple(delta.shape) == tuple(shared.shape)
        assert not np.any(delta.numpy())  # zero-initialised


def test_gdes_rtd_loss_has_no_gradient_into_the_shared_block():
    model = make_model(**GDES)
    inputs = batch()
    disc, mlm = _gradients(model, "disc_loss", inputs), _gradients(model, "masked_lm_loss", inputs)
    for path in BLOCK_PATHS:
        assert disc[path] == 0.0, path  # the RTD loss does not update the shared block ...
        assert mlm[path] > 0.0, path  # ... the generator's MLM loss does
    for name in DELTA_NAMES:
        path = f"electra/disentangled_embeddings/{name}"
        assert disc[path] > 0.0 and mlm[path] == 0.0, path  # the deltas are the discriminator's
    # The official (tied) sharing: both losses reach the block.
    tied = _gradients(make_model(), "disc_loss", inputs)
    assert all(tied[path] > 0.0 for path in BLOCK_PATHS)


@pytest.mark.parametrize("training", [False, True])
def test_gdes_starts_as_the_tied_model(training):
    """Deltas start at zero and the block is drawn as a tied model draws it: the first step's
    outputs (losses, discriminator logits, samples) are the tied model's, bit for bit."""
    tied, gdes = make_model(), make_model(**GDES)
    gdes_weights = [v for v in gdes.weights if "disentangled_embeddings" not in v.path]
    assert len(gdes_weights) == len(tied.weights)
    for v, w in zip(gdes_weights, tied.weights):
        assert v.path.split("/", 1)[1] == w.path.split("/", 1)[1]
        np.testing.assert_array_equal(v.numpy(), w.numpy(), err_msg=v.path)
    inputs = batch()
    a, b = run(tied, inputs, training), run(gdes, inputs, training)
    for key in ("total_loss", "masked_lm_loss", "disc_loss"):
        assert float(a[key]) == float(b[key]), key
    for key, value in a["metric_inputs"].items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(b["metric_inputs"][key]),
                                      err_msg=key)


def test_gdes_exported_discriminator_has_the_merged_embeddings():
    model = make_model(**GDES, overrides=NO_DROPOUT)
    rng = np.random.default_rng(0)
    for delta in model.discriminator.embeddings.deltas():
        delta.assign(rng.normal(0.0, 0.05, delta.shape).astype("float32"))
    plain = model.exported_discriminator()
    assert isinstance(plain, ElectraEncoder) and plain is not model.discriminator
    assert not isinstance(plain.embeddings, DisentangledEmbeddings)
    assert len(plain.weights) == len(model.discriminator.weights) - len(DELTA_NAMES)
    inputs = {k: tf.constant(v) for k, v in batch().items()}
    want = model.discriminator(inputs, training=False)["sequence_output"]
    got = plain(inputs, training=False)["sequence_output"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    tied = make_model()
    assert tied.exported_discriminator() is tied.discriminator  # tied: the discriminator itself


def test_gdes_is_in_the_config():
    """(Its round trip: test_layers_backends.py, PRETRAINER_VARIANTS["gdes"].)"""
    assert make_model(**GDES).get_config()["embedding_sharing"] == "gdes"


def test_gdes_mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = make_model(**GDES)
        out = run(model, batch(), True)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for key in ("total_loss", "masked_lm_loss", "disc_loss"):
        assert out[key].dtype == tf.float32 and np.isfinite(float(out[key]))
    assert all(d.dtype == "float32" for d in model.discriminator.embeddings.deltas())


@pytest.mark.parametrize("hparams, named", [
    ({"untied_generator_embeddings": True}, "untied_generator_embeddings"),
    ({"uniform_generator": True}, "uniform_generator"),
    ({"electra_objective": False}, "electra_objective"),
    ({"untied_generator": False}, "untied_generator"),
    ({"two_stage_generator_dir": "/tmp/stage1", "untied_generator_embeddings": True,
      "generator_hidden_size": 1.0, "embedding_size": 64}, "two_stage_generator_dir"),
    ({"embedding_sharing": "shared"}, "embedding_sharing"),
])
def test_gdes_nonsensical_combinations_are_one_line_errors(hparams, named):
    with pytest.raises(ConfigError, match="embedding_sharing") as error:
        tiny_config(**{**GDES, **hparams})
    assert named in str(error.value) and "\n" not in str(error.value)
