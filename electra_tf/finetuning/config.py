"""Fine-tuning configuration: one strict object mirroring the official `configure_finetuning.py`.

Official names, defaults and construction order (see docs/finetuning.md for the table):

1. defaults; 2. the user's hparams (an unknown key is an error naming it);
3. single-task defaults (rte/sts: 10 epochs), size presets (large: lr 5e-5, layer-wise decay 0.9;
   small: embedding_size 128) and `debug` overrides, for keys the user did not set;
4. derived paths (`raw_data_dir`, `vocab_file`, `init_checkpoint`, `model_dir`, results files),
   unless set explicitly.

Step 3 is the official "update, apply defaults, update again" made explicit, as in
`electra_tf.config.PretrainingConfig`.

Single-task defaults (official `configure_finetuning.py`, step 3): `rte`/`sts` train 10 epochs;
a QA task (a name containing "squad" or "qa": squad, squadv1, newsqa, triviaqa, searchqa) uses
max_seq_length 512, 2 epochs and no test outputs; `chunk` uses max_seq_length 256 (and so do
electra-tf's `ner` and `pos`); anything else 3 epochs. `naturalqs` contains neither substring
and so keeps 128 / 3 epochs, as in the official code (QUIRK Q15: mirrored, with a warning).
Runs with several tasks get none of these.

electra-tf additions (documented in docs/finetuning.md): `layerwise_lr_decay_fix` (the issue #51
fix), `official_gpu_clip_norm` (the official CPU/GPU clip norm), `seed`, `random_init`, `strip_accents`, `mixed_precision`, `results_json`, `log_steps`,
`do_export`, `export_precision`, `skip_bad_answers` (QA), `flush_last_sentence`, `tagging_cased`,
`legacy_tagging_loss`, `tagging_label_column`, `tagging_scheme` and `tagging_entity_mode`
(tagging). The TPU hparams are accepted under their official names so
official hparam files load, and do nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import typing
from typing import Any, Mapping, Optional, Tuple, Union

from electra_tf import precision
from electra_tf.config import MODELS_DIR, check_model_name
from electra_tf.config.hparams import ConfigError, check_known_hparams, coerce_hparam, parse_hparams
from electra_tf.training import run_dir

logger = logging.getLogger("electra_tf")

MODEL_SIZES = ("small", "base", "large")
# Fine-tuning has no loss scaling, so no mixed_float16; "auto" picks bf16 where the device
# multiplies it natively, else float32 (electra_tf.precision).
PRECISIONS = ("auto", "float32", "mixed_bfloat16")

# Official configure_finetuning.py: per-size learning-rate settings applied after the hparams.
SIZE_PRESETS = {
    "small": {"embedding_size": 128},
    "base": {},
    "large": {"learning_rate": 5e-5, "layerwise_lr_decay": 0.9},
}
# Official single-task epoch defaults (rte and sts train longer).
TEN_EPOCH_TASKS = ("rte", "sts")
# Official single-task defaults of QA tasks (names containing "squad" or "qa") and chunking.
QA_PRESET = {"max_seq_length": 512, "num_train_epochs": 2.0, "write_test_outputs": False}
CHUNK_PRESET = {"max_seq_length": 256, "num_train_epochs": 3.0}
# chunk's, for electra-tf's tagging tasks too (sentences as long as chunking's).
TAGGING_PRESET_TASKS = ("chunk", "ner", "pos")
TAGGING_SCHEMES = ("BIO", "BIOES")
ENTITY_MODES = ("default", "strict")
DEBUG_PRESET = {
    "num_trials": 1,
    "iterations_per_loop": 1,
    "train_batch_size": 32,
    "num_train_epochs": 3.0,
    "log_examples": True,
}


@dataclasses.dataclass(frozen=True)
class FinetuningConfig:
    """All fine-tuning hparams (official `configure_finetuning.FinetuningConfig` names).

    Build one with `FinetuningConfig.create(model_name, data_dir, hparams)`.
    """

    model_name: str
    data_dir: str

    # --- General (official) ---
    debug: bool = False  # random-init debug model (3 layers, hidden 144), 1 trial
    log_examples: bool = False  # log the first encoded training examples
    num_trials: int = 1  # train+eval runs with seeds seed, seed+1, ...; mean and std reported
    do_train: bool = True
    do_eval: bool = True  # evaluate dev (and test when it has labels)
    keep_all_models: bool = True  # False: export only the last trial's model

    # --- Model (official) ---
    model_size: str = "small"  # only used with random_init / debug (otherwise: the pretrained model's)
    task_names: Tuple[str, ...] = ("chunk",)  # official default; set it (e.g. ["sst"])
    model_hparam_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    embedding_size: Optional[int] = None
    vocab_size: int = 30522
    do_lower_case: Optional[bool] = None  # None: as the pretrained model was trained (else True)

    # --- Training (official) ---
    learning_rate: float = 1e-4
    weight_decay_rate: float = 0.01
    layerwise_lr_decay: float = 0.8  # <= 0 disables; multiplier decay^(L+2-depth), see optimization.py
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.1
    # JAX / PyTorch: save a checkpoint every this many steps (and at the end), resumed by a
    # rerun; TensorFlow: accepted, nothing saved before the export at the end
    save_checkpoints_steps: int = 1000000
    iterations_per_loop: int = 1000  # steps per compiled call
    use_tfrecords_if_existing: bool = True  # accepted; features are built in memory

    # --- Outputs (official) ---
    write_test_outputs: bool = False  # write predictions for test files without labels
    n_writes_test: int = 5  # ... for the first n trials

    # --- Sizing (official) ---
    max_seq_length: int = 128
    train_batch_size: int = 32
    eval_batch_size: int = 32
    predict_batch_size: int = 32
    double_unordered: bool = True  # train mrpc/qqp/sts on both sentence orders

    # --- QA (official; electra_tf/finetuning/qa/) ---
    max_query_length: int = 64  # keep the first this many question WordPieces
    doc_stride: int = 128  # sliding-window step over the context's WordPieces
    n_best_size: int = 20  # n-best answers kept per question (and non-joint start/end candidates)
    max_answer_length: int = 30  # longest answer, in WordPieces
    answerable_classifier: bool = True  # a [CLS]-based "unanswerable" logit (the v2 null odds)
    answerable_uses_start_logits: bool = True  # ... fed the start-probability-weighted context too
    answerable_weight: float = 0.5  # its loss weight
    joint_prediction: bool = True  # end conditioned on the start (beam search at inference)
    beam_size: int = 20  # starts x ends per start kept in joint prediction
    qa_na_threshold: float = -2.75  # SQuAD 2.0: predict "no answer" when null odds > this

    # --- electra-tf additions ---
    layerwise_lr_decay_fix: bool = False  # True: head at depth L+1 (issue #51), not L+2
    # True: the global-norm clip sees the word-embedding gradient's rows unsummed, one per token
    # occurrence, as the official code on CPU/GPU (use_tpu=False); default: summed per id, the
    # gradient's true norm, as the official on TPU (docs/finetuning.md, "Optimizer").
    official_gpu_clip_norm: bool = False
    seed: int = 0  # trial t uses seed + t (init of the head, dropout, data order)
    random_init: bool = False  # ignore init_checkpoint: train from random weights (a floor)
    strip_accents: Optional[bool] = None  # None: as the pretrained model (else True)
    mixed_precision: str = "auto"  # auto (bf16 where native, else float32) | float32 | mixed_bfloat16
    log_steps: int = 100  # log the training loss every this many steps
    do_export: bool = True  # export the fine-tuned SavedModel(s) (see keep_all_models)
    # What the exported SavedModels compute in, whatever mixed_precision trained in:
    # float32 | bfloat16
    export_precision: str = "float32"
    skip_bad_answers: bool = False  # QA train: skip (official) instead of refusing bad answers
    flush_last_sentence: bool = False  # tagging: keep a last sentence without a blank line after
    # tagging: tokenize words as the model does (true) or lower-cased and accent-stripped (false,
    # official); null: false for chunk (official), true for ner and pos (case marks names).
    tagging_cased: Optional[bool] = None
    legacy_tagging_loss: bool = False  # tagging: report the official doubled eval loss
    tagging_label_column: int = -1  # tagging: the tag's field, 0-based (negative: from the end)
    tagging_scheme: str = "BIO"  # ner: the files' tags, BIO (B-/I-/O) or BIOES (+ E-/S-)
    tagging_entity_mode: str = "default"  # ner: entity rules, seqeval's default or strict

    # --- Paths (official names; derived from data_dir / model_name when None) ---
    raw_data_dir: Optional[str] = None  # DATA_DIR/finetuning_data; task files in raw_data_dir/<task>/
    vocab_file: Optional[str] = None
    init_checkpoint: Optional[str] = None  # model dir, checkpoint prefix or exported SavedModel
    model_dir: Optional[str] = None  # fine-tuned models: model_dir/<tasks>_model_<trial>
    results_txt: Optional[str] = None
    results_json: Optional[str] = None

    # ------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, model_name: str, data_dir: str,
               hparams: Union[None, str, Mapping[str, Any]] = None) -> "FinetuningConfig":
        """Builds a config the official way: defaults, hparams, presets, derived paths.

        Args:
            model_name: str. The pretrained run's name (DATA_DIR/models/MODEL_NAME).
            data_dir: str. Holds models/ and finetuning_data/.
            hparams: None, a JSON string, a path to a .json file, or a mapping.

        Raises:
            ConfigError: unknown key (named, with the closest valid one), wrong type or value.
        """
        user = parse_hparams(hparams)
        for key in ("model_name", "data_dir"):
            if key in user:
                raise ConfigError(f"hparam {key!r} is set by the command line, not by --hparams")
        _check_known(user)
        user = _without_ignored(user)
        check_model_name(model_name)
        values = {"model_name": model_name, "data_dir": data_dir}
        values.update({k: _coerce(k, v) for k, v in user.items()})

        size = values.get("model_size", cls.model_size)
        if size not in MODEL_SIZES:
            raise ConfigError(f"model_size must be one of {', '.join(MODEL_SIZES)}, got {size!r}")
        tasks = values.get("task_names", cls.task_names)
        presets = single_task_presets(tasks)
        presets.update(SIZE_PRESETS[size])
        if values.get("debug", False):
            presets.update(DEBUG_PRESET)
        for key, value in presets.items():
            values.setdefault(key, value)

        config = cls(**values)
        join = os.path.join
        pretrained = join(data_dir, MODELS_DIR, model_name)
        tasks_str = ",".join(config.task_names)
        derived = {}
        if config.raw_data_dir is None:
            derived["raw_data_dir"] = join(data_dir, "finetuning_data")
        if config.init_checkpoint is None:
            derived["init_checkpoint"] = pretrained
        if config.vocab_file is None:
            # Official: the pretrained model's vocab (or SentencePiece model), else
            # DATA_DIR/vocab.txt.
            derived["vocab_file"] = (run_dir.find_vocab_copy(pretrained)
                                     or join(data_dir, "vocab.txt"))
        if config.model_dir is None:
            derived["model_dir"] = join(pretrained, run_dir.FINETUNING_MODELS_DIR)
        if config.results_txt is None:
            derived["results_txt"] = join(pretrained, run_dir.FINETUNING_RESULTS_DIR,
                                          f"{tasks_str}_results.txt")
        if config.results_json is None:
            derived["results_json"] = join(pretrained, run_dir.FINETUNING_RESULTS_DIR,
                                           f"{tasks_str}_results.json")
        config = dataclasses.replace(config, **derived)
        config.validate()
        return config

    def validate(self) -> None:
        """Checks ranges and combinations; raises ConfigError naming the hparam."""
        def need(cond, message):
            if not cond:
                raise ConfigError(message)

        need(self.do_train or self.do_eval, "nothing to do: set do_train or do_eval to true")
        need(len(self.task_names) >= 1, "task_names must name at least one task")
        need(len(set(t.lower() for t in self.task_names)) == len(self.task_names),
             f"task_names has duplicates: {list(self.task_names)}")
        need(self.mixed_precision in PRECISIONS,
             f"mixed_precision must be one of {', '.join(PRECISIONS)}, got {self.mixed_precision!r}")
        need(precision.check_export_precision(self.export_precision) is None,
             precision.check_export_precision(self.export_precision))
        need(self.learning_rate >= 0, f"learning_rate must be >= 0, got {self.learning_rate}")
        need(self.weight_decay_rate >= 0, f"weight_decay_rate must be >= 0, got {self.weight_decay_rate}")
        need(self.layerwise_lr_decay <= 1.0,
             f"layerwise_lr_decay must be <= 1 (<= 0 disables it), got {self.layerwise_lr_decay}")
        need(self.num_train_epochs > 0, f"num_train_epochs must be > 0, got {self.num_train_epochs}")
        need(0.0 <= self.warmup_proportion <= 1.0,
             f"warmup_proportion must be in [0, 1], got {self.warmup_proportion}")
        need(8 <= self.max_seq_length <= 512,
             f"max_seq_length must be in [8, 512], got {self.max_seq_length}")
        for key in ("num_trials", "train_batch_size", "eval_batch_size", "predict_batch_size",
                    "iterations_per_loop", "log_steps", "vocab_size"):
            need(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        need(self.embedding_size is None or self.embedding_size >= 1, "embedding_size must be >= 1")
        for key in ("max_query_length", "doc_stride", "n_best_size", "max_answer_length",
                    "beam_size"):
            need(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        need(self.tagging_label_column != 0,
             "tagging_label_column 0 is the word column; the tag is a later field (-1: the last)")
        need(self.tagging_scheme in TAGGING_SCHEMES, f"tagging_scheme must be one of "
             f"{', '.join(TAGGING_SCHEMES)}, got {self.tagging_scheme!r}")
        need(self.tagging_entity_mode in ENTITY_MODES, f"tagging_entity_mode must be one of "
             f"{', '.join(ENTITY_MODES)}, got {self.tagging_entity_mode!r}")
        need(self.answerable_weight >= 0,
             f"answerable_weight must be >= 0, got {self.answerable_weight}")

    @property
    def task_names_str(self) -> str:
        return ",".join(self.task_names)

    def trial_model_dir(self, trial: int) -> str:
        """Where trial `trial` (1-based) exports: model_dir/<tasks>_model_<trial> (official naming)."""
        return os.path.join(self.model_dir, f"{self.task_names_str}_model_{trial}")

    def trial_checkpoint_dir(self, trial: int) -> str:
        """Where trial `trial` (1-based) of a JAX / PyTorch run saves its `ckpt-N.npz`:
        model_dir/<tasks>_checkpoints_<trial> (the TensorFlow runner saves none)."""
        return os.path.join(self.model_dir, f"{self.task_names_str}_checkpoints_{trial}")

    # --- Serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model_hparam_overrides"] = dict(self.model_hparam_overrides)
        d["task_names"] = list(self.task_names)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FinetuningConfig":
        """Rebuilds a resolved config (e.g. one saved with a fine-tuned model)."""
        d = _without_ignored(d)
        _check_known({k: v for k, v in d.items() if k not in ("model_name", "data_dir")})
        config = cls(**{k: _coerce(k, v) if k not in ("model_name", "data_dir") else v
                        for k, v in d.items()})
        config.validate()
        return config


def single_task_presets(task_names) -> dict:
    """The official single-task defaults (`configure_finetuning.py`), for keys the user left alone.

    Args:
        task_names: the run's task names.

    Returns:
        {hparam: value}; empty for a run with several tasks (official: they keep L = 128 and
        3 epochs).
    """
    if len(task_names) != 1:
        return {}
    task = task_names[0].lower()
    if task in TEN_EPOCH_TASKS:
        return {"num_train_epochs": 10.0}
    if "squad" in task or "qa" in task:
        return dict(QA_PRESET)
    if task in TAGGING_PRESET_TASKS:
        return dict(CHUNK_PRESET)
    if task == "naturalqs":
        logger.warning("naturalqs gets no QA defaults (max_seq_length 128, 3 epochs), as in the "
                       "official code; set max_seq_length / num_train_epochs to change that")
    return {"num_train_epochs": 3.0}


HPARAM_NAMES = tuple(f.name for f in dataclasses.fields(FinetuningConfig)
                     if f.name not in ("model_name", "data_dir"))
# The official TPUEstimator settings: accepted so official hparam files (and config.json files of
# older electra-tf versions) load, then dropped; they have no effect here (docs/finetuning.md).
IGNORED_OFFICIAL_HPARAMS = ("use_tpu", "num_tpu_cores", "tpu_job_name", "tpu_name", "tpu_zone",
                            "gcp_project")


def _check_known(hparams: Mapping[str, Any]) -> None:
    check_known_hparams(hparams, HPARAM_NAMES + IGNORED_OFFICIAL_HPARAMS)


def _without_ignored(hparams: Mapping[str, Any]) -> dict:
    return {k: v for k, v in hparams.items() if k not in IGNORED_OFFICIAL_HPARAMS}


_TYPES = typing.get_type_hints(FinetuningConfig)


def _coerce(key: str, value: Any) -> Any:
    """Checks a value against the field's type; ints pass for floats, a string or list for
    task_names (official accepts "a,b" on its command line too)."""
    if key == "task_names":
        if isinstance(value, str):
            value = [t.strip() for t in value.split(",") if t.strip()]
        if not (isinstance(value, (list, tuple)) and all(isinstance(t, str) and t for t in value)):
            raise ConfigError(f"hparam 'task_names' must be a list of task names, got {value!r}")
        return tuple(value)
    return coerce_hparam(key, value, _TYPES[key])
