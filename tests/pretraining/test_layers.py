"""The objective's Keras layers: dtype policies, one implementation each.

Each layer must give exactly what its pure function gives (`mask_inputs`, `make_fake_inputs`,
`DiscriminatorHead` + `rtd_loss`), inside a model and inside `tf.data`, and `ElectraPretrainer`
must be built from them.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.modeling.heads import DiscriminatorHead
from electra_tf.pretraining import losses, masking, sampling, seeds
from electra_tf.pretraining.layers import (ElectraDiscriminatorOutput, ElectraFakeData,
                                           ElectraMasking)
from electra_tf.pretraining.masking import MaskingOptions
from electra_tf.training.pretrainer import ElectraPretrainer
from tests.pretraining.test_pretrainer import SEQ, SPECIAL, VOCAB, batch, make_model, tiny_config

SEED = tf.constant([11, 5], tf.int32)
N = 5


def _example_seeds(size, salt, seed=SEED, first=0):
    return seeds.example_keys(seed, first, size, salt=salt)


def _assert_same(a, b):
    assert set(a) == set(b)
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


# The config round trips (every argument, names, dtype policies) and the float32 / int32 outputs
# under mixed_bfloat16 are declared in tests/pretraining/test_layers_backends.py.
def test_mixed_precision_keeps_float32_variables_and_computes_in_bfloat16():
    hidden = tf.random.stateless_normal([2, SEQ, 16], [1, 2])
    labels = tf.cast(tf.random.stateless_uniform([2, SEQ], [3, 4]) < 0.3, tf.int32)
    layer = ElectraDiscriminatorOutput(hidden_size=16, dtype="mixed_bfloat16")
    layer(hidden, labels, tf.ones([2, SEQ], tf.int32))
    assert layer.head.dense.kernel.dtype == "float32"  # variables float32, compute bfloat16
    assert layer.head.compute_dtype == "bfloat16"


def test_masking_layer_is_mask_inputs():
    inputs = batch(6, seed=2)
    layer = ElectraMasking(SPECIAL, MaskingOptions(mask_prob=0.3, max_predictions_per_seq=N))
    expected = masking.mask_inputs(
        inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"], special=SPECIAL,
        mask_prob=0.3, max_predictions_per_seq=N,
        keys=_example_seeds(6, seeds.MASKING_SALT))._asdict()
    _assert_same(layer(inputs, seed=SEED), expected)
    # A scalar step is folded with the layer's seed; example_offset names global indices.
    _assert_same(ElectraMasking(SPECIAL, MaskingOptions(mask_prob=0.3, max_predictions_per_seq=N),
                                seed=11)(inputs, seed=5), expected)
    rows = {k: v[3:] for k, v in inputs.items()}
    _assert_same(layer(rows, seed=SEED, example_offset=3), {k: v[3:] for k, v in expected.items()})


def test_masking_layer_inside_tf_data_gives_the_models_masks():
    inputs = batch(4, seed=3)
    layer = ElectraMasking(SPECIAL, MaskingOptions(max_predictions_per_seq=N), seed=11)
    dataset = (tf.data.Dataset.from_tensors(inputs).repeat(3).enumerate()
               .map(lambda step, b: layer(b, seed=step)))
    masked = list(dataset)
    for step, element in enumerate(masked):
        _assert_same(element, layer(inputs, seed=tf.constant([11, step], tf.int64)))
    # Every batch gets a new mask.
    assert not np.array_equal(masked[0]["masked_lm_positions"], masked[1]["masked_lm_positions"])


def test_pretrainer_trains_on_batches_masked_in_tf_data():
    model = make_model()
    inputs = batch(4, seed=4)
    premasked = next(iter(tf.data.Dataset.from_tensors(inputs).map(
        lambda b: model.masking(b, seed=SEED))))
    in_model = model(inputs, seed=SEED, training=False)
    from_data = model(premasked, seed=SEED, training=False)
    for key in ("total_loss", "masked_lm_loss", "disc_loss"):
        assert float(from_data[key]) == float(in_model[key]), key
    _assert_same(from_data["metric_inputs"], in_model["metric_inputs"])


def _logits(batch_size, vocab=VOCAB, seed=6):
    return tf.random.stateless_normal([batch_size, N, vocab], [seed, 1]) * 3.0


def test_fake_data_layer_is_make_fake_inputs():
    inputs = batch(4, seed=5)
    masked = ElectraMasking(SPECIAL, MaskingOptions(max_predictions_per_seq=N))(inputs, seed=SEED)
    logits = _logits(4)
    layer = ElectraFakeData(temperature=0.7, disallow_correct=True)
    expected = sampling.make_fake_inputs(
        masking.MaskedInputs(**masked), logits, keys=_example_seeds(4, seeds.SAMPLING_SALT),
        temperature=0.7, disallow_correct=True)._asdict()
    out = layer(masked, logits, seed=SEED)
    _assert_same({k: out[k] for k in expected}, expected)
    np.testing.assert_array_equal(out["input_mask"], masked["input_mask"])
    assert (out["is_fake"].numpy().sum()) > 0


def test_fake_data_layer_samples_float32_logits_under_bfloat16():
    """The logits must not be cast to the compute dtype: 1.0 and 1.001 are one bfloat16 value,
    so a cast would turn the near-zero-temperature argmax into a coin flip."""
    masked = ElectraMasking(SPECIAL, MaskingOptions(mask_prob=1.0, max_predictions_per_seq=N))(
        batch(8, seed=6), seed=SEED)
    logits = np.zeros([8, N, VOCAB], np.float32)
    logits[..., 40], logits[..., 41] = 1.0, 1.001
    layer = ElectraFakeData(temperature=1e-6, dtype="mixed_bfloat16")
    sampled = layer(masked, tf.constant(logits), seed=SEED)["sampled_ids"].numpy()
    assert (sampled == 41).all()


def test_discriminator_output_is_head_and_rtd_loss():
    hidden = tf.random.stateless_normal([3, SEQ, 16], [7, 8])
    labels = tf.cast(tf.random.stateless_uniform([3, SEQ], [9, 9]) < 0.2, tf.int32)
    mask = tf.constant(batch(3, seed=7)["input_mask"])
    keras.utils.set_random_seed(5)
    layer = ElectraDiscriminatorOutput(hidden_size=16, name="out")
    out = layer(hidden, labels, mask)
    keras.utils.set_random_seed(5)
    head = DiscriminatorHead(hidden_size=16)  # the same initial weights
    logits = head(hidden)
    expected = losses.rtd_loss(logits, labels, mask)
    np.testing.assert_array_equal(out["logits"], logits)
    for key in losses.RTDLoss._fields:
        np.testing.assert_array_equal(out[key], getattr(expected, key), err_msg=key)
    np.testing.assert_array_equal(out["labels"], labels)
    # The head keeps its official scope name; its variables are the layer's.
    assert layer.head.name == "discriminator_predictions"
    assert [v.path for v in layer.trainable_variables] == [v.path for v in layer.head.trainable_variables]
    # An explicit denominator replaces the batch's weight sum.
    halved = layer(hidden, labels, mask, denominator=2.0 * tf.reduce_sum(tf.cast(mask, tf.float32)))
    assert float(halved["loss"]) == pytest.approx(float(out["loss"]) / 2.0, rel=1e-6)


def test_pretrainer_is_composed_of_the_layers(tmp_path):
    model = make_model(mask_prob=0.2, temperature=0.5, disallow_correct=True)
    assert isinstance(model.masking, ElectraMasking)
    assert isinstance(model.fake_data, ElectraFakeData)
    assert isinstance(model.discriminator_output, ElectraDiscriminatorOutput)
    assert model.discriminator_head is model.discriminator_output.head
    assert model.masking.masking_options is model.masking_options
    assert (model.masking_options.mask_prob, model.masking_options.max_predictions_per_seq) == (
        0.2, int((0.2 + 0.005) * SEQ))
    assert (model.fake_data.temperature, model.fake_data.disallow_correct) == (0.5, True)
    # Every variable is the model's once; checkpoints keep the head under its old name, so
    # checkpoints written before these layers existed still restore.
    paths = [v.path for v in model.weights]
    assert len(paths) == len(set(paths))
    saved = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    keys = [name for name, _ in tf.train.list_variables(saved)]
    assert any(k.startswith("model/discriminator_head/dense/") for k in keys)
    assert not any(k.startswith("model/discriminator_output/") for k in keys)


def test_pretrainer_without_discriminator_has_no_fake_data_layer():
    model = make_model(electra_objective=False)
    assert model.fake_data is None and model.discriminator_output is None
    assert isinstance(model.masking, ElectraMasking)


def test_pretrainer_get_config_keeps_new_arguments():
    """(Its round trip, and the rebuilt masking layer's options and seed: test_layers_backends.py,
    PRETRAINER_VARIANTS["whole_word_seeded"].)"""
    model = ElectraPretrainer.from_pretraining_config(
        tiny_config(masking="whole_word", seed=9), SPECIAL, vocab_tokens=["[PAD]", "a", "##b"])
    config = model.get_config()
    assert (config["masking_options"]["masking"], config["seed"],
            config["masking_options"]["continuation_ids"]) == ("whole_word", 9, [2])
