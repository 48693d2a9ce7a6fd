"""Pretraining configuration: one strict object mirroring the official `configure_pretraining.py`.

Every official hparam keeps its name, default and meaning (see `docs/config.md` for the table and for
the few places where electra-tf deliberately differs). The construction order follows the official
one, so a user's JSON that worked there means the same thing here:

1. defaults; 2. the user's hparams (an unknown key is an error naming it);
3. size presets (`model_size`) and `debug` overrides, for keys the user did not set;
4. derived values (`max_predictions_per_seq`, paths), unless the user set them explicitly.

Step 3 is the official "second update" made explicit: official code applies the presets and then
re-applies the user's hparams, which is the same as applying presets only to keys the user left alone.

Reading the hparams (JSON, unknown keys, types) is `hparams`; the checks of the values,
`hparam_checks`; the encoder sizes a config gives, `model_config`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Any, Mapping, Optional, Union

from electra_tf import atomic
from electra_tf.config import hparam_checks, probe_settings
from electra_tf.config.hparams import ConfigError, check_known_hparams, coerce_hparam, parse_hparams
from electra_tf.config.model_config import MODEL_SIZES

MODELS_DIR = "models"  # DATA_DIR/models/MODEL_NAME: a run directory (training.run_dir)

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
# `model_config.DEBUG_MODEL`). Unlike the official code, debug never deletes the model directory.
DEBUG_PRESET = {
    "train_batch_size": 8,
    "num_train_steps": 20,
    "eval_batch_size": 4,
    "iterations_per_loop": 1,
    "num_eval_steps": 2,
}


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
    # What the SavedModels compute in, whatever mixed_precision trained in: float32 | bfloat16
    export_precision: str = "float32"
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
    # JAX: training steps per compiled call within a loop (one dispatch; the metrics' results and
    # a SIGTERM read once per call); null = auto (training.portable_support.steps_per_execution)
    steps_per_execution: Optional[int] = None
    save_checkpoints_steps: int = 1000
    num_train_steps: int = 1000000
    num_eval_steps: int = 100
    keep_checkpoint_max: int = 5  # 0 keeps all
    # Steps with a non-finite loss or gradient norm to skip (no update applied, counted in the
    # `skipped_steps` scalar) before stopping; 0 stops at the first (one device only).
    max_skipped_nonfinite_steps: int = 0
    # The collapse guard (training.collapse): this many training loops in a row after step
    # max(num_warmup_steps, collapse_grace_steps) with the discriminator at the base rate
    # ("original" everywhere) print one warning and set the disc_collapsed scalar; 0 = off.
    collapse_patience: int = 3
    collapse_grace_steps: int = 1000  # the early phase, where the base rate is expected
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
    # adamw only: Adam's bias correction, which the official optimizer lacks (training/adam_warmup)
    adam_bias_correction: bool = False
    # The clip's norm as the official code computes it on CPU/GPU (an embedding gradient's rows
    # of a repeated id counted apart); default: the official TPU path's (rows summed first)
    official_gpu_clip_norm: bool = False

    # --- Model ---
    model_size: str = "small"  # small | base | large
    model_hparam_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    embedding_size: Optional[int] = None  # None = hidden_size; forced to 128 for small
    vocab_size: int = 30522
    do_lower_case: bool = True  # informational: tokenisation happens in the builder
    # Speed options (issue 45; docs/benchmarks.md measures them on a GPU). The MLM head projects
    # onto the vocabulary padded to a multiple of this many rows, the pad masked out (variables
    # and checkpoints unchanged, losses equal to float32 rounding); 1 = off, 128 for GPUs.
    vocab_padding_multiple: int = 1
    # The attention core as keras.ops.dot_product_attention (cuDNN flash attention on a GPU under
    # JAX); it has no attention dropout, so it needs attention_probs_dropout_prob 0.
    fused_attention: bool = False

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
            derived["probe"] = probe_settings.resolved(config.probe)
        if config.model_dir is None:
            derived["model_dir"] = join(data_dir, MODELS_DIR, model_name)
        config = dataclasses.replace(config, **derived)
        config.validate()
        return config

    def validate(self) -> None:
        """Checks value ranges and combinations; raises ConfigError naming the hparam
        (`hparam_checks.validate`)."""
        hparam_checks.validate(self)

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
