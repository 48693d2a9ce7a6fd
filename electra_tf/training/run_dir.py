"""The run directory (`DATA_DIR/models/NAME`, `config.model_dir`): its names and its contract.

    MODEL_DIR/
      config.json              the resolved PretrainingConfig (before step 0, again on resume)
      vocab.txt                the vocab the run started with (later runs must use the same)
      dataset_manifest.json    the training dataset's manifest: how its text was tokenised
      checkpoint, ckpt-N.*     the trainer's checkpoints (model, optimizer, RNG and data state)
      workers/worker_<i>/      a non-chief worker's own checkpoints (its data position)
      init_checkpoint/ckpt-0.* weights imported by `python -m electra_tf.convert from-google`
      eval_results.txt, eval/  the last evaluation; TensorBoard events (train here, eval in eval/)
      export/{discriminator,generator}/   SavedModels (training.export)
      finetuning_models/, results/        fine-tuned models and their results (run_finetuning.py)

Everything that writes the directory as a whole (`prepare`, `copy_dataset_manifest`,
`remove_run`, `write_imported`) or reads it (`tokenization_settings`, `checkpoint_to_read`,
`load_run`) is here, so the trainer, the exporters, the converters and fine-tuning agree on it.
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
from typing import List, NamedTuple, Optional

from electra_tf import atomic
from electra_tf.config import ConfigError, PretrainingConfig
from electra_tf.errors import TrainingError, error_line
from electra_tf.vocab import Vocab, file_sha256, load_vocab

logger = logging.getLogger("electra_tf")

# --- Names ----------------------------------------------------------------------------------------
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.txt"
DATASET_MANIFEST_COPY = "dataset_manifest.json"
EVAL_RESULTS_NAME = "eval_results.txt"
EVAL_SUMMARY_DIR = "eval"
# tf.train.CheckpointManager's checkpoint_name: checkpoints are `ckpt-<global step>`.
CHECKPOINT_PREFIX = "ckpt"
# Where a non-chief worker keeps its own checkpoints: its data iterator position differs from the
# chief's, so it needs its own to resume exactly (`worker_checkpoint_dir`).
WORKER_CHECKPOINT_DIR = "workers"
# Where `from-google` puts the imported weights (`tf.train.Checkpoint(model=..., step=...)`); a run
# starts from them when it has no checkpoint of its own.
INIT_CHECKPOINT_DIR = "init_checkpoint"
EXPORT_DIR = "export"
FINETUNING_MODELS_DIR = "finetuning_models"
FINETUNING_RESULTS_DIR = "results"

# Hparams that change the model's variables or the data it reads: a run cannot resume with
# different values. Everything else (steps, learning rate, batch size, ...) may change.
STRUCTURAL_HPARAMS = (
    "model_size", "model_hparam_overrides", "embedding_size", "vocab_size", "max_seq_length",
    "electra_objective", "uniform_generator", "untied_generator", "untied_generator_embeddings",
    "generator_layers", "generator_hidden_size", "debug",
)
# Keys every saved config.json has: how `--overwrite` recognises a run directory it may delete.
_RUN_MARKER_KEYS = ("model_name", "model_size", "max_seq_length", "vocab_size")
# Checkpoint keys of the step counter: the trainer's optimizer, or from-google's `step`.
_STEP_KEYS = ("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
              "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE",
              "step/.ATTRIBUTES/VARIABLE_VALUE")
# BERT's accent stripping when nothing records the setting (the builder's default too).
DEFAULT_STRIP_ACCENTS = True


# --- Writing ---------------------------------------------------------------------------------------
def prepare(config: PretrainingConfig, vocab_path: str, vocab_sha256: str, write: bool) -> None:
    """Checks an existing run in `config.model_dir` is compatible; creates/updates it if `write`.

    Writes the resolved config as `config.json` (before step 0, and again on every resume, so it
    shows the current `num_train_steps`) and a copy of the vocab, which later runs compare with.

    Raises:
        TrainingError: the directory holds a run with other structural hparams or another vocab.
    """
    config_path = os.path.join(config.model_dir, CONFIG_NAME)
    saved_vocab = os.path.join(config.model_dir, VOCAB_NAME)
    if os.path.exists(config_path):
        try:
            previous = PretrainingConfig.load(config_path)
        except (ConfigError, TypeError) as e:
            raise TrainingError(f"{config_path} is not a readable electra-tf config ({e}); use "
                                "another --model-name, or --overwrite to start afresh") from None
        for key in STRUCTURAL_HPARAMS:
            old, new = getattr(previous, key), getattr(config, key)
            if old != new:
                raise TrainingError(
                    f"{config.model_dir} holds a run with {key}={old!r}; this run has {key}={new!r}. "
                    "Use the run's hparams, another --model-name, or --overwrite to start afresh")
        if os.path.exists(saved_vocab) and file_sha256(saved_vocab) != vocab_sha256:
            raise TrainingError(
                f"{config.model_dir} was trained with the vocab saved as {saved_vocab}, which "
                f"differs from {vocab_path}; use that vocab, another --model-name, or --overwrite")
    if write:
        os.makedirs(config.model_dir, exist_ok=True)
        config.save(config_path)
        if not os.path.exists(saved_vocab):
            atomic.copy_file(vocab_path, saved_vocab)


def copy_dataset_manifest(model_dir: str, manifest_path: str) -> None:
    """Keeps the training dataset's manifest in the run: provenance, and how the data was
    tokenised (what the export's `serve_text` repeats, see `tokenization_settings`)."""
    atomic.copy_file(manifest_path, os.path.join(model_dir, DATASET_MANIFEST_COPY))


def is_run_dir(model_dir: str) -> bool:
    """True if `model_dir` holds an electra-tf run (a `config.json` this project wrote)."""
    try:
        with open(os.path.join(model_dir, CONFIG_NAME), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and all(k in saved for k in _RUN_MARKER_KEYS)


def remove_run(model_dir: str) -> bool:
    """Deletes a previous run's directory (`--overwrite`), refusing one that is not a run.

    Returns:
        True if a directory was deleted.

    Raises:
        TrainingError: `model_dir` is not empty and holds no electra-tf `config.json` (it may be
            user data: nothing is deleted).
    """
    if not os.path.isdir(model_dir):
        if os.path.exists(model_dir):
            raise TrainingError(f"refusing to overwrite {model_dir}: it is a file, not a run directory")
        return False
    if os.listdir(model_dir) and not is_run_dir(model_dir):
        raise TrainingError(f"refusing to delete {model_dir}: it does not look like an electra-tf "
                            f"run directory (no {CONFIG_NAME} written by run_pretraining.py)")
    shutil.rmtree(model_dir)
    logger.info("--overwrite: deleted the previous run in %s", model_dir)
    return True


def worker_checkpoint_dir(model_dir: str, task_id: int) -> str:
    """The directory of a non-chief worker's own checkpoints."""
    return os.path.join(model_dir, WORKER_CHECKPOINT_DIR, f"worker_{task_id}")


def write_imported(output_dir: str, config: PretrainingConfig, vocab_file: str, model,
                   global_step: int, overwrite: bool) -> str:
    """Writes imported weights as a run a trainer can start from (`from-google`).

    `init_checkpoint/` (model and step, no optimizer), `config.json` and the vocab copy; the
    checkpoint directory appears complete or not at all.

    Returns:
        The checkpoint prefix written.
    """
    import tensorflow as tf

    init_dir = os.path.join(output_dir, INIT_CHECKPOINT_DIR)
    if os.path.exists(init_dir) and not overwrite:  # the caller checked; a concurrent writer
        raise TrainingError(f"{init_dir} appeared while converting; not replacing it")
    with atomic.atomic_path(init_dir, directory=True) as staging:
        step = tf.Variable(global_step, dtype=tf.int64, trainable=False)
        checkpoint = tf.train.Checkpoint(model=model, step=step)
        tf.train.CheckpointManager(checkpoint, staging, max_to_keep=1,
                                   checkpoint_name=CHECKPOINT_PREFIX).save(checkpoint_number=0)
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
    from electra_tf.data.tfrecord_io import MANIFEST_NAME  # beside the shards (numpy: imported late)

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


def checkpoint_number(path: str) -> int:
    """N of a checkpoint prefix `.../ckpt-N` (the global step it was saved at)."""
    return int(os.path.basename(path).rsplit("-", 1)[1])


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the checkpoint `path` (a prefix `.../ckpt-N`) cannot be restored, or None if it can.

    Reads every tensor back: the bundle reader checks each tensor's CRC32C, so a truncated or
    garbled `.data` file, a garbled `.index` or a missing file is found here, before any
    variable is assigned (costs one extra read of the checkpoint).
    """
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(path)
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype == tf.variant:  # the data iterator's state: not convertible to numpy
                tf.raw_ops.RestoreV2(prefix=path, tensor_names=[name], shape_and_slices=[""],
                                     dtypes=[tf.variant])
            else:
                reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, OSError, IndexError, RuntimeError, TypeError) as e:
        # (the reader raises IndexError for a data file cut short)
        return error_line(e)
    return None


def checkpoint_candidates(directory: str) -> List[str]:
    """Checkpoint prefixes `ckpt-N` in `directory`, newest (highest N) first: every one with an
    index file, and those the `checkpoint` state file names (even if their files are gone)."""
    import tensorflow as tf

    prefixes = {path[:-len(".index")] for path in
                tf.io.gfile.glob(os.path.join(directory, f"{CHECKPOINT_PREFIX}-*.index"))}
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, ValueError):  # a garbled state file: the index files decide
        state = None
    if state is not None:
        for path in list(state.all_model_checkpoint_paths) + [state.model_checkpoint_path]:
            if path:
                prefixes.add(path if os.path.isabs(path) else os.path.join(directory, path))
    numbered = []
    for prefix in prefixes:
        try:
            numbered.append((checkpoint_number(prefix), prefix))
        except ValueError:
            continue
    return [prefix for _, prefix in sorted(numbered, reverse=True)]


def latest_good_checkpoint(directory: str, at_step: Optional[int] = None) -> Optional[str]:
    """The newest checkpoint in `directory` that reads back intact (see `checkpoint_problem`).

    A corrupted, truncated or missing newer checkpoint (a crash or full disk mid-save, bit rot)
    is skipped with a warning naming it; the run resumes from the previous good one.

    Args:
        directory: a run (or worker checkpoint) directory.
        at_step: only consider the checkpoint of this step.

    Returns:
        The checkpoint prefix, or None if the directory holds no checkpoint at all.

    Raises:
        TrainingError: there are checkpoints but none is readable (never trains from garbage).
    """
    import tensorflow as tf

    candidates = checkpoint_candidates(directory) if tf.io.gfile.isdir(directory) else []
    if at_step is not None:
        candidates = [c for c in candidates if checkpoint_number(c) == at_step]
    bad = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            if bad:
                logger.warning("resuming from %s, the newest intact checkpoint", path)
            return path
        logger.warning("checkpoint %s is corrupted or incomplete, skipping it: %s", path, problem)
        bad.append(path)
    if bad and at_step is None:
        raise TrainingError(
            f"no readable checkpoint in {directory}: {', '.join(bad)} are corrupted or incomplete. "
            "Restore them from a backup, or use --overwrite to start afresh")
    return None


class CheckpointToRead(NamedTuple):
    """Which checkpoint a run starts from, or an export / conversion / fine-tuning reads.

    Attributes:
        path: str. The checkpoint prefix.
        imported: bool. True for `init_checkpoint/` (`from-google`: model and step only).
    """

    path: str
    imported: bool


def checkpoint_to_read(model_dir: str, checkpoint: Optional[str] = None) -> Optional[CheckpointToRead]:
    """The checkpoint to read, in this order: `checkpoint` if given (a prefix, or a directory's
    latest), else the run's newest intact checkpoint (`latest_good_checkpoint`), else the imported
    `init_checkpoint/`; None if the run has none.

    Raises:
        TrainingError: `checkpoint` names no checkpoint, or the run's are all unreadable.
    """
    import tensorflow as tf

    if checkpoint:
        if os.path.isdir(checkpoint):
            found = tf.train.latest_checkpoint(checkpoint)
            if found is None:
                raise TrainingError(f"--checkpoint {checkpoint}: directory has no checkpoint")
            return CheckpointToRead(found, imported=False)
        if not tf.io.gfile.exists(checkpoint + ".index"):
            raise TrainingError(f"--checkpoint {checkpoint}: no such checkpoint "
                                f"({checkpoint}.index missing)")
        return CheckpointToRead(checkpoint, imported=False)
    own = latest_good_checkpoint(model_dir)
    if own is not None:
        return CheckpointToRead(own, imported=False)
    init_dir = os.path.join(model_dir, INIT_CHECKPOINT_DIR)
    imported = tf.train.latest_checkpoint(init_dir) if tf.io.gfile.isdir(init_dir) else None
    return CheckpointToRead(imported, imported=True) if imported else None


def checkpoint_step(path: str) -> int:
    """The step stored in an electra-tf checkpoint (optimizer iterations or `step`), else the
    number in its name (`ckpt-1000`), else 0."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    for key in _STEP_KEYS:
        if reader.has_tensor(key):
            return int(reader.get_tensor(key))
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else 0


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


def load_run(model_dir: str, checkpoint: Optional[str] = None) -> LoadedRun:
    """Builds the model described by `model_dir/config.json` and restores its weights.

    Only the `model` part of the checkpoint is read (no optimizer slots, data position or RNG
    states), so this works on the trainer's checkpoints and on imported ones alike.

    Args:
        model_dir: a run directory.
        checkpoint: optional checkpoint prefix (or directory) instead of `checkpoint_to_read`'s.

    Raises:
        TrainingError: files missing, or the checkpoint does not match the config.
    """
    import tensorflow as tf

    from electra_tf.pretraining.pretrainer import ElectraPretrainer

    config_path = os.path.join(model_dir, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise TrainingError(f"{model_dir}: no {CONFIG_NAME} (not an electra-tf run directory)")
    try:
        config = PretrainingConfig.load(config_path)
    except (ConfigError, TypeError) as e:
        raise TrainingError(f"{config_path}: {e}") from None
    vocab_path = os.path.join(model_dir, VOCAB_NAME)
    vocab = load_vocab(vocab_path if os.path.isfile(vocab_path) else config.vocab_file)
    found = checkpoint_to_read(model_dir, checkpoint)
    if found is None:
        raise TrainingError(f"no checkpoint in {model_dir} (nor in {INIT_CHECKPOINT_DIR}/): train "
                            "first, import one with from-google, or pass --checkpoint")
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special)
    model.build_from_sequence_length()
    try:
        tf.train.Checkpoint(model=model).restore(found.path).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise TrainingError(f"checkpoint {found.path} does not match {config_path}: "
                            f"{error_line(e)}") from None
    step = checkpoint_step(found.path)
    logger.info("read %s (step %d) with the model of %s", found.path, step, config_path)
    return LoadedRun(config, vocab, model, found.path, step)
