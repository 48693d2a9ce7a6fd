"""Google's TF1 ELECTRA checkpoints in and out: `from-google` and `to-google`.

`import_google_checkpoint` (from-google) reads an official checkpoint (names and shapes of spec
section 5.9, e.g. the released electra_small/base/large), infers the model's sizes from the
variable shapes, checks them against what the user stated (`--model-size`, `--hparams`), builds an
`ElectraPretrainer` from the resolved `PretrainingConfig`, assigns every weight (shape and dtype
checked first) and writes a model directory that `run_pretraining.py` continues from:

    OUTPUT_DIR/config.json                  the resolved PretrainingConfig
    OUTPUT_DIR/vocab.txt                    copy of --vocab-file
    OUTPUT_DIR/init_checkpoint/ckpt-0.*     tf.train.Checkpoint(model=..., step=global_step)
    OUTPUT_DIR/init_checkpoint/ckpt-0.npz   the same model and step without TensorFlow
                                            (`npz_checkpoint`: for --backend jax / torch)

The trainer (on every backend) restores the model and step from `init_checkpoint/` when the
directory has no checkpoint of its own, with a fresh optimizer whose step counter starts at the
imported `global_step` (so the learning-rate schedule continues where the official run stopped).

Skipped: `global_step` (read as the step) and the optimizer slots `*/adam_m`, `*/adam_v`. Groups
missing entirely (a discriminator-only checkpoint has no `generator/*` and no
`generator_predictions/*`; some releases lack `discriminator_predictions/*`) are initialised
fresh from the config's seed, and the log says so. A partly present group, a shape that differs
from the configured model, or a variable the model has no place for is an error naming the
variable and both shapes.

`export_google_checkpoint` (to-google) writes our checkpoint under the official names and shapes
(`model.ckpt-STEP` + the `checkpoint` state file + `vocab.txt`), readable by the official code, by
`tf.train.load_checkpoint`, by Hugging Face's `load_tf_weights_in_electra` and by from-google.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from typing import Any, Dict, Mapping, NamedTuple, Optional, Union

import keras
import numpy as np
import tensorflow as tf

from electra_tf import atomic
from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import parse_hparams
from electra_tf.config.model_config import get_bert_config, get_generator_config
from electra_tf.convert import names
from electra_tf.convert.google_sizes import (CheckpointSizes, describe_configured_model,
                                             infer_sizes, resolve_config)
from electra_tf.convert.model_dir import load_model_dir, prepare_output_dir
from electra_tf.convert.names import ConversionError, format_shape
from electra_tf.errors import error_line, shown_path
from electra_tf.training import checkpoint_files, npz_checkpoint, run_dir
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import load_vocab

logger = logging.getLogger("electra_tf")

# Official README (spec 9.3), continuing the released ELECTRA-Small: 10000 more steps after 4e6,
# with the peak rate rescaled so the linear decay gives 2e-4 at the resume step.
CONTINUE_EXTRA_STEPS = 10000
CONTINUE_LEARNING_RATE = 2e-4
# Name of the checkpoint `to-google` writes (the official Estimator's naming, `model.ckpt-STEP`).
GOOGLE_CHECKPOINT_PREFIX = "model.ckpt"
CHECKPOINT_STATE_NAME = "checkpoint"


# --- Reading a TF1 checkpoint ---------------------------------------------------------------------
class TF1Checkpoint(NamedTuple):
    """What a TF1 checkpoint holds, without reading the tensors.

    Attributes:
        path: str, the checkpoint prefix.
        shapes: {official name: shape tuple} of the model weights (slots and global_step removed).
        dtypes: {official name: dtype name} of the same.
        global_step: int, the `global_step` variable (0 if absent).
        num_skipped: int, optimizer slot entries skipped.
    """

    path: str
    shapes: Dict[str, tuple]
    dtypes: Dict[str, str]
    global_step: int
    num_skipped: int


def resolve_checkpoint_prefix(path: str) -> str:
    """Accepts a checkpoint prefix or a directory with a `checkpoint` state file.

    Raises:
        ConversionError: nothing readable there.
    """
    # Accept a file of the checkpoint too (prefix.index, prefix.data-00000-of-00001).
    path = re.sub(r"\.(index|meta|data-\d+-of-\d+)$", "", path)
    if os.path.isdir(path):
        found = tf.train.latest_checkpoint(path)
        if found is None:
            indexes = sorted(f[:-len(".index")] for f in os.listdir(path) if f.endswith(".index"))
            if len(indexes) != 1:
                raise ConversionError(f"--checkpoint {path}: a directory without a single checkpoint "
                                      "(give the prefix, e.g. DIR/electra_small)")
            found = os.path.join(path, indexes[0])
        return found
    if not tf.io.gfile.exists(path + ".index"):
        raise ConversionError(f"--checkpoint {path}: no such checkpoint ({path}.index not found): give "
                              "the checkpoint prefix, e.g. DIR/model.ckpt-1000")
    return path


def read_tf1_checkpoint(path: str) -> TF1Checkpoint:
    """Lists a TF1 checkpoint's weights (names, shapes, dtypes) and reads its global_step."""
    path = resolve_checkpoint_prefix(path)
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as e:
        raise ConversionError(f"--checkpoint {path}: cannot read it ({error_line(e, limit=None)})") from None
    shape_map = reader.get_variable_to_shape_map()
    dtype_map = reader.get_variable_to_dtype_map()
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in shape_map:
        raise ConversionError(
            f"--checkpoint {path} is a TF2 object-based checkpoint (an electra-tf or Keras one?), not "
            "Google's TF1 format; electra-tf model directories are exported with to-hf/to-google")
    shapes, dtypes, skipped = {}, {}, 0
    for name in sorted(shape_map):
        if not names.is_weight_name(name):
            skipped += name != names.GLOBAL_STEP_NAME
            continue
        shapes[name] = tuple(int(d) for d in shape_map[name])
        dtypes[name] = dtype_map[name].name
    step = 0
    if names.GLOBAL_STEP_NAME in shape_map:
        step = int(reader.get_tensor(names.GLOBAL_STEP_NAME))
    return TF1Checkpoint(path, shapes, dtypes, step, skipped)


# --- from-google ----------------------------------------------------------------------------------
class ImportResult(NamedTuple):
    """What `import_google_checkpoint` did.

    Attributes:
        config: the resolved PretrainingConfig (saved as config.json).
        hparams: dict, the hparams that reproduce it (pass them to run_pretraining.py).
        checkpoint: str, the written init checkpoint prefix.
        global_step: int, the imported step.
        loaded_parts: tuple of str, groups read from the checkpoint.
        fresh_parts: tuple of str, groups initialised fresh (absent from the checkpoint).
        model: the ElectraPretrainer that was saved.
    """

    config: PretrainingConfig
    hparams: dict
    checkpoint: str
    global_step: int
    loaded_parts: tuple
    fresh_parts: tuple
    model: object


def import_google_checkpoint(checkpoint: str, vocab_file: str, output_dir: str,
                             hparams: Union[None, str, Mapping[str, Any]] = None,
                             model_size: Optional[str] = None, overwrite: bool = False) -> ImportResult:
    """Imports an official TF1 ELECTRA checkpoint into an electra-tf model directory.

    Args:
        checkpoint: checkpoint prefix (e.g. `electra_small/electra_small`) or its directory.
        vocab_file: the vocab the checkpoint was trained with (copied to the output).
        output_dir: the model directory to write, normally DATA_DIR/models/NAME.
        hparams: optional hparams (JSON string, .json path or mapping) for the continued run;
            sizes the user states here are checked against the checkpoint.
        model_size: optional "small" | "base" | "large", checked against the checkpoint.
        overwrite: replace a previous import (config.json, vocab.txt, init_checkpoint/).

    Returns:
        ImportResult.

    Raises:
        ConversionError: mismatched or missing variables (naming the variable and both shapes),
            vocab/checkpoint disagreement, unsafe output directory.
        ConfigError, VocabError: bad hparams or vocab file.
    """
    source = read_tf1_checkpoint(checkpoint)
    sizes = infer_sizes(source.shapes)
    vocab = _checked_vocab(vocab_file, source, sizes)
    _check_output_dir(output_dir, overwrite)

    user = parse_hparams(hparams)
    if model_size is not None:
        user = dict(user, model_size=model_size)
    config, resolved = resolve_config(sizes, output_dir, hparams, model_size)
    if "model_dir" in resolved and "model_dir" not in user:
        logger.warning("--output-dir %s is not of the form DATA_DIR/models/NAME: run_pretraining.py "
                       "finds it only through the model_dir hparam (printed below)", output_dir)
    keras.utils.set_random_seed(config.seed)  # fresh parts: reproducible from the config's seed
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special)
    model.build_from_sequence_length()
    match, weights = _assign_checkpoint_weights(model, source, context=describe_configured_model(config, user))
    _log_fresh_parts(match.absent, config)
    logger.info("imported %d weights of %s (step %d; skipped %d optimizer slots and global_step)",
                len(weights), source.path, source.global_step, source.num_skipped)

    path = run_dir.write_imported(output_dir, config, vocab_file, model, source.global_step, overwrite)
    _log_next_steps(output_dir, resolved, source.global_step, config)
    return ImportResult(config, resolved, path, source.global_step, match.present, match.absent, model)


def _checked_vocab(vocab_file: str, source, sizes: CheckpointSizes):
    """The vocab of `vocab_file`, which must not have more tokens than the checkpoint's word
    table has rows (fewer is a padded table: a warning)."""
    vocab = load_vocab(vocab_file)
    word = "electra/embeddings/word_embeddings"
    if vocab.size > sizes.vocab_size:
        raise ConversionError(
            f"--vocab-file {vocab_file} has {vocab.size} tokens, but checkpoint variable {word} has shape "
            f"{format_shape(source.shapes[word])}: the vocab does not belong to this checkpoint")
    if vocab.size < sizes.vocab_size:
        logger.warning("%s has %d tokens, fewer than the %d rows of %s (padded vocab?): the extra rows "
                       "are kept but never used", vocab_file, vocab.size, sizes.vocab_size, word)
    return vocab


def _assign_checkpoint_weights(model, source, context: str):
    """Matches the model's official variables against the checkpoint's (shapes and dtypes, by
    part) and assigns those of the parts present.

    Returns:
        (the `names.match_checkpoint` match, {official name: the array assigned}).
    """
    expected = names.official_shapes(model)
    match = names.match_checkpoint(expected, source.shapes, context=context)
    for name in expected:
        if names.part_of(name) in match.present:
            names.check_dtype(name, source.dtypes[name])
    reader = tf.train.load_checkpoint(source.path)
    weights = {n: reader.get_tensor(n) for n in expected if names.part_of(n) in match.present}
    names.assign_official_weights(model, weights, parts=match.present, source=f"checkpoint {source.path}")
    return match, weights


def _check_output_dir(output_dir: str, overwrite: bool) -> None:
    if os.path.isdir(output_dir) and (checkpoint_files.checkpoint_candidates(output_dir)
                                      or npz_checkpoint.checkpoints(output_dir)):
        raise ConversionError(
            f"--output-dir {output_dir} holds a training run's checkpoints; run_pretraining.py would "
            "resume from them and ignore the import: choose a new --output-dir")
    # Checked now, created only once the checkpoint has been matched (no empty dir on errors).
    prepare_output_dir(output_dir, (run_dir.CONFIG_NAME, run_dir.VOCAB_NAME,
                                    checkpoint_files.INIT_CHECKPOINT_DIR), overwrite, create=False)


def _log_fresh_parts(absent, config: PretrainingConfig) -> None:
    if not absent:
        return
    detail = ""
    if names.GENERATOR_SCOPE in absent:
        generator = get_generator_config(config, get_bert_config(config))
        detail = (f" (generator hidden_size {generator.hidden_size} = generator_hidden_size "
                  f"{config.generator_hidden_size} x {get_bert_config(config).hidden_size}, "
                  f"{generator.num_hidden_layers} layers)")
    logger.warning("the checkpoint has no %s variables: %s initialised fresh%s with seed %d",
                   " / ".join(f"{p}/*" for p in absent), "they are" if len(absent) > 1 else "it is",
                   detail, config.seed)


def continue_hparams(hparams: Mapping[str, Any], global_step: int,
                     extra_steps: int = CONTINUE_EXTRA_STEPS,
                     learning_rate: float = CONTINUE_LEARNING_RATE) -> dict:
    """Hparams to continue an imported run, with the official README's learning-rate advice.

    The official schedule decays linearly to 0 at num_train_steps, from the step counter's value.
    To train `extra_steps` more steps after `global_step` at `learning_rate` at the resume point,
    set num_train_steps = global_step + extra_steps and the peak rate to
    learning_rate * (global_step + extra_steps) / extra_steps (README: 4010000 steps,
    2e-4 * (4e6 + 10000) / 10000 for the released Small, which used generator_hidden_size 1.0).
    `num_train_steps` / `learning_rate` already in `hparams` are kept.
    """
    out = dict(hparams)
    total = global_step + extra_steps
    out.setdefault("num_train_steps", total)
    out.setdefault("learning_rate", float(f"{learning_rate * total / extra_steps:.6g}"))
    return out


def _log_next_steps(output_dir: str, hparams: Mapping[str, Any], global_step: int,
                    config: PretrainingConfig) -> None:
    suggestion = continue_hparams(hparams, global_step)
    logger.info(
        "to continue pretraining: python run_pretraining.py --data-dir %s --model-name %s "
        "--hparams '%s'  (the structural hparams must be these; learning_rate = %g * %d / %d follows "
        "the official README advice for %d more steps: see docs/conversion.md; add --backend jax "
        "or torch to train without TensorFlow)",
        config.data_dir, config.model_name, json.dumps(suggestion, sort_keys=True),
        CONTINUE_LEARNING_RATE, global_step + CONTINUE_EXTRA_STEPS, CONTINUE_EXTRA_STEPS,
        CONTINUE_EXTRA_STEPS)


# --- to-google ------------------------------------------------------------------------------------
def write_tf1_checkpoint(prefix: str, weights: Mapping[str, np.ndarray],
                         global_step: Optional[int] = None) -> str:
    """Writes `{name: array}` as a TF1 (V2-format) checkpoint with exactly these variable names.

    `tf.train.list_variables(prefix)` then shows the names as given (no object-graph suffixes), as
    a `tf.compat.v1.train.Saver` would write them. The files are written in a hidden staging
    directory beside them and renamed into place, the index last, so a failure (a full or
    read-only disk) never leaves a partial checkpoint under `prefix`.

    Raises:
        ConversionError: the checkpoint cannot be written (one line naming it and the reason).
    """
    tensors = {name: np.ascontiguousarray(value) for name, value in weights.items()}
    if global_step is not None:
        tensors[names.GLOBAL_STEP_NAME] = np.int64(global_step)
    ordered = sorted(tensors)
    directory = os.path.dirname(os.path.abspath(prefix))
    base = os.path.basename(prefix)
    try:
        os.makedirs(directory, exist_ok=True)
        # Named as atomic_path names its temporaries: removed as a leftover if this is killed.
        staging = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=directory)
        try:
            staged = os.path.join(staging, base)
            tf.raw_ops.SaveV2(prefix=staged, tensor_names=ordered,
                              shape_and_slices=[""] * len(ordered),
                              tensors=[tensors[n] for n in ordered])
            # Data files first: the index names a complete checkpoint.
            for name in sorted(os.listdir(staging), key=lambda n: n.endswith(".index")):
                os.replace(os.path.join(staging, name), os.path.join(directory, name))
            atomic.fsync_path(directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except (OSError, tf.errors.OpError) as e:  # PermissionDeniedError, ResourceExhaustedError
        raise ConversionError(f"cannot write the checkpoint {shown_path(prefix)} "
                              f"({error_line(e)})") from None
    return prefix


def export_google_checkpoint(model_dir: str, output_dir: str, checkpoint: Optional[str] = None,
                             overwrite: bool = False) -> str:
    """Writes a model directory's checkpoint in Google's TF1 layout (all parts of the model).

    Output: OUTPUT_DIR/model.ckpt-STEP.{index,data-00000-of-00001}, the `checkpoint` state file
    (so `tf.train.latest_checkpoint(OUTPUT_DIR)` finds it) and `vocab.txt`. The weights are
    float32 under the official names and shapes; `global_step` is the checkpoint's step.

    Returns:
        The checkpoint prefix written.
    """
    prepare_output_dir(output_dir, (CHECKPOINT_STATE_NAME, run_dir.VOCAB_NAME), overwrite, create=False)
    loaded = load_model_dir(model_dir, checkpoint)
    weights = names.get_official_weights(loaded.model)
    base = f"{GOOGLE_CHECKPOINT_PREFIX}-{loaded.step}"
    prepare_output_dir(output_dir, (CHECKPOINT_STATE_NAME, base + ".index", run_dir.VOCAB_NAME), overwrite)
    prefix = write_tf1_checkpoint(os.path.join(output_dir, base), weights, global_step=loaded.step)
    atomic.write_text(os.path.join(output_dir, CHECKPOINT_STATE_NAME),
                      f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n')
    atomic.copy_file(loaded.vocab.path, os.path.join(output_dir, run_dir.VOCAB_NAME))
    logger.info("wrote %s (%d weights under the official names, global_step %d)", prefix,
                len(weights), loaded.step)
    return prefix
