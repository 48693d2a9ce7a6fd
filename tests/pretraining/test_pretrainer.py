"""ElectraPretrainer: the joint objective wired as the official PretrainingModel (issue 3)."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
VOCAB = 100
SEQ = 24
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def tiny_config(**hparams):
    overrides = {"hidden_size": 64, "num_hidden_layers": 2, **hparams.pop("overrides", {})}
    base = {"vocab_size": VOCAB, "max_seq_length": SEQ, "embedding_size": 32,
            "model_hparam_overrides": overrides}
    base.update(hparams)
    return PretrainingConfig.create("t", "/tmp/unused", base)


def make_model(**hparams):
    keras.utils.set_random_seed(1)
    model = ElectraPretrainer.from_pretraining_config(tiny_config(**hparams), SPECIAL)
    model.build_from_sequence_length(SEQ)
    return model


def batch(batch_size=4, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, size=(batch_size, SEQ)).astype("int32")
    mask = np.ones_like(ids)
    lengths = rng.integers(10, SEQ + 1, size=batch_size)
    for i, n in enumerate(lengths):
        ids[i, 0], ids[i, n - 1] = SPECIAL.cls_id, SPECIAL.sep_id
        ids[i, n:], mask[i, n:] = 0, 0
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


SEED = tf.constant([3, 7], tf.int32)


@tf.function
def run(model, inputs, training=False):
    return model(inputs, seed=SEED, training=training)


def test_losses_at_init_match_chance_levels():
    out = run(make_model(), batch())
    assert abs(float(out["masked_lm_loss"]) - math.log(VOCAB)) < 0.3  # near-uniform generator
    assert abs(float(out["disc_loss"]) - math.log(2.0)) < 0.2
    expected = float(out["masked_lm_loss"]) + 50.0 * float(out["disc_loss"])
    assert float(out["total_loss"]) == pytest.approx(expected, rel=1e-6)


def test_shared_embedding_block_and_separate_projections():
    model = make_model()
    disc, gen = model.discriminator, model.generator
    assert gen.embeddings is disc.embeddings
    disc_vars = {id(v.value) for v in disc.embeddings.weights}
    gen_vars = {id(v.value) for v in gen.embeddings.weights}
    assert disc_vars == gen_vars and len(disc_vars) == 5  # word, position, type, LN gamma, beta
    assert disc.embeddings_project is not gen.embeddings_project
    assert tuple(disc.embeddings_project.kernel.shape) == (32, 64)
    assert tuple(gen.embeddings_project.kernel.shape) == (32, 16)
    # Every variable is counted once by the model.
    paths = [v.path for v in model.trainable_variables]
    assert len(paths) == len(set(paths))


def test_gradient_flow():
    """The generator encoder gets no discriminator gradient; the shared embeddings get both."""
    model = make_model(overrides=NO_DROPOUT)
    inputs = batch()

    def grads(loss_key):
        with tf.GradientTape() as tape:
            out = model(inputs, seed=SEED, training=False)
        return dict(zip([v.path for v in model.trainable_variables],
                        tape.gradient(out[loss_key], model.trainable_variables)))

    disc_grads = grads("disc_loss")
    mlm_grads = grads("masked_lm_loss")

    def norm(g):
        if g is None:
            return 0.0
        g = tf.convert_to_tensor(g)
        return float(tf.norm(g))

    gen_encoder = [p for p in disc_grads if p.startswith("generator/")]
    assert gen_encoder and all(norm(disc_grads[p]) == 0.0 for p in gen_encoder)
    assert all(norm(disc_grads[p]) == 0.0 for p in disc_grads if p.startswith("generator_predictions/"))
    word = "electra/embeddings/word_embeddings/embeddings"
    assert norm(disc_grads[word]) > 0 and norm(mlm_grads[word]) > 0
    assert norm(disc_grads["electra/embeddings/LayerNorm/gamma"]) > 0
    assert norm(mlm_grads["electra/embeddings/LayerNorm/gamma"]) > 0
    # The MLM loss does not reach the discriminator transformer or its head.
    assert all(norm(mlm_grads[p]) == 0.0 for p in mlm_grads
               if p.startswith("electra/layer_") or p.startswith("discriminator_predictions/"))
    assert any(norm(mlm_grads[p]) > 0 for p in gen_encoder)


def test_masks_are_dynamic_and_reproducible():
    model = make_model()
    inputs = batch()
    a = model(inputs, seed=SEED, training=False)["metric_inputs"]["masked_lm_ids"]
    b = model(inputs, seed=SEED, training=False)["metric_inputs"]["masked_lm_ids"]
    c = model(inputs, seed=tf.constant([3, 8], tf.int64), training=False)
    np.testing.assert_array_equal(a, b)
    positions_c = c["metric_inputs"]["masked_lm_ids"]
    assert not np.array_equal(a.numpy(), positions_c.numpy())


def test_mlm_only_objective_has_no_discriminator():
    model = make_model(electra_objective=False)
    assert model.generator is None and model.discriminator_head is None
    out = run(model, batch())
    assert float(out["disc_loss"]) == 0.0
    assert float(out["total_loss"]) == pytest.approx(float(out["masked_lm_loss"]))
    assert "sampled_tokids" not in out["metric_inputs"]
    # The MLM head runs on the full-size model (the one users keep, named as the discriminator).
    assert model.mlm_encoder is model.discriminator


def test_uniform_generator_loss_is_log_vocab_without_gradient():
    model = make_model(uniform_generator=True)
    assert model.generator is None and model.generator_head is None
    out = run(model, batch())
    assert float(out["masked_lm_loss"]) == pytest.approx(math.log(VOCAB), rel=1e-5)
    assert np.isfinite(float(out["disc_loss"]))


def test_tied_generator_is_the_discriminator():
    model = make_model(untied_generator=False)
    assert model.generator is None and model.mlm_encoder is model.discriminator
    assert np.isfinite(float(run(model, batch())["total_loss"]))


def test_untied_generator_embeddings():
    model = make_model(untied_generator_embeddings=True)
    assert model.generator.embeddings is not model.discriminator.embeddings
    assert model.generator.embeddings_project is None  # own block at the generator's width
    assert tuple(model.generator.embeddings.word_embeddings.embeddings.shape) == (VOCAB, 16)
    assert np.isfinite(float(run(model, batch())["total_loss"]))


def test_generator_size_options():
    model = make_model(generator_hidden_size=0.5, generator_layers=0.5)
    assert model.generator.hidden_size == 32 and model.generator.num_hidden_layers == 1


def test_disallow_correct_never_samples_the_original():
    model = make_model(disallow_correct=True)
    mi = run(model, batch(8))["metric_inputs"]
    weights = mi["masked_lm_weights"].numpy() > 0
    assert weights.sum() > 10
    assert not np.any(mi["sampled_tokids"].numpy()[weights] == mi["masked_lm_ids"].numpy()[weights])


def test_low_temperature_samples_the_argmax():
    model = make_model(temperature=1e-6)
    mi = run(model, batch(8))["metric_inputs"]
    weights = mi["masked_lm_weights"].numpy() > 0
    np.testing.assert_array_equal(mi["sampled_tokids"].numpy()[weights],
                                  mi["masked_lm_preds"].numpy()[weights])


def test_mask_prob_sets_the_number_of_masked_slots():
    model = make_model(mask_prob=0.3)
    assert model.masking_options.max_predictions_per_seq == int((0.3 + 0.005) * SEQ)
    inputs = batch(2)
    mi = run(model, inputs)["metric_inputs"]
    n = inputs["input_mask"].sum(axis=1)
    expected = np.maximum(1, np.minimum(model.masking_options.max_predictions_per_seq,
                                        np.round(n.astype(np.float32) * np.float32(0.3))))
    np.testing.assert_array_equal(mi["masked_lm_weights"].numpy().sum(axis=1), expected)


def test_loss_weights():
    out = run(make_model(gen_weight=2.0, disc_weight=10.0), batch())
    assert float(out["total_loss"]) == pytest.approx(
        2.0 * float(out["masked_lm_loss"]) + 10.0 * float(out["disc_loss"]), rel=1e-6)


# The config round trips (get_config -> JSON -> from_config: config, variables by path, losses)
# are declared in tests/pretraining/test_layers_backends.py (PRETRAINER, PRETRAINER_VARIANTS).


def test_mixed_bfloat16_losses_are_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = make_model()
        out = run(model, batch())
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for key in ("total_loss", "masked_lm_loss", "disc_loss"):
        assert out[key].dtype == tf.float32 and np.isfinite(float(out[key]))
    assert model.discriminator.embeddings.word_embeddings.embeddings.dtype == "float32"


def test_two_replicas_give_the_one_device_loss(mirrored_strategy):
    """Same global batch: the summed per-replica contributions equal the one-device loss."""
    inputs = batch(8, seed=5)
    model = make_model(overrides=NO_DROPOUT)
    one_device = run(model, inputs, training=True)
    weights = [v.numpy() for v in model.weights]

    with mirrored_strategy.scope():
        replicated = make_model(overrides=NO_DROPOUT)
    for var, value in zip(replicated.weights, weights):
        var.assign(value)
    dataset = tf.data.Dataset.from_tensors(inputs).unbatch().batch(8)
    dist_batch = next(iter(mirrored_strategy.experimental_distribute_dataset(dataset)))

    @tf.function
    def step(b):
        out = mirrored_strategy.run(lambda x: replicated(x, seed=SEED, training=True), args=(b,))
        return {k: mirrored_strategy.reduce("SUM", out[k], axis=None)
                for k in ("total_loss", "masked_lm_loss", "disc_loss")}

    two = step(dist_batch)
    for key in two:
        np.testing.assert_allclose(float(two[key]), float(one_device[key]), rtol=1e-5, err_msg=key)


def test_user_encoders_keras_hub_backbones():
    """Any pair of Keras encoders works; keras-hub backbones get their own input names."""
    import keras_hub

    def backbone(width, name):
        return keras_hub.models.ElectraBackbone(
            vocab_size=VOCAB, num_layers=1, num_heads=1, hidden_dim=width, embedding_dim=width,
            intermediate_dim=2 * width, max_sequence_length=SEQ, name=name)

    keras.utils.set_random_seed(2)
    disc, gen = backbone(32, "my_disc"), backbone(16, "my_gen")
    model = ElectraPretrainer(discriminator_config=None, generator_config=None,
                              special_tokens=SPECIAL._asdict(),
                              masking_options={"max_predictions_per_seq": 3},
                              discriminator_encoder=disc, generator_encoder=gen)
    assert model.vocab_size == VOCAB and model.discriminator_head.hidden_size == 32
    inputs = batch()
    with tf.GradientTape() as tape:
        out = model(inputs, seed=SEED, training=False)
    assert abs(float(out["masked_lm_loss"]) - math.log(VOCAB)) < 0.5
    grads = dict(zip([v.path for v in model.trainable_variables],
                     tape.gradient(out["total_loss"], model.trainable_variables)))
    # The MLM head is tied to the generator backbone's token embedding.
    assert grads[gen.token_embedding.embeddings.path] is not None
    assert grads[disc.token_embedding.embeddings.path] is not None
    clone = ElectraPretrainer.from_config(model.get_config())
    assert isinstance(clone.discriminator, keras_hub.models.ElectraBackbone)


def test_user_encoder_without_embedding_table_is_a_clear_error():
    class Bare(keras.layers.Layer):
        def call(self, inputs):
            return tf.zeros([1, 1, 4])

    with pytest.raises(ValueError, match="cannot find the word-embedding table of encoder 'bare'"):
        ElectraPretrainer(discriminator_config=None, generator_config=None,
                          special_tokens=SPECIAL._asdict(), discriminator_encoder=Bare(name="bare"),
                          electra_objective=False)
