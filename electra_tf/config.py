"""Pretraining configuration: one strict object mirroring the official `configure_pretraining.py`.

Every official hparam keeps its name, default and meaning (see `docs/config.md` for the table and for
the few places where electra-tf deliberately differs). The construction order follows the official
one, so a user's JSON that worked there means the same thing here:

1. defaults; 2. the user's hparams (an unknown key is an error naming it);
3. size presets (`model_size`) and `debug` overrides, for keys the user did not set;
4. derived values (`max_predictions_per_seq`, paths), unless the user set them explicitly.

Step 3 is the official "second update" made explicit: official code applies the presets and then
re-applies the user's hparams, which is the same as applying presets only to keys the user left alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
from typing import Any, Mapping, Optional, Union

from electra_tf import atomic, generator_checks
from electra_tf.errors import ElectraError, is_utf8_path, shown_path

MODEL_SIZES = ("small", "base", "large")
MODELS_DIR = "models"  # DATA_DIR/models/MODEL_NAME: a run directory (training.run_dir)
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
# The Keras backend a run trains with: TensorFlow (the default, the fidelity reference; every
# feature) or JAX / PyTorch (electra_tf.training.portable_trainer).
BACKENDS = ("tensorflow", "jax", "torch")
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
# TensorFlow's shapes and loop counters are int32: a batch of more elements, or more steps per
# call, overflows them (a traceback deep in TensorFlow), so such values are refused up front.
MAX_INT32 = 2**31 - 1
MAX_SEED = 2**32 - 1
_MAX_FLOAT_INT = 2**1023  # ints past this do not convert to a float  # numpy's global seed (set with the others by keras.utils.set_random_seed)

# Official `training_utils.get_bert_config` size table: hidden width and depth. Heads and FFN width
# are derived (hidden // 64 and 4 * hidden).
_SIZE_TABLE = {
    "small": {"hidden_size": 256, "num_hidden_layers": 12},
    "base": {"hidden_size": 768, "num_hidden_layers": 12},
    "large": {"hidden_size": 1024, "num_hidden_layers": 24},
}

# The paper's training settings for base and large (Table 6). The official repo keeps them as a
# commented-out block in configure_pretraining.py; electra-tf applies them when the size is chosen
# (user hparams still win). Small keeps the official defaults, with embedding_size forced to 128.
SIZE_PRESETS = {
    "small": {"embedding_size": 128},
    "base": {
        "max_seq_length": 512,
        "learning_rate": 2e-4,
        "embedding_size": 768,
        "generator_hidden_size": 0.33333,
        "train_batch_size": 256,
    },
    "large": {
        "max_seq_length": 512,
        "learning_rate": 2e-4,
        "embedding_size": 1024,
        "mask_prob": 0.25,
        "train_batch_size": 2048,
    },
}

# Official debug mode: a tiny model trained for a few steps (the model part lives in
# `get_bert_config`). Unlike the official code, debug never deletes the model directory.
DEBUG_PRESET = {
    "train_batch_size": 8,
    "num_train_steps": 20,
    "eval_batch_size": 4,
    "iterations_per_loop": 1,
    "num_eval_steps": 2,
}
DEBUG_MODEL = {
    "num_hidden_layers": 3,
    "hidden_size": 144,
    "intermediate_size": 576,
    "num_attention_heads": 4,
}


class ConfigError(ElectraError, ValueError):
    """An hparam is unknown, has the wrong type or an invalid value."""


def check_model_name(name: str) -> None:
    """Refuses a model name that is not exactly one directory name (`DATA_DIR/models/NAME`).

    An empty name (an unset shell variable), `.`, `..`, a path (`a/b`, `../../x`, `/abs`) or
    control characters would put the run somewhere other than its own directory, where
    `--overwrite` could reach other runs.

    Raises:
        ConfigError: naming the value.
    """
    if (not isinstance(name, str) or not name.strip() or name in (".", "..")
            or "/" in name or (os.altsep and os.altsep in name) or os.sep in name
            or not name.isprintable()):
        raise ConfigError(f"--model-name must be one directory name (not empty, no '/', not "
                          f"'.' or '..'), got {name!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Transformer sizes of one encoder (the official `BertConfig`, plus `embedding_size`).

    Attributes:
        vocab_size: int. Rows of the word-embedding table.
        hidden_size: int. Width H of the transformer.
        num_hidden_layers: int. Number of transformer blocks.
        num_attention_heads: int. Heads per block; must divide hidden_size.
        intermediate_size: int. FFN width.
        embedding_size: int. Width E of the embedding block; a linear E->H projection is added
            when E != H.
        hidden_act: str. FFN activation; "gelu" is the exact (erf) GELU.
        hidden_dropout_prob: float. Dropout on embeddings and residual branches.
        attention_probs_dropout_prob: float. Dropout on attention probabilities.
        max_position_embeddings: int. Rows of the position table.
        type_vocab_size: int. Rows of the token-type table.
        initializer_range: float. Stddev of the truncated-normal initializer.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    embedding_size: int
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "embedding_size", "max_position_embeddings",
                     "type_vocab_size"):
            if not 1 <= getattr(self, name) <= MAX_INT32:
                raise ConfigError(f"model {name} must be in [1, {MAX_INT32}], got "
                                  f"{getattr(self, name)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model {name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.initializer_range < math.inf:
            raise ConfigError(f"model initializer_range must be > 0, got {self.initializer_range}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_MODEL_OVERRIDE_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "embedding_size")
_MODEL_TYPES = typing.get_type_hints(ModelConfig)


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    """All pretraining hparams, official names and defaults (see module docstring for the order).

    Build one with `PretrainingConfig.create(model_name, data_dir, hparams)`; fields are documented
    in `docs/config.md`.
    """

    model_name: str
    data_dir: str

    # --- What to run ---
    debug: bool = False  # tiny model, few steps (see DEBUG_PRESET / DEBUG_MODEL)
    do_train: bool = True  # pretrain
    do_eval: bool = False  # evaluate on the held-out split (writes eval_results.txt)
    do_export: bool = True  # export discriminator and generator SavedModels after training
    # Learning probe: every N steps a linear classifier on frozen discriminator features of a
    # labelled task, its dev accuracy logged (a JSON object: probe_settings; null: off)
    probe: Optional[Mapping[str, Any]] = None

    # --- Objective ---
    electra_objective: bool = True  # False = MLM only (BERT with dynamic masking, no NSP)
    electric_objective: bool = False  # Electric (not supported: see docs/config.md)
    gen_weight: float = 1.0  # weight of the generator's MLM loss
    disc_weight: float = 50.0  # weight of the discriminator's RTD loss
    mask_prob: float = 0.15  # fraction of tokens selected for masking
    mask_with_replacement: bool = True  # official: positions drawn with replacement (issue #41)
    # How masked positions are chosen: random (official) | whole_word (all WordPieces of a
    # chosen word together). Deprecated alias: whole_word_masking true / false.
    masking: str = "random"

    # --- Optimisation ---
    learning_rate: float = 5e-4
    lr_decay_power: float = 1.0  # polynomial decay power (1 = linear)
    weight_decay_rate: float = 0.01
    num_warmup_steps: int = 10000
    # Generator and discriminator each updated by an optimizer of their own, with its own
    # learning rate and gradient clip (Dong et al., ICML 2023; DeBERTa's --decoupled_training)
    decoupled_optimizers: bool = False
    generator_learning_rate: Optional[float] = None  # decoupled_optimizers: null = learning_rate

    # --- Training loop ---
    iterations_per_loop: int = 200  # steps per compiled call
    # Run each step's train_batch_size in this many micro-batches (same update, less memory).
    gradient_accumulation_steps: int = 1
    save_checkpoints_steps: int = 1000
    num_train_steps: int = 1000000
    num_eval_steps: int = 100
    keep_checkpoint_max: int = 5  # 0 keeps all
    # Steps with a non-finite loss or gradient norm to skip (no update applied, counted in the
    # `skipped_steps` scalar) before stopping; 0 stops at the first (one device only).
    max_skipped_nonfinite_steps: int = 0
    # Read every TFRecord once at start (CRC, feature names/lengths, counts vs the manifest).
    verify_tfrecords: bool = False
    # Read every TFRecord once at start and train on the good records only: corrupted, truncated
    # or malformed records (and the unreadable rest of a damaged shard) are skipped, logged per
    # file and counted in the `skipped_records` scalar.
    skip_bad_records: bool = False
    seed: int = 0  # every random draw (init, masking, sampling, dropout, data order) derives from it
    strategy: str = "auto"  # auto | one_device | mirrored | multi_worker | tpu
    backend: str = "tensorflow"  # tensorflow | jax | torch (the Keras backend; --backend)
    # auto (bf16 where the device multiplies it natively: TPU, GPU >= 8.0, CPU with AMX or
    # AVX512_BF16; float16 + loss scaling on older GPUs; else float32) | float32 |
    # mixed_bfloat16 | mixed_float16 (with loss scaling)
    mixed_precision: str = "auto"
    jit_compile: bool = False  # XLA-compile the forward/backward computation
    # Ops TensorFlow may run at once: None = 1 on a single-device CPU run (each op already uses
    # every core; 2.2x faster on 2 cores), else TensorFlow's default; 0 = TensorFlow's default.
    inter_op_threads: Optional[int] = None
    optimizer: str = "adamw"  # adamw (official) | lamb (large global batches)

    # --- Model ---
    model_size: str = "small"  # small | base | large
    model_hparam_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    embedding_size: Optional[int] = None  # None = hidden_size; forced to 128 for small
    vocab_size: int = 30522
    do_lower_case: bool = True  # informational: tokenisation happens in the builder

    # --- Generator ---
    uniform_generator: bool = False  # sample replacements uniformly (no generator network)
    two_tower_generator: bool = False  # Electric's cloze generator (not supported)
    untied_generator_embeddings: bool = False  # True = generator has its own embedding block
    # With shared embeddings: tied (official) | gdes (DeBERTaV3's gradient-disentangled sharing:
    # the RTD loss does not update the shared block; the discriminator learns deltas on it)
    embedding_sharing: str = "tied"
    untied_generator: bool = True  # False = full-size generator sharing all discriminator weights
    generator_layers: float = 1.0  # generator depth as a fraction of the discriminator's
    generator_hidden_size: float = 0.25  # generator width as a fraction of the discriminator's
    disallow_correct: bool = False  # never sample the original token
    # Stage 2 of the paper's two-stage training: the model_dir of a finished MLM-only run
    # (stage 1, `electra_objective: false`) whose weights start both the generator (then frozen)
    # and the discriminator. Needs a discriminator-size generator with its own embeddings.
    two_stage_generator_dir: Optional[str] = None
    # Fast-ELECTRA (Dong et al., ICLR 2024): the model_dir of a finished run (MLM-only, ELECTRA,
    # or imported by from-google) whose masked LM becomes this run's generator, frozen (no loss
    # term it can move, no backward pass); the discriminator trains from its own initialisation.
    frozen_generator_dir: Optional[str] = None
    temperature: float = 1.0  # generator sampling temperature (the curriculum's end value)
    # Temperature curriculum (Fast-ELECTRA): sampling starts at temperature_start and decays to
    # `temperature` over temperature_decay_steps (null: num_train_steps) by temperature_schedule
    # (linear | cosine | exponential); null temperature_start = off (official).
    temperature_start: Optional[float] = None
    temperature_decay_steps: Optional[int] = None
    temperature_schedule: str = "linear"

    # --- Batching ---
    max_seq_length: int = 128
    max_predictions_per_seq: Optional[int] = None  # None = int((mask_prob + 0.005) * max_seq_length)
    train_batch_size: int = 128  # global batch
    eval_batch_size: int = 128  # global batch

    # --- TPU (official names; TPUStrategy when tpu_name or TPU_NAME is set) ---
    tpu_name: Optional[str] = None
    tpu_zone: Optional[str] = None
    gcp_project: Optional[str] = None

    # --- Paths (derived from data_dir / model_name when None) ---
    pretrain_tfrecords: Optional[str] = None  # comma-separated globs
    eval_tfrecords: Optional[str] = None  # held-out split written by the builder
    vocab_file: Optional[str] = None
    model_dir: Optional[str] = None

    # --- Recorded by the run, not settable by --hparams (RUN_RECORDED) ---
    resolved_mixed_precision: Optional[str] = None  # the policy mixed_precision gave on this device
    resolved_mixed_precision_reason: Optional[str] = None  # why: what "auto" saw, or "set explicitly"

    # ------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, model_name: str, data_dir: str,
               hparams: Union[None, str, Mapping[str, Any]] = None) -> "PretrainingConfig":
        """Builds a config the official way: defaults, hparams, presets, derived values.

        Args:
            model_name: str. Name of the run; the model directory is `data_dir/models/model_name`.
            data_dir: str. Directory holding vocab.txt and pretrain_tfrecords/.
            hparams: None, a JSON string, a path to a .json file, or a mapping of overrides.

        Raises:
            ConfigError: an unknown key (named, with the closest valid key), a wrong type or an
                invalid value.
        """
        user = parse_hparams(hparams)
        for key in ("model_name", "data_dir"):
            if key in user:
                raise ConfigError(f"hparam {key!r} is set by the command line, not by --hparams")
        for key in RUN_RECORDED:
            if key in user:
                raise ConfigError(f"{key!r} is recorded by the run (what mixed_precision resolved "
                                  "to), not an hparam: set mixed_precision")
        user = _known(_resolve_aliases(user))
        check_model_name(model_name)
        values = {"model_name": model_name, "data_dir": data_dir}
        values.update({k: _coerce(k, v) for k, v in user.items()})

        size = values.get("model_size", cls.model_size)
        if size not in MODEL_SIZES:
            raise ConfigError(f"model_size must be one of {', '.join(MODEL_SIZES)}, got {size!r}")
        presets = dict(SIZE_PRESETS[size])
        if values.get("debug", False):
            presets.update(DEBUG_PRESET)
        for key, value in presets.items():
            values.setdefault(key, value)

        config = cls(**values)
        derived = {}
        if config.max_predictions_per_seq is None:
            derived["max_predictions_per_seq"] = int((config.mask_prob + 0.005) * config.max_seq_length)
        join = os.path.join
        if config.pretrain_tfrecords is None:
            derived["pretrain_tfrecords"] = join(data_dir, "pretrain_tfrecords", "pretrain_data.tfrecord*")
        if config.eval_tfrecords is None:
            derived["eval_tfrecords"] = join(data_dir, "pretrain_tfrecords", "eval_data.tfrecord*")
        if config.vocab_file is None:
            # DATA_DIR/vocab.txt, or the SentencePiece model --learn-spm writes when it is alone.
            vocab = join(data_dir, "vocab.txt")
            spm_model = join(data_dir, "spm.model")
            derived["vocab_file"] = (spm_model if not os.path.exists(vocab)
                                     and os.path.isfile(spm_model) else vocab)
        if config.probe is not None:
            from electra_tf import probe_settings  # imports this module

            derived["probe"] = probe_settings.resolved(config.probe)
        if config.model_dir is None:
            derived["model_dir"] = join(data_dir, MODELS_DIR, model_name)
        config = dataclasses.replace(config, **derived)
        config.validate()
        return config

    def validate(self) -> None:
        """Checks value ranges and combinations; raises ConfigError naming the hparam."""
        def need(cond, message):
            if not cond:
                raise ConfigError(message)

        need(self.do_train or self.do_eval or self.do_export,
             "nothing to do: set do_train, do_eval or do_export to true")
        need(self.backend in BACKENDS,
             f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        need(self.strategy in STRATEGIES,
             f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        need(self.mixed_precision in PRECISIONS,
             f"mixed_precision must be one of {', '.join(PRECISIONS)}, got {self.mixed_precision!r}")
        need(self.resolved_mixed_precision in (None,) + PRECISIONS[1:],
             f"resolved_mixed_precision must be one of {', '.join(PRECISIONS[1:])}, got "
             f"{self.resolved_mixed_precision!r}")
        need(self.optimizer in OPTIMIZERS,
             f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        need(not self.electric_objective and not self.two_tower_generator,
             "electric_objective / two_tower_generator (Electric) are not supported by electra-tf; "
             "see docs/config.md")
        self._validate_ranges(need)
        if self.probe is not None:
            from electra_tf import probe_settings  # imports this module

            probe_settings.parse(self.probe)
        need(self.inter_op_threads is None or self.inter_op_threads >= 0,
             f"inter_op_threads must be null (automatic) or >= 0, got {self.inter_op_threads}")
        need(self.embedding_size is None or self.embedding_size >= 1, "embedding_size must be >= 1")
        for key in ("model_dir", "vocab_file", "pretrain_tfrecords", "eval_tfrecords",
                    "two_stage_generator_dir", "frozen_generator_dir"):
            path = getattr(self, key)
            need(path is None or is_utf8_path(path),
                 f"{key} {shown_path(path or '')}: TensorFlow reads and writes only file names "
                 "that are valid UTF-8; rename the directory")
        unknown = sorted(set(self.model_hparam_overrides) - set(_MODEL_OVERRIDE_KEYS))
        need(not unknown, f"unknown key(s) in model_hparam_overrides: {', '.join(unknown)} "
                          f"(valid: {', '.join(_MODEL_OVERRIDE_KEYS)})")
        for key, value in self.model_hparam_overrides.items():
            coerce_hparam(f"model_hparam_overrides.{key}", value, _MODEL_TYPES[key])
        need(self.masking in MASKINGS,
             f"masking must be one of {', '.join(MASKINGS)}, got {self.masking!r}")
        need(self.embedding_sharing in EMBEDDING_SHARINGS,
             f"embedding_sharing must be one of {', '.join(EMBEDDING_SHARINGS)}, got "
             f"{self.embedding_sharing!r}")
        # Where the generator comes from and how it samples: gdes, decoupled_optimizers,
        # two-stage, the frozen generator and the temperature curriculum (generator_checks).
        generator_checks.validate_generator(self, need)
        if not self.untied_generator:
            need(self.electra_objective,
                 "untied_generator=false shares the discriminator with the generator: needs electra_objective")
        # Building the model configs validates sizes (head divisibility etc.).
        bert = get_bert_config(self)
        generator_checks.validate_two_stage_sizes(self, bert, need)
        if self.electra_objective and self.untied_generator:
            get_generator_config(self, bert)

    def _validate_ranges(self, need) -> None:
        """The numeric hparams' ranges: finite, within int32 where TensorFlow needs it."""
        need(0.0 < self.mask_prob <= 1.0, f"mask_prob must be in (0, 1], got {self.mask_prob}")
        need(self.temperature > 0.0, f"temperature must be > 0, got {self.temperature}")
        need(self.gen_weight >= 0.0 and self.disc_weight >= 0.0,
             "gen_weight and disc_weight must be >= 0")
        need(0.0 < self.generator_hidden_size, "generator_hidden_size must be > 0")
        need(0.0 < self.generator_layers, "generator_layers must be > 0")
        need(8 <= self.max_seq_length <= 512,
             f"max_seq_length must be in [8, 512] (512 position embeddings), got {self.max_seq_length}")
        need(1 <= self.max_predictions_per_seq <= self.max_seq_length,
             f"max_predictions_per_seq must be in [1, max_seq_length], got {self.max_predictions_per_seq}")
        for key in ("train_batch_size", "eval_batch_size", "iterations_per_loop",
                    "save_checkpoints_steps", "num_train_steps", "num_eval_steps", "vocab_size"):
            need(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        need(self.num_warmup_steps >= 0, f"num_warmup_steps must be >= 0, got {self.num_warmup_steps}")
        need(self.gradient_accumulation_steps >= 1 and
             self.train_batch_size % self.gradient_accumulation_steps == 0,
             f"gradient_accumulation_steps must be >= 1 and divide train_batch_size "
             f"{self.train_batch_size}, got {self.gradient_accumulation_steps}")
        need(self.keep_checkpoint_max >= 0, "keep_checkpoint_max must be >= 0 (0 keeps all)")
        need(self.max_skipped_nonfinite_steps >= 0,
             f"max_skipped_nonfinite_steps must be >= 0, got {self.max_skipped_nonfinite_steps}")
        need(self.learning_rate >= 0.0, f"learning_rate must be >= 0, got {self.learning_rate}")
        need(self.generator_learning_rate is None or self.generator_learning_rate >= 0.0,
             f"generator_learning_rate must be >= 0, got {self.generator_learning_rate}")
        need(self.weight_decay_rate >= 0.0,
             f"weight_decay_rate must be >= 0, got {self.weight_decay_rate}")
        need(self.lr_decay_power >= 0.0, f"lr_decay_power must be >= 0, got {self.lr_decay_power}")
        need(0 <= self.seed <= MAX_SEED, f"seed must be in [0, {MAX_SEED}], got {self.seed}")
        for key in ("train_batch_size", "eval_batch_size"):
            elements = getattr(self, key) * self.max_seq_length
            need(elements <= MAX_INT32,
                 f"{key}={getattr(self, key)} is too large: a batch of {key} * max_seq_length = "
                 f"{elements} tokens overflows TensorFlow's int32 shapes (at most {MAX_INT32})")
        for key in ("iterations_per_loop", "save_checkpoints_steps", "num_train_steps",
                    "num_eval_steps", "num_warmup_steps", "keep_checkpoint_max",
                    "max_skipped_nonfinite_steps", "max_predictions_per_seq"):
            need(getattr(self, key) <= MAX_INT32,
                 f"{key} must be at most {MAX_INT32}, got {getattr(self, key)}")

    # --- Serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model_hparam_overrides"] = dict(self.model_hparam_overrides)
        if self.probe is not None:
            d["probe"] = dict(self.probe)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def save(self, path: str) -> None:
        """Writes the resolved config as JSON (atomically: temp file + rename)."""
        atomic.write_text(path, self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PretrainingConfig":
        """Rebuilds a resolved config (e.g. a saved config.json) without re-applying presets."""
        paths = {k: d[k] for k in ("model_name", "data_dir") if k in d}
        recorded = {k: _coerce(k, d[k]) for k in RUN_RECORDED if k in d}
        hparams = _known(_resolve_aliases(
            {k: v for k, v in d.items() if k not in paths and k not in recorded}))
        config = cls(**paths, **recorded, **{k: _coerce(k, v) for k, v in hparams.items()})
        config.validate()
        return config

    @classmethod
    def load(cls, path: str) -> "PretrainingConfig":
        with open(path, encoding="utf-8") as f:
            try:
                return cls.from_dict(json.load(f))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from e


# Written by the run into config.json (what the device made of an "auto"), never by the user.
RUN_RECORDED = ("resolved_mixed_precision", "resolved_mixed_precision_reason")
HPARAM_NAMES = tuple(f.name for f in dataclasses.fields(PretrainingConfig)
                     if f.name not in ("model_name", "data_dir") + RUN_RECORDED)
# Official hparams without an effect here (TPUEstimator settings; the strategy comes from
# `strategy` / `tpu_name`): accepted, so official hparam files and config.json files written
# before they were dropped still load, then discarded.
IGNORED_OFFICIAL_HPARAMS = ("use_tpu", "num_tpu_cores", "tpu_job_name")


def parse_hparams(hparams: Union[None, str, Mapping[str, Any]]) -> dict:
    """Turns `--hparams` (JSON string, path to a .json file, or mapping) into a dict.

    Raises:
        ConfigError: the file is missing, the JSON is invalid, or it is not an object.
    """
    if hparams is None:
        return {}
    if isinstance(hparams, Mapping):
        return dict(hparams)
    text = hparams.strip()
    source = "--hparams"
    if text.endswith(".json") and not text.startswith("{"):
        if not os.path.isfile(text):
            raise ConfigError(f"hparams file not found: {text}")
        source = text
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ConfigError(f"{source}: not a UTF-8 JSON file (byte offset {e.start})") from None
    try:
        parsed = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    except RecursionError:
        raise ConfigError(f"{source}: JSON nested too deeply (hparams are a flat object)") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{source}: expected a JSON object of hparams, got {type(parsed).__name__}")
    return parsed


def check_known_hparams(hparams: Mapping[str, Any], names) -> None:
    """Raises ConfigError for the first key not in `names`, suggesting the closest valid one."""
    for key in hparams:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"Unknown hparam {key!r}{hint}")


def coerce_hparam(key: str, value: Any, annotation: Any) -> Any:
    """Checks a value against a config field's annotated type (bool, int, float, str, Mapping,
    optionally Optional); ints are accepted for float fields, NaN and infinities are not.

    Raises:
        ConfigError: naming the hparam, the expected type and the value.
    """
    optional = typing.get_origin(annotation) is Union and type(None) in typing.get_args(annotation)
    if optional:
        if value is None:
            return None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation is bool:
        ok = isinstance(value, bool)
    elif annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not (isinstance(value, int) or math.isfinite(value)) or (
                isinstance(value, int) and abs(value) > _MAX_FLOAT_INT):
            # JSON's NaN / Infinity (Python's json accepts them), or an int beyond float range
            raise ConfigError(f"hparam {key!r} must be a finite number, got {str(value)[:40]}")
        value = float(value) if ok else value
    elif annotation is str:
        ok = isinstance(value, str)
    else:  # Mapping
        ok = isinstance(value, Mapping)
    if not ok:
        name = getattr(annotation, "__name__", str(annotation))
        raise ConfigError(f"hparam {key!r} must be {name}{' or null' if optional else ''}, "
                          f"got {value!r} ({type(value).__name__})")
    return value


def _resolve_aliases(hparams: Mapping[str, Any]) -> dict:
    """`hparams` with the deprecated alias `whole_word_masking` (a bool: true is `masking`
    "whole_word", false "random"; config.json files of earlier runs hold it) replaced by `masking`.

    Raises:
        ConfigError: the alias is not a bool, or disagrees with a `masking` given beside it.
    """
    hparams = dict(hparams)
    if "whole_word_masking" in hparams:
        whole_words = coerce_hparam("whole_word_masking", hparams.pop("whole_word_masking"), bool)
        implied = "whole_word" if whole_words else "random"
        if hparams.get("masking", implied) != implied:
            raise ConfigError(f"hparams whole_word_masking={json.dumps(whole_words)} (deprecated: "
                              f"masking {implied!r}) and masking={hparams['masking']!r} disagree: "
                              "give masking only")
        hparams["masking"] = implied
    return hparams


def _known(hparams: Mapping[str, Any]) -> dict:
    """`hparams` without the ignored official names; ConfigError for an unknown key."""
    check_known_hparams(hparams, HPARAM_NAMES + IGNORED_OFFICIAL_HPARAMS)
    return {k: v for k, v in hparams.items() if k not in IGNORED_OFFICIAL_HPARAMS}


_TYPES = typing.get_type_hints(PretrainingConfig)


def _coerce(key: str, value: Any) -> Any:
    return coerce_hparam(key, value, _TYPES[key])


def get_bert_config(config: PretrainingConfig) -> ModelConfig:
    """The discriminator's sizes: official size table, overrides applied twice, debug model.

    Heads and FFN width are derived from the (possibly overridden) hidden size, then the overrides
    are applied again, so overriding hidden_size re-derives heads and FFN unless they are overridden
    too (official `training_utils.get_bert_config`).
    """
    d = dict(_SIZE_TABLE[config.model_size], vocab_size=config.vocab_size)
    d.update(config.model_hparam_overrides)
    d["num_attention_heads"] = max(1, d["hidden_size"] // 64)
    d["intermediate_size"] = 4 * d["hidden_size"]
    d.update(config.model_hparam_overrides)
    if config.debug:
        d.update(DEBUG_MODEL)
    d["embedding_size"] = config.embedding_size or d["hidden_size"]
    return ModelConfig(**d)


def get_generator_config(config: PretrainingConfig, bert_config: ModelConfig) -> ModelConfig:
    """The generator's sizes, derived by the official fractions.

    hidden = round(H * generator_hidden_size), layers = round(layers * generator_layers),
    FFN = 4 * hidden, heads = max(1, hidden // 64). With shared embeddings the generator reads the
    discriminator's embedding block (width E); untied, it has its own at its hidden width.
    """
    hidden = int(round(bert_config.hidden_size * config.generator_hidden_size))
    layers = int(round(bert_config.num_hidden_layers * config.generator_layers))
    if hidden < 1 or layers < 1:
        raise ConfigError(
            f"generator would have hidden_size {hidden} and {layers} layers: raise "
            "generator_hidden_size / generator_layers"
        )
    try:
        return _replace_model(bert_config, hidden, layers, config.untied_generator_embeddings)
    except ConfigError as e:
        raise ConfigError(f"generator (derived by generator_hidden_size={config.generator_hidden_size}, "
                          f"generator_layers={config.generator_layers}): {e}") from None


def _replace_model(bert_config: ModelConfig, hidden: int, layers: int, untied_embeddings: bool) -> ModelConfig:
    return dataclasses.replace(
        bert_config,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=4 * hidden,
        num_attention_heads=max(1, hidden // 64),
        embedding_size=hidden if untied_embeddings else bert_config.embedding_size,
    )
