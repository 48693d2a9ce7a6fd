"""Two-stage training (`two_stage_generator_dir`): stage 2 starts from a stage-1 MLM-only run.

The paper's baseline: train a generator alone with MLM, initialise the discriminator from it,
freeze the generator and train the discriminator. Asserted: the copied weights, a generator that
never moves (also after a restart), a discriminator that does, and clear errors.
"""

import numpy as np
import pytest

from electra_tf.config.hparams import ConfigError
from electra_tf.training.tf import trainer as trainer_lib
from tests import pretraining_fixtures as fx

# embedding_size = hidden_size: a generator with its own embeddings has no projection (official).
SIZES = {"embedding_size": 64}
STAGE2 = {**SIZES, "untied_generator_embeddings": True, "generator_hidden_size": 1.0,
          "generator_layers": 1.0, "gen_weight": 0.0}


pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


@pytest.fixture(scope="module")
def stage1(data_dir):
    trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, "stage1", electra_objective=False, **SIZES,
                                                 num_train_steps=3, iterations_per_loop=3,
                                                 save_checkpoints_steps=3))
    trainer.train()
    return data_dir, trainer


def test_stage2_starts_from_stage1_freezes_the_generator_and_trains_the_discriminator(stage1):
    data_dir, first = stage1
    config = fx.tiny_config(data_dir, "stage2", num_train_steps=6, iterations_per_loop=3,
                            save_checkpoints_steps=3,
                            two_stage_generator_dir=first.config.model_dir, **STAGE2)
    trainer = trainer_lib.Trainer(config)
    encoder = fx.layer_weights(first.model.discriminator)
    head = fx.layer_weights(first.model.generator_head)
    fx.assert_same_weights(fx.layer_weights(trainer.model.generator), encoder)
    fx.assert_same_weights(fx.layer_weights(trainer.model.discriminator), encoder)
    fx.assert_same_weights(fx.layer_weights(trainer.model.generator_head), head)
    assert not trainer.model.generator.trainable and not trainer.model.generator_head.trainable

    trainer.train(stop_at_step=3)
    # Frozen: no gradient, no decay.
    fx.assert_same_weights(fx.layer_weights(trainer.model.generator), encoder)
    fx.assert_same_weights(fx.layer_weights(trainer.model.generator_head), head)
    moved = [not np.array_equal(a, b)
             for a, b in zip(fx.layer_weights(trainer.model.discriminator), encoder)]
    assert any(moved)

    # A restart resumes from the checkpoint (not from stage 1) and freezes the generator again.
    disc_at_3 = fx.layer_weights(trainer.model.discriminator)
    resumed = trainer_lib.Trainer(config)
    assert resumed.step == 3
    fx.assert_same_weights(fx.layer_weights(resumed.model.discriminator), disc_at_3)
    assert not resumed.model.generator.trainable
    resumed.train()
    assert resumed.step == 6
    fx.assert_same_weights(fx.layer_weights(resumed.model.generator), encoder)


def test_stage2_needs_a_discriminator_size_generator_with_its_own_embeddings():
    with pytest.raises(ConfigError, match="two_stage_generator_dir .* generator_hidden_size"):
        fx.tiny_config("/nonexistent", two_stage_generator_dir="/somewhere")
    with pytest.raises(ConfigError, match="two_stage_generator_dir needs embedding_size == hidden_size"):
        fx.tiny_config("/nonexistent", two_stage_generator_dir="/somewhere",
                       **dict(STAGE2, embedding_size=32))


def test_stage2_from_an_electra_run_is_refused(stage1, tmp_path):
    data_dir, _ = stage1
    electra = trainer_lib.Trainer(fx.tiny_config(data_dir, "not_mlm", num_train_steps=1, **SIZES,
                                                 iterations_per_loop=1))
    electra.train()
    with pytest.raises(trainer_lib.TrainingError, match="is an ELECTRA run"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, "stage2_bad", num_train_steps=2,
                                           two_stage_generator_dir=electra.config.model_dir,
                                           **STAGE2))
    with pytest.raises(trainer_lib.TrainingError, match="two_stage_generator_dir"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, "stage2_missing", num_train_steps=2,
                                           two_stage_generator_dir=str(tmp_path / "nothing"),
                                           **STAGE2))
