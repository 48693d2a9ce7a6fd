"""The sampling-temperature curriculum (Fast-ELECTRA; pretraining/temperature.py) and the frozen
generator of `ElectraPretrainer`: the schedule's values at step 0, mid and end (hand-computed),
the step read from the compiled step's seed (not baked in at trace time), evaluation at the end
value, and a frozen generator that has no trainable variable and no gradient path."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.pretraining.temperature import temperature_at
from tests.pretraining.test_pretrainer import NO_DROPOUT, SEQ, SPECIAL, batch, tiny_config


def _t(step, **kwargs):
    return float(temperature_at(step, **kwargs))


@pytest.mark.parametrize("schedule, mid", [
    ("linear", 2.0),  # 1 + (3 - 1) * (1 - 1/2)
    ("cosine", 2.0),  # 1 + (3 - 1) * (1 + cos(pi/2)) / 2
    ("exponential", math.sqrt(3.0)),  # 3 * (1/3) ** (1/2)
])
def test_schedule_values_at_step_0_mid_and_end(schedule, mid):
    args = dict(start=3.0, end=1.0, decay_steps=10, schedule=schedule)
    assert _t(0, **args) == pytest.approx(3.0, rel=1e-6)
    assert _t(5, **args) == pytest.approx(mid, rel=1e-6)
    # Exactly the end value from the decay's end on: the run then samples as without it.
    assert _t(10, **args) == 1.0 and _t(10_000, **args) == 1.0
    values = [_t(s, **args) for s in range(11)]
    assert all(a > b for a, b in zip(values, values[1:]))  # strictly descending


def test_schedule_shapes_differ_between_the_ends():
    # A quarter of the way: linear 1 + 2 * 3/4; cosine 1 + 2 * (1 + cos(pi/4)) / 2;
    # exponential 3 * (1/3) ** (1/4); towards another end value (`temperature` 0.5).
    assert _t(2, start=3.0, end=1.0, decay_steps=8) == pytest.approx(2.5, rel=1e-6)
    assert _t(2, start=3.0, end=1.0, decay_steps=8, schedule="cosine") == pytest.approx(
        1.0 + (1.0 + math.cos(math.pi / 4)), rel=1e-6)
    assert _t(2, start=3.0, end=1.0, decay_steps=8, schedule="exponential") == pytest.approx(
        3.0 * (1.0 / 3.0) ** 0.25, rel=1e-6)
    assert _t(4, start=2.0, end=0.5, decay_steps=8) == pytest.approx(1.25, rel=1e-6)


def test_the_step_is_a_tensor_of_the_compiled_function():
    compiled = tf.function(lambda step: temperature_at(step, start=3.0, end=1.0, decay_steps=10))
    values = [float(compiled(tf.constant(s))) for s in (0, 5, 10)]
    assert values == pytest.approx([3.0, 2.0, 1.0], rel=1e-6)
    assert compiled.experimental_get_tracing_count() == 1  # one trace: nothing baked in


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="schedule must be one of"):
        temperature_at(0, start=2.0, end=1.0, decay_steps=10, schedule="step")
    with pytest.raises(ValueError, match="decay_steps"):
        temperature_at(0, start=2.0, end=1.0, decay_steps=0)


# --- In the model --------------------------------------------------------------------------------
def _model(**hparams):
    keras.utils.set_random_seed(1)
    model = ElectraPretrainer.from_pretraining_config(
        tiny_config(overrides=NO_DROPOUT, num_train_steps=10, **hparams), SPECIAL)
    model.build_from_sequence_length(SEQ)
    return model


def _samples(model, step, training=True):
    outputs = model(batch(), seed=tf.constant([7, step]), training=training)
    return outputs["metric_inputs"]["sampled_tokids"].numpy(), float(outputs["disc_loss"])


def test_a_training_call_samples_at_the_temperature_of_its_step():
    curriculum = _model(temperature_start=8.0)  # decays over num_train_steps = 10
    for step, temperature in ((0, 8.0), (5, 4.5)):
        constant = _model(temperature=temperature)
        ids, loss = _samples(curriculum, step)
        expected_ids, expected_loss = _samples(constant, step)
        np.testing.assert_array_equal(ids, expected_ids)
        assert loss == expected_loss
    official = _model()
    assert not np.array_equal(_samples(curriculum, 0)[0], _samples(official, 0)[0])
    # Evaluation (training=False) samples at the end value, `temperature`, whatever the step.
    np.testing.assert_array_equal(_samples(curriculum, 0, training=False)[0],
                                  _samples(official, 0, training=False)[0])


def test_the_compiled_step_reads_the_step_from_its_seed():
    curriculum = _model(temperature_start=8.0)

    @tf.function
    def sampled(seed):
        return curriculum(batch(), seed=seed, training=True)["metric_inputs"]["sampled_tokids"]

    for step, temperature in ((0, 8.0), (5, 4.5), (10, 1.0)):
        np.testing.assert_array_equal(sampled(tf.constant([7, step])),
                                      _samples(_model(temperature=temperature), step)[0])
    assert sampled.experimental_get_tracing_count() == 1


def test_config_keeps_the_variants():
    """(Its round trip, and the rebuilt frozen generator's: test_layers_backends.py,
    PRETRAINER_VARIANTS["temperature_curriculum_frozen_generator"].)"""
    model = _model(temperature_start=2.0, temperature_schedule="cosine", frozen_generator_dir="/x")
    config = model.get_config()
    assert (config["temperature_start"], config["temperature_decay_steps"],
            config["temperature_schedule"], config["frozen_generator"]) == (2.0, 10, "cosine", True)


def test_a_frozen_generator_has_no_trainable_variable_and_no_gradient_path():
    gen_weight_1 = _model(frozen_generator_dir="/x", gen_weight=1.0)
    gen_weight_0 = _model(frozen_generator_dir="/x", gen_weight=0.0)
    frozen = [id(v) for v in gen_weight_1.generator.weights + gen_weight_1.generator_head.weights]
    assert frozen and not set(frozen) & {id(v) for v in gen_weight_1.trainable_variables}
    # Its own embedding block, at the run's embedding width (a projection to its hidden size).
    assert gen_weight_1.generator.embeddings is not gen_weight_1.discriminator.embeddings
    assert gen_weight_1.generator.embedding_size == 32 and gen_weight_1.generator.hidden_size == 16

    def gradients(model):
        with tf.GradientTape() as tape:
            loss = model(batch(), seed=tf.constant([7, 3]), training=True)["total_loss"]
        return tape.gradient(loss, model.trainable_variables)

    # The MLM term (gen_weight 1) is a constant: the discriminator's gradients are the same.
    for a, b in zip(gradients(gen_weight_1), gradients(gen_weight_0)):
        np.testing.assert_array_equal(tf.convert_to_tensor(a), tf.convert_to_tensor(b))
