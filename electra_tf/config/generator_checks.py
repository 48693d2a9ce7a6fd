"""The hparam checks of where the generator comes from and how it samples.

`PretrainingConfig.validate` (`hparam_checks.validate`) calls these for the generator variants:
GDES embedding sharing, decoupled optimizers, two-stage training, the frozen pretrained generator
and the temperature curriculum. Each nonsensical combination is one line naming the hparams. Kept
apart from `hparam_checks.py` (the other hparams' checks) because the variants' rules grow
together.
"""

from __future__ import annotations

MAX_INT32 = 2**31 - 1
# The temperature curriculum's shapes (`pretraining.temperature`). Defined here, not there: the
# config is read before Keras is imported (its backend is chosen from it).
TEMPERATURE_SCHEDULES = ("linear", "cosine", "exponential")


def frozen_source_key(config) -> str:
    """The hparam naming the run a frozen generator comes from ("" when the generator trains)."""
    if config.two_stage_generator_dir:
        return "two_stage_generator_dir"
    return "frozen_generator_dir" if config.frozen_generator_dir else ""


def validate_generator(config, need) -> None:
    """Raises (through `need(condition, message)`) the first nonsensical combination."""
    frozen = frozen_source_key(config)
    need(not (config.two_stage_generator_dir and config.frozen_generator_dir),
         "two_stage_generator_dir and frozen_generator_dir both start a frozen generator from a "
         "finished run: set one (two-stage also copies it into the discriminator)")
    if config.embedding_sharing == "gdes":
        need(not frozen,
             f"embedding_sharing=gdes with {frozen}: "
             + ("stage 2's generator is " if frozen == "two_stage_generator_dir" else
                "the generator is ")
             + "frozen with embeddings of its own, there is no shared block to disentangle")
        need(config.electra_objective and config.untied_generator and not config.uniform_generator
             and not config.untied_generator_embeddings,
             "embedding_sharing=gdes disentangles the embedding block a generator network "
             "shares with the discriminator: needs electra_objective and untied_generator "
             "true, uniform_generator and untied_generator_embeddings false")
    need(config.generator_learning_rate is None or config.decoupled_optimizers,
         "generator_learning_rate is the generator optimizer's: needs decoupled_optimizers "
         "true (without it one optimizer updates both networks at learning_rate)")
    if config.decoupled_optimizers:
        need(not frozen,
             f"decoupled_optimizers with {frozen}: "
             + ("stage 2's generator is " if frozen == "two_stage_generator_dir" else
                "the generator is ")
             + "frozen, only the discriminator has an optimizer")
        need(config.electra_objective and config.untied_generator and not config.uniform_generator,
             "decoupled_optimizers gives the generator network an optimizer of its own: needs "
             "electra_objective and untied_generator true and uniform_generator false")
    if config.two_stage_generator_dir:
        need(config.electra_objective and config.untied_generator
             and config.untied_generator_embeddings and config.generator_hidden_size == 1.0
             and config.generator_layers == 1.0 and not config.uniform_generator,
             "two_stage_generator_dir (stage 2 of two-stage training) needs electra_objective, "
             "untied_generator and untied_generator_embeddings true, generator_hidden_size and "
             "generator_layers 1.0 and uniform_generator false: the generator is a copy of the "
             "stage-1 MLM model, with its own embeddings")
    if config.frozen_generator_dir:
        need(config.electra_objective and config.untied_generator
             and not config.uniform_generator,
             "frozen_generator_dir (Fast-ELECTRA) needs electra_objective and untied_generator "
             "true and uniform_generator false: the frozen generator is a network of its own "
             "that samples the replacements")
    _validate_curriculum(config, need)


def _validate_curriculum(config, need) -> None:
    need(config.temperature_schedule in TEMPERATURE_SCHEDULES,
         f"temperature_schedule must be one of {', '.join(TEMPERATURE_SCHEDULES)}, got "
         f"{config.temperature_schedule!r}")
    if config.temperature_start is None:
        need(config.temperature_decay_steps is None and config.temperature_schedule == "linear",
             "temperature_decay_steps and temperature_schedule shape the temperature "
             "curriculum: set temperature_start (T0) too, or leave them unset")
        return
    need(config.temperature_start > 0.0,
         f"temperature_start must be > 0, got {config.temperature_start}")
    need(config.temperature_decay_steps is None
         or 1 <= config.temperature_decay_steps <= MAX_INT32,
         f"temperature_decay_steps must be in [1, {MAX_INT32}] (null: num_train_steps), got "
         f"{config.temperature_decay_steps}")
    need(config.electra_objective and not config.uniform_generator,
         "temperature_start (the temperature curriculum) scales a generator network's logits "
         "before sampling: needs electra_objective true and uniform_generator false")


def validate_two_stage_sizes(config, bert, need) -> None:
    """Two-stage copies a stage-1 encoder into a generator with its own embeddings, which has no
    embedding projection (official): the sizes must allow that."""
    if config.two_stage_generator_dir:
        need(bert.embedding_size == bert.hidden_size,
             f"two_stage_generator_dir needs embedding_size == hidden_size (got "
             f"{bert.embedding_size} and {bert.hidden_size}): a generator with its own "
             "embeddings has no embedding projection (official), so it can only copy a "
             "stage-1 encoder without one; set the embedding_size hparam to the hidden size")


def check_model_variants(needs_generator: bool, samples: bool, frozen_generator: bool,
                         temperature_start, temperature_decay_steps,
                         temperature_schedule: str) -> None:
    """`PretrainingModel`'s own checks (ValueError): a frozen generator or a temperature
    curriculum the model cannot have (`needs_generator`: it has a generator network; `samples`:
    it samples from logits, a generator network's or the discriminator's)."""
    if frozen_generator and not needs_generator:
        raise ValueError("frozen_generator needs a generator network (electra_objective, "
                         "untied_generator, no uniform_generator)")
    if temperature_start is None:
        return
    if not samples:
        raise ValueError("temperature_start scales a generator's logits before sampling: needs "
                         "electra_objective and no uniform_generator")
    if temperature_start <= 0:
        raise ValueError(f"temperature_start must be > 0, got {temperature_start}")
    if temperature_decay_steps is None or temperature_decay_steps < 1:
        raise ValueError(f"temperature_start needs temperature_decay_steps >= 1, got "
                         f"{temperature_decay_steps}")
    if temperature_schedule not in TEMPERATURE_SCHEDULES:
        raise ValueError(f"temperature_schedule must be one of "
                         f"{', '.join(TEMPERATURE_SCHEDULES)}, got "
                         f"{temperature_schedule!r}")


def decay_steps(config) -> int:
    """The curriculum's length: `temperature_decay_steps`, or the run's `num_train_steps`."""
    return config.temperature_decay_steps or config.num_train_steps
