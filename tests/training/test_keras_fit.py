"""`ElectraPretrainer.compile()` / `fit()` / `evaluate()` against `run_pretraining.py`'s loop.

The reference is the Trainer's compiled loop (`Trainer.train_loop`, what `run_pretraining.py`
runs) on the project's TFRecord pipeline. `fit()` on the same config, seed and batches must give
the same per-step losses and the same weights; `evaluate()` the same official metrics as
`Trainer.evaluate()`; under MirroredStrategy (two logical CPU devices) the same as one device.
Gradient accumulation is tested in test_accumulation.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.records import pipeline
from electra_tf.pretraining.metrics import METRIC_NAMES
from electra_tf.training import optimization
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.training.tf import keras_fit, trainer as trainer_lib
from electra_tf.vocab import load_vocab
from tests import pretraining_fixtures as fx

pytestmark = pytest.mark.usefixtures("float32_policy")

STEPS = 3
LOSS_KEYS = ("total_loss", "masked_lm_loss", "disc_loss")


def config_for(data_dir, name, **overrides):
    """A tiny config running STEPS steps in one compiled loop."""
    overrides = dict(dict(num_train_steps=STEPS, iterations_per_loop=STEPS,
                          save_checkpoints_steps=STEPS), **overrides)
    return fx.tiny_config(data_dir, name, **overrides)


def loop_run(config, strategy=None, steps=STEPS):
    """The Trainer and the per-step values (numpy) of `steps` steps of its compiled loop."""
    trainer = trainer_lib.Trainer(config, strategy)
    done, history = trainer.train_loop()(trainer.train_iterator, tf.constant(steps))
    assert int(done) == steps
    return trainer, {k: v.numpy() for k, v in history.items()}


def fit_model(config, strategy=None, **compile_kwargs):
    """An ElectraPretrainer built and compiled as the Trainer builds its model and optimizer."""
    strategy = strategy or tf.distribute.get_strategy()
    vocab = load_vocab(config.vocab_file)
    keras.utils.set_random_seed(config.seed)  # as the Trainer: weight init and dropout
    with strategy.scope():
        model = ElectraPretrainer.from_pretraining_config(config, vocab.special, vocab.tokens)
        model.build_from_sequence_length()
        optimizer = optimization.create_optimizer(config, config.optimizer).optimizer
        model.compile(optimizer=optimizer, **compile_kwargs)
    return model


def fit_steps(model, config, steps=STEPS):
    """`steps` fit() steps, one per epoch so each epoch's logs are one step's values."""
    history = model.fit(keras_fit.training_dataset(config), steps_per_epoch=1, epochs=steps, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == steps
    return history.history


def max_difference(a_vars, b_vars) -> float:
    assert [np.shape(a) for a in a_vars] == [np.shape(b) for b in b_vars]
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(a_vars, b_vars))


@pytest.fixture(scope="module")
def reference(data_dir):
    """run_pretraining.py's loop, dropout on (the default), one device."""
    return loop_run(config_for(data_dir, "loop"))


@pytest.mark.slow  # ~50 s on a loaded 2-core machine (with the reference run)
def test_fit_gives_the_custom_loops_losses_and_weights(data_dir, reference):
    trainer, loop_history = reference
    config = config_for(data_dir, "fit")
    model = fit_model(config)
    initial = [v.numpy() for v in model.trainable_variables]
    history = fit_steps(model, config)

    # The same step (seed, masks, samples, dropout, clip, AdamWeightDecay): the same numbers,
    # up to float rounding of two differently traced graphs (measured: losses within 1e-6, a
    # few weights 1 ulp apart, e.g. a LayerNorm gamma near 1.0 by 1.2e-7). Two runs of the
    # same loop are bit-identical (test_reliability_resume.py compares the weights' sha256).
    np.testing.assert_allclose(history["loss"], loop_history["total_loss"], rtol=1e-6)
    assert set(history) == {"loss", *METRIC_NAMES}
    for fit_weight, loop_weight in zip(model.trainable_variables,
                                       trainer.model.trainable_variables):
        np.testing.assert_allclose(fit_weight.numpy(), loop_weight.numpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=fit_weight.path)
    # Dropout RNG states advanced alike (a mismatch in draws would show here first).
    assert max_difference(model.non_trainable_variables,
                          trainer.model.non_trainable_variables) == 0
    assert max_difference(model.trainable_variables, initial) > 1e-3  # it did train
    assert int(model.optimizer.iterations.numpy()) == trainer.step == STEPS


@pytest.mark.slow  # ~30 s (and the reference run)
def test_evaluate_gives_the_trainers_official_metrics(data_dir, reference):
    trainer, _ = reference
    expected = trainer.evaluate()
    model = fit_model(config_for(data_dir, "evaluate"))
    for mine, theirs in zip(model.variables, trainer.model.variables):
        mine.assign(theirs)
    config = trainer.config
    eval_data = pipeline.make_dataset(config.eval_tfrecords, batch_size=config.eval_batch_size,
                                      max_seq_length=config.max_seq_length, is_training=False,
                                      seed=config.seed)
    for _ in range(2):  # evaluation seeds restart with every evaluate()
        results = model.evaluate(eval_data, steps=config.num_eval_steps, verbose=0,
                                 return_dict=True)
        assert set(results) == {"loss", *METRIC_NAMES}
        for key in ("loss", *METRIC_NAMES):
            assert results[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key


@pytest.mark.slow  # ~80 s
def test_fit_under_mirrored_strategy_matches_the_loop_on_one_device(data_dir, mirrored_strategy):
    # Dropout off: Keras draws dropout per replica (see test_trainer_distributed.py).
    no_dropout = dict(model_hparam_overrides=fx.NO_DROPOUT)
    single, loop_history = loop_run(config_for(data_dir, "loop_nodrop", **no_dropout))
    config = config_for(data_dir, "fit_mirrored", **no_dropout)
    model = fit_model(config, mirrored_strategy)
    assert model.distribute_strategy.num_replicas_in_sync == 2
    history = fit_steps(model, config)
    # Two partial gradient sums and an all-reduce: float round-off only (bound as
    # test_trainer_distributed.py, far below a wrong split or a doubled gradient).
    np.testing.assert_allclose(history["loss"], loop_history["total_loss"], rtol=1e-5)
    assert max_difference(model.trainable_variables, single.model.trainable_variables) <= 1e-5


def test_compile_refuses_losses_metrics_and_keras_accumulation(data_dir):
    config = config_for(data_dir, "refusals")
    vocab = load_vocab(config.vocab_file)
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special, vocab.tokens)
    optimizer = optimization.create_optimizer(config).optimizer
    with pytest.raises(ValueError, match="loss, metrics not accepted"):
        model.compile(optimizer=optimizer, loss="mse", metrics=["accuracy"])
    with pytest.raises(ValueError, match="accumulates gradients itself"):
        model.compile(optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2))
    with pytest.raises((RuntimeError, ValueError), match="compile"):
        model.fit(keras_fit.training_dataset(config), steps_per_epoch=1, verbose=0)
