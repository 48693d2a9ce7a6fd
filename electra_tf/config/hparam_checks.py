"""The values `PretrainingConfig`'s hparams may take, and the checks of `validate`.

The choices of the string hparams (`BACKENDS`, `STRATEGIES`, ...), the numeric ranges (within
int32 where TensorFlow needs it) and the combinations that make no sense, each refused with one
line naming the hparam. The generator variants' rules are `generator_checks`'; the probe's,
`probe_settings`'. Kept apart from `config.py` (the hparams and their construction order).
"""

from __future__ import annotations

import dataclasses
import typing

from electra_tf import console, precision
from electra_tf.config import generator_checks, probe_settings
from electra_tf.errors import is_utf8_path, shown_path
from electra_tf.config.hparams import MAX_INT32, ConfigError, coerce_hparam
from electra_tf.config.model_config import ModelConfig, get_bert_config, get_generator_config

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
# The Keras backend a run trains with: TensorFlow (the default, the fidelity reference; every
# feature) or JAX / PyTorch (electra_tf.training.portable.trainer).
BACKENDS = console.KERAS_BACKENDS
# "auto": the fastest correct precision for the device the run meets (electra_tf.precision).
PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
OPTIMIZERS = ("adamw", "lamb")
# How generator and discriminator share the embedding block: "tied" (official: the same
# variables) | "gdes" (gradient-disentangled, DeBERTaV3: the discriminator reads
# stop_gradient(block) + its own zero-initialised deltas; modeling.embeddings).
EMBEDDING_SHARINGS = ("tied", "gdes")
# How masked positions are chosen (the official `proposal_distribution` seam of `mask()`): the
# names of pretraining.masking.STRATEGIES, "random" (official: single tokens) | "whole_word".
MASKINGS = ("random", "whole_word")
MAX_SEED = 2**32 - 1  # numpy's global seed (set with the others by keras.utils.set_random_seed)

_MODEL_OVERRIDE_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "embedding_size")
_MODEL_TYPES = typing.get_type_hints(ModelConfig)


def validate(config) -> None:
    """Checks value ranges and combinations (`config.PretrainingConfig.validate`).

    Args:
        config: config.PretrainingConfig. The config to check, every derived value filled in.

    Raises:
        ConfigError: the first value or combination that makes no sense, naming the hparam.
    """
    def need(cond, message):
        if not cond:
            raise ConfigError(message)

    need(config.do_train or config.do_eval or config.do_export,
         "nothing to do: set do_train, do_eval or do_export to true")
    need(config.backend in BACKENDS,
         f"backend must be one of {', '.join(BACKENDS)}, got {config.backend!r}")
    need(config.strategy in STRATEGIES,
         f"strategy must be one of {', '.join(STRATEGIES)}, got {config.strategy!r}")
    need(config.mixed_precision in PRECISIONS,
         f"mixed_precision must be one of {', '.join(PRECISIONS)}, got {config.mixed_precision!r}")
    need(config.resolved_mixed_precision in (None,) + PRECISIONS[1:],
         f"resolved_mixed_precision must be one of {', '.join(PRECISIONS[1:])}, got "
         f"{config.resolved_mixed_precision!r}")
    need(precision.check_export_precision(config.export_precision) is None,
         precision.check_export_precision(config.export_precision))
    need(config.optimizer in OPTIMIZERS,
         f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {config.optimizer!r}")
    need(not (config.adam_bias_correction and config.optimizer != "adamw"),
         f"adam_bias_correction applies to optimizer adamw; {config.optimizer} always corrects "
         "its moments (drop the hparam)")
    need(not (config.official_gpu_clip_norm and config.backend != "tensorflow"),
         f"official_gpu_clip_norm needs backend tensorflow: on {config.backend} the embedding "
         "gradient is dense, its rows of a repeated id already summed (drop the hparam)")
    need(not (config.official_gpu_clip_norm and config.gradient_accumulation_steps > 1),
         "official_gpu_clip_norm with gradient_accumulation_steps > 1: the accumulated embedding "
         "gradient is dense, its rows already summed (use one of the two)")
    _validate_steps_per_execution(config, need)
    need(not config.electric_objective and not config.two_tower_generator,
         "electric_objective / two_tower_generator (Electric) are not supported by electra-tf; "
         "see docs/config.md")
    _validate_ranges(config, need)
    if config.probe is not None:
        probe_settings.parse(config.probe)
    need(config.inter_op_threads is None or config.inter_op_threads >= 0,
         f"inter_op_threads must be null (automatic) or >= 0, got {config.inter_op_threads}")
    need(config.embedding_size is None or config.embedding_size >= 1, "embedding_size must be >= 1")
    for key in ("model_dir", "vocab_file", "pretrain_tfrecords", "eval_tfrecords",
                "two_stage_generator_dir", "frozen_generator_dir"):
        path = getattr(config, key)
        need(path is None or is_utf8_path(path),
             f"{key} {shown_path(path or '')}: TensorFlow reads and writes only file names "
             "that are valid UTF-8; rename the directory")
    _validate_model_overrides(config, need)
    need(config.masking in MASKINGS,
         f"masking must be one of {', '.join(MASKINGS)}, got {config.masking!r}")
    need(config.embedding_sharing in EMBEDDING_SHARINGS,
         f"embedding_sharing must be one of {', '.join(EMBEDDING_SHARINGS)}, got "
         f"{config.embedding_sharing!r}")
    # Where the generator comes from and how it samples: gdes, decoupled_optimizers,
    # two-stage, the frozen generator and the temperature curriculum (generator_checks).
    generator_checks.validate_generator(config, need)
    if not config.untied_generator:
        need(config.electra_objective,
             "untied_generator=false shares the discriminator with the generator: needs electra_objective")
    # Building the model configs validates sizes (head divisibility etc.).
    bert = get_bert_config(config)
    _validate_speed_options(config, bert, need)
    generator_checks.validate_two_stage_sizes(config, bert, need)
    if config.electra_objective and config.untied_generator:
        get_generator_config(config, bert)


def _validate_steps_per_execution(config, need) -> None:
    k = config.steps_per_execution
    if k is None:
        return
    need(config.backend != "tensorflow",
         "steps_per_execution is the JAX trainer's: the TensorFlow trainer runs "
         "iterations_per_loop steps per compiled call already (drop the hparam)")
    need(k >= 1, f"steps_per_execution must be null (automatic) or >= 1, got {k}")
    need(k == 1 or config.backend == "jax",
         f"steps_per_execution {k} needs backend jax: Keras' PyTorch backend runs one step per "
         "call (drop the hparam)")
    for key in ("iterations_per_loop", "save_checkpoints_steps"):
        need(getattr(config, key) % k == 0,
             f"steps_per_execution {k} must divide {key} ({getattr(config, key)}): a loop and "
             "a checkpoint end at a call's end")


def _validate_speed_options(config, bert: ModelConfig, need) -> None:
    """`vocab_padding_multiple` and `fused_attention` (issue 45), the latter against the
    encoders' attention dropout (the generator's is the discriminator's: `get_generator_config`)."""
    need(1 <= config.vocab_padding_multiple <= MAX_INT32,
         f"vocab_padding_multiple must be in [1, {MAX_INT32}] (1 = off), got "
         f"{config.vocab_padding_multiple}")
    need(not config.fused_attention or bert.attention_probs_dropout_prob == 0.0,
         f"fused_attention has no dropout on the attention probabilities: it needs "
         f"model_hparam_overrides.attention_probs_dropout_prob 0, got "
         f"{bert.attention_probs_dropout_prob} (set it to 0 or drop fused_attention)")


def _validate_model_overrides(config, need) -> None:
    """`model_hparam_overrides`: `ModelConfig` fields only (not embedding_size), each of its type."""
    unknown = sorted(set(config.model_hparam_overrides) - set(_MODEL_OVERRIDE_KEYS))
    need(not unknown, f"unknown key(s) in model_hparam_overrides: {', '.join(unknown)} "
                      f"(valid: {', '.join(_MODEL_OVERRIDE_KEYS)})")
    for key, value in config.model_hparam_overrides.items():
        coerce_hparam(f"model_hparam_overrides.{key}", value, _MODEL_TYPES[key])


def _validate_ranges(config, need) -> None:
    """The numeric hparams' ranges: finite, within int32 where TensorFlow needs it."""
    need(0.0 < config.mask_prob <= 1.0, f"mask_prob must be in (0, 1], got {config.mask_prob}")
    need(config.temperature > 0.0, f"temperature must be > 0, got {config.temperature}")
    need(config.gen_weight >= 0.0 and config.disc_weight >= 0.0,
         "gen_weight and disc_weight must be >= 0")
    need(0.0 < config.generator_hidden_size, "generator_hidden_size must be > 0")
    need(0.0 < config.generator_layers, "generator_layers must be > 0")
    need(8 <= config.max_seq_length <= 512,
         f"max_seq_length must be in [8, 512] (512 position embeddings), got {config.max_seq_length}")
    need(1 <= config.max_predictions_per_seq <= config.max_seq_length,
         f"max_predictions_per_seq must be in [1, max_seq_length], got {config.max_predictions_per_seq}")
    for key in ("train_batch_size", "eval_batch_size", "iterations_per_loop",
                "save_checkpoints_steps", "num_train_steps", "num_eval_steps", "vocab_size"):
        need(getattr(config, key) >= 1, f"{key} must be >= 1, got {getattr(config, key)}")
    need(config.num_warmup_steps >= 0, f"num_warmup_steps must be >= 0, got {config.num_warmup_steps}")
    need(config.gradient_accumulation_steps >= 1 and
         config.train_batch_size % config.gradient_accumulation_steps == 0,
         f"gradient_accumulation_steps must be >= 1 and divide train_batch_size "
         f"{config.train_batch_size}, got {config.gradient_accumulation_steps}")
    need(config.keep_checkpoint_max >= 0, "keep_checkpoint_max must be >= 0 (0 keeps all)")
    need(config.max_skipped_nonfinite_steps >= 0,
         f"max_skipped_nonfinite_steps must be >= 0, got {config.max_skipped_nonfinite_steps}")
    need(config.collapse_patience >= 0,
         f"collapse_patience must be >= 0 (0 turns the collapse guard off), got "
         f"{config.collapse_patience}")
    need(config.collapse_grace_steps >= 0,
         f"collapse_grace_steps must be >= 0, got {config.collapse_grace_steps}")
    need(config.learning_rate >= 0.0, f"learning_rate must be >= 0, got {config.learning_rate}")
    need(config.generator_learning_rate is None or config.generator_learning_rate >= 0.0,
         f"generator_learning_rate must be >= 0, got {config.generator_learning_rate}")
    need(config.weight_decay_rate >= 0.0,
         f"weight_decay_rate must be >= 0, got {config.weight_decay_rate}")
    need(config.lr_decay_power >= 0.0, f"lr_decay_power must be >= 0, got {config.lr_decay_power}")
    need(0 <= config.seed <= MAX_SEED, f"seed must be in [0, {MAX_SEED}], got {config.seed}")
    for key in ("train_batch_size", "eval_batch_size"):
        elements = getattr(config, key) * config.max_seq_length
        need(elements <= MAX_INT32,
             f"{key}={getattr(config, key)} is too large: a batch of {key} * max_seq_length = "
             f"{elements} tokens overflows TensorFlow's int32 shapes (at most {MAX_INT32})")
    for key in ("iterations_per_loop", "save_checkpoints_steps", "num_train_steps",
                "num_eval_steps", "num_warmup_steps", "keep_checkpoint_max",
                "max_skipped_nonfinite_steps", "max_predictions_per_seq", "collapse_patience",
                "collapse_grace_steps"):
        need(getattr(config, key) <= MAX_INT32,
             f"{key} must be at most {MAX_INT32}, got {getattr(config, key)}")
