"""Objective variants in the trainers (issue 34): a GDES run and a decoupled-optimizer run each
resume bit for bit (the two-halves check of test_trainer.py), and train as documented."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config.hparams import ConfigError
from electra_tf.training import optimization
from electra_tf.training.tf import trainer as trainer_lib
from electra_tf.training.optimizers import AdamWeightDecay
from electra_tf.training.pretrainer import ElectraPretrainer
from tests import pretraining_fixtures as fx
from tests.pretraining.test_pretrainer import SEQ, SPECIAL, batch, tiny_config
from tests.training.test_trainer import _state

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest

# 6 steps, a checkpoint at 3: the second half restores it in a new Trainer.
RUN = dict(num_train_steps=6, save_checkpoints_steps=3, iterations_per_loop=2, keep_checkpoint_max=2)


def _resume_is_bit_identical(data_dir, name, **hparams):
    """Trains RUN uninterrupted and in two halves (a new Trainer from ckpt-3); asserts every
    weight and optimizer variable equal. Returns the uninterrupted trainer."""
    whole = trainer_lib.Trainer(fx.tiny_config(data_dir, name + "_whole", **RUN, **hparams))
    whole.train()
    config = fx.tiny_config(data_dir, name + "_halves", **RUN, **hparams)
    first = trainer_lib.Trainer(config)
    first.train(stop_at_step=3)
    del first
    second = trainer_lib.Trainer(config)
    assert second.restored_from.endswith("ckpt-3") and second.step == 3
    second.train()
    a, b = _state(whole), _state(second)
    assert a["step"] == b["step"] == 6
    assert len(a["optimizer"]) == len(b["optimizer"])
    for x, y in zip(a["weights"] + a["optimizer"], b["weights"] + b["optimizer"]):
        np.testing.assert_array_equal(x, y)
    assert a["fingerprint"] == b["fingerprint"]
    return whole


def test_gdes_run_resumes_exactly_and_learns_its_deltas(data_dir):
    trainer = _resume_is_bit_identical(data_dir, "gdes", embedding_sharing="gdes")
    deltas = trainer.model.discriminator.embeddings.deltas()
    assert all(np.abs(d.numpy()).max() > 0 for d in deltas)  # trained (they start at zero)
    paths = [v.path for v in trainer.model.trainable_variables]
    assert "electra/disentangled_embeddings/word_delta" in paths


# --- decoupled_optimizers -------------------------------------------------------------------------
def _decoupled_model_and_config(**hparams):
    config = tiny_config(decoupled_optimizers=True, num_warmup_steps=0, num_train_steps=10,
                         learning_rate=1e-3, **hparams)
    keras.utils.set_random_seed(1)
    model = ElectraPretrainer.from_pretraining_config(config, SPECIAL)
    model.build_from_sequence_length(SEQ)
    return config, model


def _gradients(model, step):
    with tf.GradientTape() as tape:
        loss = model(batch(seed=step), seed=tf.constant([5, step]), training=True)["total_loss"]
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("sharing", ["tied", "gdes"])
def test_decoupled_optimizers_are_two_optimizers_with_their_own_rates_slots_and_clips(sharing):
    """Two steps of the decoupled optimizer equal two steps of two separate AdamW optimizers,
    one per side (own schedule, own slots, own global-norm clip), on a copy of the model."""
    config, model = _decoupled_model_and_config(generator_learning_rate=3e-4,
                                                embedding_sharing=sharing)
    _, twin = _decoupled_model_and_config(generator_learning_rate=3e-4, embedding_sharing=sharing)
    generator_ids = {id(v) for v in model.generator_variables()}
    assert generator_ids and len(generator_ids) < len(model.trainable_variables)
    block = model.shared_embeddings.word_embeddings.embeddings
    # GDES: the generator's loss alone updates the block, so it is the generator's; tied: both
    # losses reach it, and it stays with the discriminator's variables (`electra/embeddings`).
    assert (id(block) in generator_ids) == (sharing == "gdes")

    optimizer, schedule = optimization.create_optimizer(
        config, generator_variables=model.generator_variables())
    optimizer.build(model.trainable_variables)
    sides = {}
    for side, rate in (("generator", 3e-4), ("discriminator", 1e-3)):
        variables = [v for v in twin.trainable_variables
                     if (id(v) in {id(w) for w in twin.generator_variables()}) == (side == "generator")]
        reference = AdamWeightDecay(optimization.WarmupPolynomialDecay(rate, 10, 0), name=side)
        reference.build(variables)
        sides[side] = (reference, variables)
    for step in range(2):
        optimization.apply_gradients(optimizer, _gradients(model, step), model.trainable_variables)
        grads = dict(zip([id(v) for v in twin.trainable_variables], _gradients(twin, step)))
        for reference, variables in sides.values():
            side_grads = [grads[id(v)] for v in variables]
            present = [i for i, g in enumerate(side_grads) if g is not None]
            clipped = optimization.clip_by_global_norm([side_grads[i] for i in present])
            reference.apply(clipped.gradients, [variables[i] for i in present])
    for a, b in zip(model.trainable_variables, twin.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.path)
    # Own slots: a generator variable's slots are its side's; own rates: the schedules differ.
    generator_kernel = model.generator.encoder_layers[0]._feedforward_output_dense.kernel
    twin_kernel = twin.generator.encoder_layers[0]._feedforward_output_dense.kernel
    np.testing.assert_allclose(optimizer.get_slot(generator_kernel, "adam_m").numpy(),
                               sides["generator"][0].get_slot(twin_kernel, "adam_m").numpy(),
                               rtol=1e-6, atol=1e-9)
    index = optimizer._get_variable_index(generator_kernel)
    assert float(optimizer._side_learning_rate(schedule(0), index)) == pytest.approx(3e-4 * (1 - 2 / 10))


def test_decoupled_generator_rate_zero_freezes_only_the_generator():
    config, model = _decoupled_model_and_config(generator_learning_rate=0.0)
    optimizer, _ = optimization.create_optimizer(config, generator_variables=model.generator_variables())
    optimizer.build(model.trainable_variables)
    before = [v.numpy().copy() for v in model.trainable_variables]
    optimization.apply_gradients(optimizer, _gradients(model, 0), model.trainable_variables)
    generator_ids = {id(v) for v in model.generator_variables()}
    for v, old in zip(model.trainable_variables, before):
        changed = not np.array_equal(v.numpy(), old)
        if id(v) in generator_ids:
            assert not changed, v.path
    assert any(not np.array_equal(v.numpy(), old) for v, old in zip(model.trainable_variables, before)
               if id(v) not in generator_ids)


@pytest.mark.parametrize("hparams, named", [
    ({"generator_learning_rate": 1e-4}, "decoupled_optimizers"),
    ({"decoupled_optimizers": True, "uniform_generator": True}, "uniform_generator"),
    ({"decoupled_optimizers": True, "electra_objective": False}, "electra_objective"),
    ({"decoupled_optimizers": True, "untied_generator": False}, "untied_generator"),
    ({"decoupled_optimizers": True, "two_stage_generator_dir": "/tmp/stage1",
      "untied_generator_embeddings": True, "generator_hidden_size": 1.0, "embedding_size": 64},
     "two_stage_generator_dir"),
    ({"decoupled_optimizers": True, "generator_learning_rate": -1.0}, "generator_learning_rate"),
])
def test_decoupled_nonsensical_combinations_are_one_line_errors(hparams, named):
    with pytest.raises(ConfigError) as error:
        tiny_config(**hparams)
    message = str(error.value)
    assert named in message and "\n" not in message
    assert "decoupled_optimizers" in message or "generator_learning_rate" in message


def test_decoupled_run_resumes_exactly(data_dir):
    trainer = _resume_is_bit_identical(data_dir, "decoupled", decoupled_optimizers=True,
                                       generator_learning_rate=1e-4, embedding_sharing="gdes")
    assert trainer.optimizer.decoupled


@pytest.mark.slow
def test_decoupled_run_with_accumulation_resumes_exactly(data_dir):
    _resume_is_bit_identical(data_dir, "decoupled_accumulated", decoupled_optimizers=True,
                             generator_learning_rate=1e-4, gradient_accumulation_steps=2)


DECOUPLED_GDES = dict(decoupled_optimizers=True, generator_learning_rate=1e-4,
                      embedding_sharing="gdes")


def test_decoupled_gdes_two_replicas_match_one_device(data_dir, mirrored_strategy):
    """Under tf.distribute each side's gradient is summed once over replicas, then clipped."""
    hparams = dict(DECOUPLED_GDES, num_train_steps=4, iterations_per_loop=2,
                   save_checkpoints_steps=4, model_hparam_overrides=fx.NO_DROPOUT)
    single = trainer_lib.Trainer(fx.tiny_config(data_dir, "decoupled_one", **hparams))
    initial = [v.numpy() for v in single.model.trainable_variables]
    single.train()
    mirrored = trainer_lib.Trainer(fx.tiny_config(data_dir, "decoupled_two", **hparams),
                                   strategy=mirrored_strategy)
    mirrored.train()
    pairs = list(zip(single.model.trainable_variables, mirrored.model.trainable_variables))
    assert max(float(np.max(np.abs(a.numpy() - b.numpy()))) for a, b in pairs) <= 1e-5
    assert max(float(np.max(np.abs(a.numpy() - b))) for a, b in
               zip(single.model.trainable_variables, initial)) > 1e-3


def test_decoupled_gdes_under_loss_scaling(data_dir):
    """mixed_float16: the LossScaleOptimizer unscales before the per-side clips."""
    trainer = trainer_lib.Trainer(fx.tiny_config(
        data_dir, "decoupled_fp16", mixed_precision="mixed_float16", num_train_steps=2,
        iterations_per_loop=2, save_checkpoints_steps=2, **DECOUPLED_GDES))
    scalars = trainer.train()
    assert trainer.step == 2 and all(np.isfinite(v) for v in scalars.values())
    assert trainer.optimizer.inner_optimizer.decoupled
    deltas = trainer.model.discriminator.embeddings.deltas()
    assert any(np.abs(d.numpy()).max() > 0 for d in deltas)
