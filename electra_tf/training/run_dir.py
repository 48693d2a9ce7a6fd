"""The run directory (`DATA_DIR/models/NAME`, `config.model_dir`): its names and its contract.

    MODEL_DIR/
      config.json              the resolved PretrainingConfig (before step 0, again on resume)
      vocab.txt                the vocab the run started with (later runs must use the same);
                               spm.model instead for a SentencePiece model
      dataset_manifest.json    the training dataset's manifest: how its text was tokenised
      checkpoint, ckpt-N.*     the trainer's checkpoints (model, optimizer, RNG and data state)
      workers/worker_<i>/      a non-chief worker's own checkpoints (its data position)
      init_checkpoint/ckpt-0.* weights imported by `python -m electra_tf.convert from-google`
      eval_results.txt, eval/  the last evaluation; TensorBoard events (train here, eval in eval/)
      export/{discriminator,generator}/   SavedModels (training.export)
      finetuning_models/, results/        fine-tuned models and their results (run_finetuning.py)

Everything that writes the directory as a whole (`prepare`, `copy_dataset_manifest`,
`remove_run`, `write_imported`) or reads it (`tokenization_settings`, `load_run`) is here, so
the trainer, the exporters, the converters and fine-tuning agree on it; finding, checking and repairing its checkpoint files is in `training.checkpoint_files`.
Problems are `TrainingError`s naming the path.

TensorFlow is imported only by the functions that read or write checkpoints, so the names serve
light command-line code (`--help`) too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from typing import NamedTuple, Optional

from electra_tf import atomic
from electra_tf.config import PretrainingConfig
from electra_tf.errors import TrainingError, error_line, shown_path
from electra_tf.locking import LOCK_NAME, DirectoryLock, current_holder, describe, held_here
from electra_tf.training import checkpoint_files
from electra_tf.vocab import Vocab, file_sha256, load_vocab

logger = logging.getLogger("electra_tf")

# --- Names ----------------------------------------------------------------------------------------
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.txt"
SPM_MODEL_NAME = "spm.model"  # the copy of a SentencePiece vocabulary, in place of vocab.txt
DATASET_MANIFEST_COPY = "dataset_manifest.json"
EVAL_RESULTS_NAME = "eval_results.txt"
EVAL_SUMMARY_DIR = "eval"
# Where a non-chief worker keeps its own checkpoints: its data iterator position differs from the
# chief's, so it needs its own to resume exactly (`worker_checkpoint_dir`).
WORKER_CHECKPOINT_DIR = "workers"
EXPORT_DIR = "export"
FINETUNING_MODELS_DIR = "finetuning_models"
FINETUNING_RESULTS_DIR = "results"

# Hparams that change the model's variables or the data it reads: a run cannot resume with
# different values. Everything else (steps, learning rate, batch size, ...) may change.
STRUCTURAL_HPARAMS = (
    "model_size", "model_hparam_overrides", "embedding_size", "vocab_size", "max_seq_length",
    "electra_objective", "uniform_generator", "untied_generator", "untied_generator_embeddings",
    "generator_layers", "generator_hidden_size", "embedding_sharing", "debug",
)
# Keys every saved config.json has: how `--overwrite` recognises a run directory it may delete.
_RUN_MARKER_KEYS = ("model_name", "model_size", "max_seq_length", "vocab_size")
# Every top-level name a run directory may hold (`is_run_entry`): what `--overwrite` may delete.
_RUN_ENTRIES = frozenset((
    CONFIG_NAME, VOCAB_NAME, DATASET_MANIFEST_COPY, EVAL_RESULTS_NAME, EVAL_SUMMARY_DIR,
    checkpoint_files.CHECKPOINT_STATE_NAME, WORKER_CHECKPOINT_DIR, checkpoint_files.INIT_CHECKPOINT_DIR,
    EXPORT_DIR, FINETUNING_MODELS_DIR, FINETUNING_RESULTS_DIR, LOCK_NAME))
_RUN_ENTRY_PATTERN = re.compile(
    # checkpoints (.npz: JAX / PyTorch)
    rf"^({re.escape(checkpoint_files.CHECKPOINT_PREFIX)}-\d+(\.index|\.data-\d+-of-\d+|_temp|\.npz)"
    r"|checkpoint\.tmp[0-9a-f]*"  # TensorFlow's temporary state file
    r"|events\.out\.tfevents\..*"  # TensorBoard
    r"|\..+\.tmp-[a-z0-9_]+(\.old)?)$")  # an interrupted atomic write (electra_tf.atomic)
# BERT's accent stripping when nothing records the setting (the builder's default too).
DEFAULT_STRIP_ACCENTS = True


# --- Writing ---------------------------------------------------------------------------------------
def vocab_copy_name(vocab_path: str) -> str:
    """The name of a vocabulary's copy in a run or export: vocab.txt, or spm.model for a
    SentencePiece model."""
    # lazy: the SentencePiece reader is wanted only for a vocab of that kind
    from electra_tf.sentencepiece_vocab import looks_like_sentencepiece

    try:
        with open(vocab_path, "rb") as f:
            head = f.read(1)
    except OSError:
        head = b""
    return SPM_MODEL_NAME if looks_like_sentencepiece(vocab_path, head) else VOCAB_NAME


def find_vocab_copy(directory: str) -> Optional[str]:
    """The vocabulary copy in `directory` (vocab.txt, else spm.model), or None."""
    for name in (VOCAB_NAME, SPM_MODEL_NAME):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def prepare(config: PretrainingConfig, vocab_path: str, vocab_sha256: str, write: bool) -> None:
    """Checks an existing run in `config.model_dir` is compatible; creates/updates it if `write`.

    Writes the resolved config as `config.json` (before step 0, and again on every resume, so it
    shows the current `num_train_steps`) and a copy of the vocab, which later runs compare with.

    Raises:
        TrainingError: the directory holds a run with other structural hparams or another vocab.
    """
    config_path = os.path.join(config.model_dir, CONFIG_NAME)
    saved_vocab = find_vocab_copy(config.model_dir) or os.path.join(
        config.model_dir, vocab_copy_name(vocab_path))
    if os.path.exists(config_path):
        try:
            previous = PretrainingConfig.load(config_path)
        except (ValueError, TypeError) as e:  # ConfigError, invalid JSON or UTF-8
            raise TrainingError(_unreadable_config(config.model_dir, e)) from None
        for key in STRUCTURAL_HPARAMS:
            old, new = getattr(previous, key), getattr(config, key)
            if old != new:
                raise TrainingError(
                    f"{config.model_dir} holds a run with {key}={old!r}; this run has {key}={new!r}. "
                    "Use the run's hparams, another --model-name, or --overwrite to start afresh")
        # Evaluation and export only read the checkpoint, which every backend can; weights
        # imported by from-google (`init_checkpoint/`) start a run on any backend.
        if (write and previous.backend != config.backend
                and holds_run_checkpoints(config.model_dir)):
            raise TrainingError(
                f"{config.model_dir} holds a run trained with --backend {previous.backend}; this "
                f"run has --backend {config.backend} (the checkpoint formats differ). Use "
                f"--backend {previous.backend}, another --model-name, or --overwrite")
        _note_precision_change(previous, config)
        if os.path.exists(saved_vocab) and file_sha256(saved_vocab) != vocab_sha256:
            raise TrainingError(
                f"{config.model_dir} was trained with the vocab saved as {saved_vocab}, which "
                f"differs from {vocab_path}; use that vocab, another --model-name, or --overwrite")
    if write:
        os.makedirs(config.model_dir, exist_ok=True)
        config.save(config_path)
        if not os.path.exists(saved_vocab):
            atomic.copy_file(vocab_path, saved_vocab)


def holds_run_checkpoints(model_dir: str) -> bool:
    """Whether `model_dir` holds a training run's checkpoints (TensorFlow's `ckpt-N` or
    `ckpt-N.npz`), not only the weights `from-google` imported (`init_checkpoint/`)."""
    names = os.listdir(model_dir) if os.path.isdir(model_dir) else ()
    return any(_RUN_CHECKPOINT_PATTERN.match(name) for name in names)


_RUN_CHECKPOINT_PATTERN = re.compile(
    rf"^{re.escape(checkpoint_files.CHECKPOINT_PREFIX)}-\d+(\.index|\.npz)$")


def _note_precision_change(previous: PretrainingConfig, config: PretrainingConfig) -> None:
    """Warns when a resumed run continues in another precision (e.g. "auto" on another kind of
    machine): the weights carry over (they are float32 under every policy), but the losses no
    longer repeat an uninterrupted run's."""
    old, new = previous.resolved_mixed_precision, config.resolved_mixed_precision
    if old and new and old != new:
        logger.warning("%s was trained in %s until now; it continues in %s (%s)",
                       config.model_dir, old, new, config.resolved_mixed_precision_reason)


def _unreadable_config(model_dir: str, error: Exception) -> str:
    """What is wrong with a run's unreadable config.json, and advice that works."""
    path = os.path.join(model_dir, CONFIG_NAME)
    if os.path.getsize(path) == 0:
        what = "is empty (0 bytes: a crash or a full disk while it was written?)"
    else:
        what = f"is not a readable electra-tf config ({error_line(error, limit=200)})"
    reason = not_a_run_reason(model_dir)
    if reason is None:
        advice = ("pass --overwrite to delete this run and start afresh, or use another "
                  "--model-name")
    else:
        advice = f"use another --model-name (--overwrite would refuse: {reason})"
    return f"{shown_path(path)} {what}; {advice}"


def copy_dataset_manifest(model_dir: str, manifest_path: str) -> None:
    """Keeps the training dataset's manifest in the run: provenance, and how the data was
    tokenised (what the export's `serve_text` repeats, see `tokenization_settings`)."""
    atomic.copy_file(manifest_path, os.path.join(model_dir, DATASET_MANIFEST_COPY))


def is_run_dir(model_dir: str) -> bool:
    """True if `model_dir` holds an electra-tf run (a `config.json` this project wrote)."""
    return _config_state(model_dir) == "ours"


def _config_state(model_dir: str) -> str:
    """"ours" (a config.json with the run keys), "damaged" (empty or not JSON), "foreign"
    (JSON of something else) or "missing"."""
    path = os.path.join(model_dir, CONFIG_NAME)
    if not os.path.isfile(path):
        return "missing"
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (ValueError, OSError):
        return "damaged"
    ours = isinstance(saved, dict) and all(k in saved for k in _RUN_MARKER_KEYS)
    return "ours" if ours else "foreign"


def is_run_entry(name: str) -> bool:
    """True for a top-level name that electra-tf writes in a run directory."""
    return name in _RUN_ENTRIES or bool(_RUN_ENTRY_PATTERN.match(name))


def not_a_run_reason(model_dir: str) -> Optional[str]:
    """Why `model_dir` is not recognisably one electra-tf run, or None if it is.

    A run directory has a `config.json` (ours, or damaged: empty or not JSON) and nothing but
    the names the trainer, exports, converters and fine-tuning write (`is_run_entry`). A
    directory holding anything else (another run, a dataset, the user's files) is not one run.
    """
    state = _config_state(model_dir)
    if state == "missing":
        return f"it has no {CONFIG_NAME}"
    if state == "foreign":
        return f"its {CONFIG_NAME} was not written by electra-tf"
    foreign = sorted(name for name in os.listdir(model_dir) if not is_run_entry(name))
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        return f"it holds {shown_path(foreign[0])}{more}, which is not part of a run"
    return None


def remove_run(model_dir: str) -> bool:
    """Deletes a previous run (`--overwrite`), refusing anything that is not recognisably one run.

    Only a directory `not_a_run_reason` accepts is touched, so an empty or mistaken model name
    (the parent of several runs, the data directory) can never delete more than one run. The
    directory's lock file stays if this process holds it (a copied or stale one goes); the
    directory itself goes unless that lock file is in it.

    Returns:
        True if something was deleted.

    Raises:
        TrainingError: naming the directory and why it is not a run (nothing is deleted).
    """
    if not os.path.isdir(model_dir):
        if os.path.lexists(model_dir):
            raise TrainingError(f"refusing to overwrite {shown_path(model_dir)}: it is a file, "
                                "not a run directory")
        return False
    held = held_here(model_dir)
    holder = None if held else current_holder(model_dir)
    if holder is not None:  # (the trainer takes the lock first: a direct call met a writer)
        raise TrainingError(f"refusing to delete {shown_path(model_dir)}: it is in use by "
                            f"{describe(holder)}")
    names = [name for name in os.listdir(model_dir) if not (held and name == LOCK_NAME)]
    if not names:
        return False
    if names == [LOCK_NAME]:  # only a stale lock file: nothing of a run to delete
        return False
    reason = not_a_run_reason(model_dir)
    if reason is not None:
        raise TrainingError(
            f"refusing to delete {shown_path(model_dir)} for --overwrite: {reason}. Only one run "
            f"directory ({CONFIG_NAME}, vocab.txt, checkpoints, exports...) is ever deleted; "
            "check --model-name, or move the other files away")
    if len(names) == len(os.listdir(model_dir)):
        shutil.rmtree(model_dir)
    else:
        for name in names:
            path = os.path.join(model_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    logger.info("--overwrite: deleted the previous run in %s", shown_path(model_dir))
    return True


def lock(directory: str, training: bool) -> Optional[DirectoryLock]:
    """Locks the directory this process writes (a run, or a non-chief worker's own checkpoints)
    before anything there is written or deleted; a second writer stops with one line naming
    this process (`electra_tf.locking`).

    Args:
        directory: str. The directory.
        training: bool. The run trains (creates the directory). Otherwise (evaluation or export
            only) a missing directory is not created (the run stops with "no checkpoint"), and a
            read-only one is used without a lock (only what can be written is).

    Raises:
        LockError: another process writes there.
        TrainingError: a training run cannot write there.
    """
    if not training and not os.path.isdir(directory):
        return None
    try:
        os.makedirs(directory, exist_ok=True)
        return DirectoryLock(directory, "model dir").acquire()
    except OSError as e:
        if training:
            raise TrainingError(f"cannot write in the model dir {shown_path(directory)}: "
                                f"{error_line(e)}") from None
        logger.warning("model dir %s is not writable (%s): running without its lock",
                       shown_path(directory), error_line(e))
        return None


def worker_checkpoint_dir(model_dir: str, task_id: int) -> str:
    """The directory of a non-chief worker's own checkpoints."""
    return os.path.join(model_dir, WORKER_CHECKPOINT_DIR, f"worker_{task_id}")


def write_imported(output_dir: str, config: PretrainingConfig, vocab_file: str, model,
                   global_step: int, overwrite: bool) -> str:
    """Writes imported weights as a run a trainer can start from (`from-google`).

    `init_checkpoint/` (model and step, no optimizer), `config.json` and the vocab copy; the
    checkpoint directory appears complete or not at all. It holds the weights twice: TensorFlow's
    checkpoint `ckpt-0` (what the TensorFlow trainer, fine-tuning and the converters read) and
    `ckpt-0.npz` (`npz_checkpoint`'s format, what `--backend jax|torch` read without
    TensorFlow).

    Returns:
        The checkpoint prefix written.
    """
    import tensorflow as tf

    # lazy: it imports keras; configuration code reads this module's names without it
    from electra_tf.training import npz_checkpoint

    init_dir = os.path.join(output_dir, checkpoint_files.INIT_CHECKPOINT_DIR)
    if os.path.exists(init_dir) and not overwrite:  # the caller checked; a concurrent writer
        raise TrainingError(f"{init_dir} appeared while converting; not replacing it")
    with atomic.atomic_path(init_dir, directory=True) as staging:
        step = tf.Variable(global_step, dtype=tf.int64, trainable=False)
        checkpoint = checkpoint_files.run_checkpoint(model, step=step)
        tf.train.CheckpointManager(checkpoint, staging, max_to_keep=1,
                                   checkpoint_name=checkpoint_files.CHECKPOINT_PREFIX).save(checkpoint_number=0)
        npz_checkpoint.save(staging, global_step, model, None, None, None,
                                 name=checkpoint_files.INIT_PORTABLE_NAME)
    config.save(os.path.join(output_dir, CONFIG_NAME))
    vocab_out = os.path.join(output_dir, VOCAB_NAME)
    if os.path.abspath(vocab_file) != os.path.abspath(vocab_out):
        atomic.copy_file(vocab_file, vocab_out)
    path = tf.train.latest_checkpoint(init_dir)
    logger.info("wrote %s, %s and %s", os.path.join(output_dir, CONFIG_NAME), vocab_out, path)
    return path


# --- Reading ---------------------------------------------------------------------------------------
class TokenizationSettings(NamedTuple):
    """How the training data was tokenised (what `serve_text` and exports must repeat)."""

    do_lower_case: bool
    strip_accents: bool
    source: str


def tokenization_settings(config: PretrainingConfig,
                          model_dir: Optional[str] = None) -> TokenizationSettings:
    """The builder's `do_lower_case` / `strip_accents`, from the dataset manifest.

    Looks at the manifest copy in the run (saved when training started), then at the manifest
    beside the training shards; without either, `config.do_lower_case` and BERT's default
    accent stripping.

    Args:
        config: the run's PretrainingConfig.
        model_dir: where the run is now, if not `config.model_dir` (a moved or copied run).
    """
    from electra_tf.data.records.tfrecord_io import MANIFEST_NAME  # lazy: numpy, imported late

    candidates = [os.path.join(model_dir or config.model_dir, DATASET_MANIFEST_COPY)]
    if config.pretrain_tfrecords:
        first_pattern = config.pretrain_tfrecords.split(",")[0].strip()
        candidates.append(os.path.join(os.path.dirname(first_pattern), MANIFEST_NAME))
    for path in candidates:
        try:
            with open(path, encoding="utf-8") as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and "do_lower_case" in manifest:
            return TokenizationSettings(bool(manifest["do_lower_case"]),
                                        bool(manifest.get("strip_accents", DEFAULT_STRIP_ACCENTS)),
                                        path)
    return TokenizationSettings(config.do_lower_case, DEFAULT_STRIP_ACCENTS, "config")


# How a converter's user names another checkpoint than a run's newest (`load_run`'s messages).
PASS_CHECKPOINT = "pass --checkpoint"


def _portable_checkpoint_to_read(model_dir: str, checkpoint: Optional[str],
                                 config: PretrainingConfig,
                                 another: str = PASS_CHECKPOINT) -> Optional[str]:
    """The `ckpt-N.npz` to read: `checkpoint` if it is one (or a directory of them, for a run
    of another backend), else the newest of a JAX / PyTorch run; None for TensorFlow checkpoints."""
    # lazy: it imports keras; configuration code reads this module's names without it
    from electra_tf.training import npz_checkpoint

    if checkpoint and checkpoint.endswith(npz_checkpoint.SUFFIX):
        if not os.path.isfile(checkpoint):
            raise TrainingError(f"--checkpoint {checkpoint}: no such file")
        npz_checkpoint.check_named(checkpoint)
        return checkpoint
    if config.backend == "tensorflow":
        return None
    found = npz_checkpoint.latest_good(checkpoint or model_dir)
    if found is None and not checkpoint and os.path.isdir(
            os.path.join(model_dir, checkpoint_files.INIT_CHECKPOINT_DIR)):
        return None  # a JAX / PyTorch run stopped before its first save: the imported weights
    if found is None:
        name = f"{checkpoint_files.CHECKPOINT_PREFIX}-N{npz_checkpoint.SUFFIX}"
        raise TrainingError(f"no checkpoint ({name}) in {checkpoint or model_dir}: train first "
                            f"or {another}")
    return found


def is_portable_run(model_dir: str, checkpoint: Optional[str] = None) -> bool:
    """Whether `load_run` reads a JAX / PyTorch checkpoint (`ckpt-N.npz`) here: `checkpoint`
    names one, or the run's config.json says its backend is jax or torch. No TensorFlow needed
    to tell."""
    if checkpoint:
        return checkpoint.endswith(".npz")
    try:
        with open(os.path.join(model_dir, CONFIG_NAME), encoding="utf-8") as f:
            backend = json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return False
    return backend != "tensorflow"


class LoadedRun(NamedTuple):
    """A run's model, restored for export, conversion or fine-tuning.

    Attributes:
        config: PretrainingConfig from config.json.
        vocab: Vocab from vocab.txt.
        model: the built ElectraPretrainer with the checkpoint's weights.
        checkpoint: str, the checkpoint prefix read.
        step: int, the training step of that checkpoint (0 if unknown).
    """

    config: PretrainingConfig
    vocab: Vocab
    model: object
    checkpoint: str
    step: int


def load_run(model_dir: str, checkpoint: Optional[str] = None,
             another: str = PASS_CHECKPOINT) -> LoadedRun:
    """Builds the model described by `model_dir/config.json` and restores its weights.

    Only the `model` part of the checkpoint is read (no optimizer slots, data position or RNG
    states), so this works on the trainer's checkpoints and on imported ones alike.

    Args:
        model_dir: a run directory.
        checkpoint: optional checkpoint prefix (or directory) instead of `checkpoint_to_read`'s.
        another: str. How the caller's user names another checkpoint, for the message when the
            run has none ("pass --checkpoint": the converters' flag).

    Raises:
        TrainingError: files missing, or the checkpoint does not match the config.
    """
    # lazy: loading a run needs keras, the model and the data checks; this module's names do not
    from electra_tf.training import run_base

    if not is_portable_run(model_dir, checkpoint):  # ckpt-N.npz: read on any backend
        run_base.check_keras_backend("tensorflow", "reading a run (conversion, fine-tuning)")
    from electra_tf.training.pretrainer import ElectraPretrainer  # lazy: after the check above

    config_path = os.path.join(model_dir, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise TrainingError(f"{model_dir}: no {CONFIG_NAME} (not an electra-tf run directory)")
    try:
        config = PretrainingConfig.load(config_path)
    except (ValueError, TypeError) as e:  # ConfigError, invalid JSON or UTF-8
        raise TrainingError(f"{config_path}: {e}") from None
    vocab = load_vocab(find_vocab_copy(model_dir) or config.vocab_file)
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special, vocab.tokens,
                                                      vocab.kind)
    model.build_from_sequence_length()
    portable = _portable_checkpoint_to_read(model_dir, checkpoint, config, another)
    if portable is not None:  # a run of --backend jax / torch (ckpt-N.npz)
        from electra_tf.training import npz_checkpoint  # lazy: as above (keras)

        saved = npz_checkpoint.restore(portable, model, None)
        logger.info("read %s (step %d) with the model of %s", portable, saved.step, config_path)
        return LoadedRun(config, vocab, model, portable, saved.step)
    import tensorflow as tf  # here: a JAX / PyTorch run's checkpoint (above) needs none

    found = checkpoint_files.checkpoint_to_read(model_dir, checkpoint)
    if found is None:
        raise TrainingError(f"no checkpoint in {model_dir} (nor in {checkpoint_files.INIT_CHECKPOINT_DIR}/): train "
                            f"first, import one with from-google, or {another}")
    try:
        checkpoint_files.run_checkpoint(model).restore(
            found.path).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise TrainingError(f"checkpoint {found.path} does not match {config_path}: "
                            f"{error_line(e)}") from None
    step = checkpoint_files.checkpoint_step(found.path)
    logger.info("read %s (step %d) with the model of %s", found.path, step, config_path)
    return LoadedRun(config, vocab, model, found.path, step)
