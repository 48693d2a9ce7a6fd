"""Fast-ELECTRA in the trainer (issue 34): `frozen_generator_dir` takes a finished run's masked LM
as a frozen generator, `temperature_start` decays the sampling temperature.

Asserted: the copied weights (from an MLM-only run and from an ELECTRA run's tied generator),
a generator that stays bit-identical through training, a resume, mixed precision, gradient
accumulation and two replicas, and that is in neither the trainable nor the optimizer's
variables; a resumed run equal to an uninterrupted one; the logged temperature; the converters'
layout; and one-line errors for every combination that makes no sense.
"""

import numpy as np
import pytest

from electra_tf.convert import hf, names
from electra_tf.config.hparams import ConfigError
from electra_tf.training.tf import trainer as trainer_lib
from tests import pretraining_fixtures as fx
from tests.training.test_trainer import _state

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest

# The tiny ELECTRA model's generator (fx.TINY_HPARAMS: hidden 64, 2 layers, embedding 32;
# generator_hidden_size 0.25): hidden 16, 2 layers, 1 head, FFN 64, embedding 32 (a projection).
GENERATOR_SIZES = {"model_hparam_overrides": {"hidden_size": 16, "num_hidden_layers": 2}}
CURRICULUM = {"temperature_start": 3.0, "gen_weight": 0.0}
RUN = dict(num_train_steps=6, save_checkpoints_steps=3, iterations_per_loop=3,
           keep_checkpoint_max=2)


@pytest.fixture(scope="module")
def mlm_source(data_dir):
    """Stage 1: an MLM-only run of the generator's sizes."""
    trainer = trainer_lib.Trainer(fx.tiny_config(
        data_dir, "generator_mlm", electra_objective=False, num_train_steps=2,
        iterations_per_loop=2, **GENERATOR_SIZES))
    trainer.train()
    return trainer


def _assert_frozen_copy(trainer, source_encoder, source_head):
    model = trainer.model
    fx.assert_same_weights(fx.layer_weights(model.generator), fx.layer_weights(source_encoder))
    fx.assert_same_weights(fx.layer_weights(model.generator_head), fx.layer_weights(source_head))
    frozen = {id(v) for v in model.generator.weights + model.generator_head.weights}
    assert not frozen & {id(v) for v in model.trainable_variables}
    optimizer = getattr(trainer.optimizer, "inner_optimizer", trainer.optimizer)
    assert not frozen & {id(v) for v in optimizer._trainable_variables}  # no slots, no decay


@pytest.mark.slow
def test_frozen_generator_stays_bit_identical_and_the_run_resumes_exactly(data_dir, mlm_source):
    hparams = dict(RUN, frozen_generator_dir=mlm_source.config.model_dir, **CURRICULUM)
    whole = trainer_lib.Trainer(fx.tiny_config(data_dir, "fast_whole", **hparams))
    initial_disc = fx.layer_weights(whole.model.discriminator)
    scalars = whole.train()
    _assert_frozen_copy(whole, mlm_source.model.discriminator, mlm_source.model.generator_head)
    assert any(not np.array_equal(a, b)
               for a, b in zip(fx.layer_weights(whole.model.discriminator), initial_disc))
    # The last loop's last step was step 5 of 6: T = 1 + (3 - 1) * (1 - 5/6), beside the rate.
    assert scalars["temperature"] == pytest.approx(1.0 + 2.0 / 6.0, rel=1e-6)

    config = fx.tiny_config(data_dir, "fast_halves", **hparams)
    with trainer_lib.Trainer(config) as first:
        first.train(stop_at_step=3)
    second = trainer_lib.Trainer(config)  # resumes ckpt-3: no copy, frozen again when built
    assert second.step == 3
    second.train()
    _assert_frozen_copy(second, mlm_source.model.discriminator, mlm_source.model.generator_head)
    a, b = _state(whole), _state(second)
    assert a["step"] == b["step"] == 6 and len(a["optimizer"]) == len(b["optimizer"])
    for x, y in zip(a["weights"] + a["optimizer"], b["weights"] + b["optimizer"]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_an_electra_runs_tied_generator_becomes_the_frozen_generator(data_dir, tmp_path):
    source = trainer_lib.Trainer(fx.tiny_config(data_dir, "electra_source", num_train_steps=1,
                                                iterations_per_loop=1))
    source.train()
    trainer = trainer_lib.Trainer(fx.tiny_config(
        data_dir, "fast_from_electra", num_train_steps=1,
        frozen_generator_dir=source.config.model_dir))
    # Its embeddings are copied out of the block the source's generator shared.
    _assert_frozen_copy(trainer, source.model.generator, source.model.generator_head)
    assert trainer.model.generator.embeddings is not trainer.model.discriminator.embeddings
    # The converters see a generator with embeddings of its own (the untied layout).
    weights = names.get_official_weights(trainer.model)
    np.testing.assert_array_equal(weights["generator/embeddings/word_embeddings"],
                                  source.model.shared_embeddings.get_weights()[0])
    state = hf.hf_state_dict(weights, "generator")
    np.testing.assert_array_equal(state["electra.embeddings.word_embeddings.weight"],
                                  weights["generator/embeddings/word_embeddings"])

    wrong_size = r"does not match this model's sizes \(hidden 16, 2 layers, embedding 32 there"
    with pytest.raises(trainer_lib.TrainingError, match=wrong_size):
        trainer_lib.Trainer(fx.tiny_config(data_dir, "fast_wrong_size", num_train_steps=1,
                                           generator_hidden_size=0.5,
                                           frozen_generator_dir=source.config.model_dir))
    with pytest.raises(trainer_lib.TrainingError, match="frozen_generator_dir: .*no config.json"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, "fast_missing", num_train_steps=1,
                                           frozen_generator_dir=str(tmp_path)))


@pytest.mark.slow
def test_mixed_precision_accumulation_and_two_replicas_leave_it_frozen(data_dir, mlm_source,
                                                                       mirrored_strategy):
    source = mlm_source.config.model_dir
    for name, strategy, hparams in (
            ("fast_bf16_k2", None, {"mixed_precision": "mixed_bfloat16",
                                    "gradient_accumulation_steps": 2}),
            ("fast_mirrored", mirrored_strategy, {})):
        trainer = trainer_lib.Trainer(fx.tiny_config(
            data_dir, name, num_train_steps=2, iterations_per_loop=2, frozen_generator_dir=source,
            **CURRICULUM, **hparams), strategy)
        trainer.train()
        _assert_frozen_copy(trainer, mlm_source.model.discriminator,
                            mlm_source.model.generator_head)


@pytest.mark.parametrize("hparams, message", [
    ({"frozen_generator_dir": "/g", "two_stage_generator_dir": "/s",
      "untied_generator_embeddings": True, "generator_hidden_size": 1.0, "embedding_size": 64},
     "two_stage_generator_dir and frozen_generator_dir both"),
    ({"frozen_generator_dir": "/g", "uniform_generator": True},
     "frozen_generator_dir .* uniform_generator false"),
    ({"frozen_generator_dir": "/g", "electra_objective": False},
     "frozen_generator_dir .* needs electra_objective"),
    ({"frozen_generator_dir": "/g", "untied_generator": False},
     "frozen_generator_dir .* untied_generator"),
    ({"frozen_generator_dir": "/g", "embedding_sharing": "gdes"},
     "embedding_sharing=gdes with frozen_generator_dir"),
    ({"frozen_generator_dir": "/g", "decoupled_optimizers": True},
     "decoupled_optimizers with frozen_generator_dir"),
    ({"temperature_decay_steps": 10}, "temperature_decay_steps and temperature_schedule .* "
                                      "set temperature_start"),
    ({"temperature_schedule": "cosine"}, "set temperature_start"),
    ({"temperature_start": 2.0, "temperature_schedule": "step"},
     "temperature_schedule must be one of linear, cosine, exponential"),
    ({"temperature_start": 0.0}, "temperature_start must be > 0"),
    ({"temperature_start": 2.0, "temperature_decay_steps": 0}, "temperature_decay_steps must be"),
    ({"temperature_start": 2.0, "uniform_generator": True},
     "temperature_start .* uniform_generator false"),
    ({"temperature_start": 2.0, "electra_objective": False},
     "temperature_start .* needs electra_objective"),
])
def test_combinations_that_make_no_sense_are_one_line_errors(hparams, message):
    with pytest.raises(ConfigError, match=message) as error:
        fx.tiny_config("/nonexistent", **hparams)
    assert "\n" not in str(error.value)


def test_the_curriculum_is_allowed_with_a_jointly_trained_generator():
    config = fx.tiny_config("/nonexistent", temperature_start=2.0, num_train_steps=50)
    assert config.temperature_start == 2.0 and config.temperature_decay_steps is None


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_source_without_a_checkpoint_names_the_hparam_not_a_flag(data_dir, backend):
    """The source run has config.json but no checkpoint: the advice is the hparam to change, not
    the converters' --checkpoint, which run_pretraining.py and fine-tuning do not have (issue
    47)."""
    import os

    from electra_tf.errors import TrainingError
    from electra_tf.finetuning import pretrained
    from electra_tf.finetuning.config import FinetuningConfig
    from electra_tf.training import frozen_generator

    source = fx.tiny_config(data_dir, f"no_checkpoint_{backend}", electra_objective=False,
                            backend=backend, **GENERATOR_SIZES)
    os.makedirs(source.model_dir)
    source.save(os.path.join(source.model_dir, "config.json"))
    config = fx.tiny_config(data_dir, "fast", frozen_generator_dir=source.model_dir)
    with pytest.raises(TrainingError) as error:
        frozen_generator.start(None, config, None, fresh=True)
    message = str(error.value)
    assert message.startswith("frozen_generator_dir: no checkpoint ") and "train first" in message
    assert message.endswith("point frozen_generator_dir at a run that has one"), message
    assert "--checkpoint" not in message
    finetuning = FinetuningConfig.create("ft", data_dir, {"task_names": ["sts"],
                                                          "init_checkpoint": source.model_dir})
    with pytest.raises(pretrained.PretrainedError) as error:
        pretrained.load_pretrained(finetuning)
    message = str(error.value)
    assert message.endswith("set init_checkpoint to a checkpoint prefix"), message
    assert "--checkpoint" not in message
