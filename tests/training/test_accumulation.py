"""Gradient accumulation: k micro-batches give the update of one k-times-larger batch.

`gradient_accumulation_steps = k` keeps `train_batch_size` the batch of one update and runs it in
k micro-batches (`training/tf/accumulation.py`). The reference is the same config with k = 1. The
path includes the official global-norm clip (the gradient norm is > 1 here, so it clips) and
AdamWeightDecay's decoupled weight decay (rate and learning rate raised so that applying it per
micro-batch would move the weights far beyond the tolerance). Dropout is off: a different batch
layout draws other dropout masks (as with several replicas, test_trainer_distributed.py).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.training.tf import keras_fit, train_step, trainer as trainer_lib
from tests import pretraining_fixtures as fx
from tests.pretraining.test_pretrainer import batch, make_model
from tests.training.test_keras_fit import STEPS, config_for, fit_model, loop_run, max_difference

pytestmark = pytest.mark.usefixtures("float32_policy")

K = 2
LEARNING_RATE, WEIGHT_DECAY = 5e-3, 0.1
ACCUMULATION = dict(model_hparam_overrides=fx.NO_DROPOUT, learning_rate=LEARNING_RATE,
                    weight_decay_rate=WEIGHT_DECAY, num_warmup_steps=0)
# Float round-off of another summation order (micro-batch sums, all-reduce), amplified by Adam's
# 1/sqrt(v) on near-zero gradients; measured <= 2e-6. Weight decay applied once per micro-batch
# instead of once per update would add lr * rate * |w| ~ 5e-4 * |w| per step.
WEIGHT_TOLERANCE = 2e-5
LOSS_RTOL = 1e-5


def accumulated_config(data_dir, name, k=K, **overrides):
    return config_for(data_dir, name, gradient_accumulation_steps=k,
                      **dict(ACCUMULATION, **overrides))


# --- The forward-backward pass (fast) ------------------------------------------------------------
def _forward_backward(model, k, inputs, seed):
    settings = keras_fit.FitSettings(seed=0, jit_compile=False, gradient_accumulation_steps=k)
    ctx = train_step.make_step_context(model, keras.optimizers.Adam(), None, None,
                                       tf.distribute.get_strategy(), settings, lambda b: b)
    return tf.function(ctx.forward_backward)(inputs, seed)


@pytest.mark.slow  # ~35 s on a loaded 2-core machine (tracing the accumulation loop)
def test_micro_batches_sum_to_the_whole_batch_gradient(k=4):
    model = make_model(overrides=fx.NO_DROPOUT)
    inputs = {key: tf.constant(v) for key, v in batch(8, seed=4).items()}
    seed = tf.constant([5, 9], tf.int64)
    whole, whole_grads = _forward_backward(model, 1, inputs, seed)
    micro, micro_grads = _forward_backward(model, k, inputs, seed)
    # The losses are the whole batch's (each micro-batch divides by the WHOLE batch's weights),
    # not the mean of k separately normalised micro-batch losses.
    for key in train_step.LOSS_KEYS:
        assert float(micro[key]) == pytest.approx(float(whole[key]), rel=LOSS_RTOL), key
    # Same masks and samples for every example (keyed by its index in the batch).
    for key, value in whole["metric_inputs"].items():
        np.testing.assert_allclose(micro["metric_inputs"][key], value, rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    assert [g is None for g in micro_grads] == [g is None for g in whole_grads]
    norm = float(tf.linalg.global_norm([g for g in whole_grads if g is not None]))
    assert norm > 1.0  # the official clip at 1.0 acts on this step
    for a, b, variable in zip(micro_grads, whole_grads, model.trainable_variables):
        if b is not None:
            np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b),
                                       rtol=1e-4, atol=1e-6 * norm, err_msg=variable.path)


def test_micro_batches_must_divide_the_batch():
    model = make_model(overrides=fx.NO_DROPOUT)
    inputs = {key: tf.constant(v) for key, v in batch(6, seed=4).items()}
    with pytest.raises(ValueError, match="does not divide the per-replica batch of 6 rows"):
        _forward_backward(model, 4, inputs, tf.constant([5, 9], tf.int64))


def test_config_and_trainer_refuse_a_batch_k_does_not_divide(data_dir, mirrored_strategy):
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be >= 1 and divide"):
        accumulated_config(data_dir, "bad_k", k=3)
    # 8 rows: 2 replicas x 4 micro-batches would leave one row per micro-batch; 8 does not
    # split into 2 x 8.
    with pytest.raises(trainer_lib.TrainingError, match="replica\\(s\\) x gradient_accumulation"):
        trainer_lib.Trainer(accumulated_config(data_dir, "bad_split", k=8), mirrored_strategy)


# --- Whole training steps: custom loop, fit(), MirroredStrategy, resume --------------------------
@pytest.fixture(scope="module")
def one_batch(data_dir):
    """The reference: k = 1, one device, run_pretraining.py's loop."""
    return loop_run(accumulated_config(data_dir, "k1", k=1))


@pytest.fixture(scope="module")
def accumulated_loop(data_dir):
    return loop_run(accumulated_config(data_dir, "k2"))


def _assert_same_update(history_losses, weights, one_batch):
    reference, reference_history = one_batch
    np.testing.assert_allclose(history_losses, reference_history["total_loss"], rtol=LOSS_RTOL)
    assert max_difference(weights, reference.model.trainable_variables) <= WEIGHT_TOLERANCE


@pytest.mark.slow  # the reference run: ~30 s on a loaded 2-core machine
def test_reference_clips_and_decays(one_batch):
    trainer, history = one_batch
    assert (history["grad_norm"] > 1.0).all()  # every step clipped
    assert trainer.optimizer.weight_decay_rate == WEIGHT_DECAY
    # Decay applied k times instead of once per step would move the largest kernel weights by
    # (k - 1) * lr * rate * |w| per step (lr decays linearly: > lr / 2 over these steps).
    largest = max(float(np.max(np.abs(v.numpy()))) for v in trainer.model.trainable_variables
                  if "kernel" in v.path)
    assert (K - 1) * LEARNING_RATE * WEIGHT_DECAY * largest > 5 * WEIGHT_TOLERANCE


@pytest.mark.slow  # ~35 s (and the reference)
def test_custom_loop_accumulation_is_one_larger_batch(accumulated_loop, one_batch):
    trainer, history = accumulated_loop
    _assert_same_update(history["total_loss"], trainer.model.trainable_variables, one_batch)
    np.testing.assert_allclose(history["grad_norm"], one_batch[1]["grad_norm"], rtol=1e-4)
    np.testing.assert_array_equal(history["tokens"], one_batch[1]["tokens"])  # the same batches
    assert trainer.step == STEPS  # one optimizer step per batch, not per micro-batch


@pytest.mark.slow  # ~60 s on a loaded 2-core machine
def test_custom_loop_accumulation_under_mirrored_strategy(data_dir, mirrored_strategy, one_batch):
    trainer, history = loop_run(accumulated_config(data_dir, "k2_mirrored"), mirrored_strategy)
    _assert_same_update(history["total_loss"], trainer.model.trainable_variables, one_batch)
    np.testing.assert_allclose(history["grad_norm"], one_batch[1]["grad_norm"], rtol=1e-4)


@pytest.mark.slow  # ~45 s
def test_fit_accumulation_is_one_larger_batch(data_dir, one_batch):
    config = accumulated_config(data_dir, "fit_k2", k=1)
    model = fit_model(config, gradient_accumulation_steps=K)
    history = model.fit(keras_fit.training_dataset(config), steps_per_epoch=1, epochs=STEPS,
                        verbose=0).history
    _assert_same_update(history["loss"], model.trainable_variables, one_batch)


@pytest.mark.slow  # ~90 s
def test_fit_accumulation_under_mirrored_strategy(data_dir, mirrored_strategy, one_batch):
    config = accumulated_config(data_dir, "fit_k2_mirrored", k=1)
    model = fit_model(config, mirrored_strategy, gradient_accumulation_steps=K)
    history = model.fit(keras_fit.training_dataset(config), steps_per_epoch=1, epochs=STEPS,
                        verbose=0).history
    _assert_same_update(history["loss"], model.trainable_variables, one_batch)


@pytest.mark.slow  # ~60 s
def test_resumed_accumulating_run_is_bit_identical(data_dir, accumulated_loop, tmp_path):
    uninterrupted, _ = accumulated_loop
    config = accumulated_config(data_dir, "k2", model_dir=str(tmp_path / "resumed"))
    first = trainer_lib.Trainer(config)
    first.train(stop_at_step=STEPS - 1)
    del first
    resumed = trainer_lib.Trainer(config)
    assert resumed.step == STEPS - 1
    resumed.train()
    assert resumed.step == STEPS
    assert resumed.weights_fingerprint() == uninterrupted.weights_fingerprint()
