"""Reading an electra-tf model directory (`DATA_DIR/models/NAME`) for export, and output-dir safety.

A model directory holds `config.json` (the resolved `PretrainingConfig`), `vocab.txt`, and
checkpoints: the trainer's (`tf.train.Checkpoint(model=..., optimizer=..., ...)` managed by a
`CheckpointManager` in the directory itself) and/or the one `from-google` writes in
`init_checkpoint/` (`tf.train.Checkpoint(model=..., step=...)`). Only the `model` part is read, so
exports never need the optimizer or data state.
"""

from __future__ import annotations

import logging
import os
import re
from typing import NamedTuple, Optional, Sequence

import tensorflow as tf

from electra_tf.config import ConfigError, PretrainingConfig
from electra_tf.convert.names import ConversionError
from electra_tf.vocab import Vocab, load_vocab

logger = logging.getLogger("electra_tf")

CONFIG_NAME = "config.json"  # the trainer's names (electra_tf.training.trainer)
VOCAB_NAME = "vocab.txt"
# Where `from-google` puts the imported weights; the trainer restores model and step from here
# when the model directory has no checkpoint of its own.
INIT_CHECKPOINT_DIR = "init_checkpoint"
INIT_CHECKPOINT_PREFIX = "ckpt"
# Checkpoint keys of the step counter: the trainer's optimizer, or from-google's `step`.
_STEP_KEYS = ("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
              "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE",
              "step/.ATTRIBUTES/VARIABLE_VALUE")


class LoadedModel(NamedTuple):
    """A restored model directory.

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


def find_checkpoint(model_dir: str, checkpoint: Optional[str] = None) -> str:
    """The checkpoint to export: `checkpoint` if given, else the newest training checkpoint in
    `model_dir`, else the imported `init_checkpoint/`.

    Raises:
        ConversionError: none found (the message says where it looked).
    """
    if checkpoint:
        if os.path.isdir(checkpoint):
            found = tf.train.latest_checkpoint(checkpoint)
            if found is None:
                raise ConversionError(f"--checkpoint {checkpoint}: directory has no checkpoint")
            return found
        if not tf.io.gfile.exists(checkpoint + ".index"):
            raise ConversionError(f"--checkpoint {checkpoint}: no such checkpoint ({checkpoint}.index missing)")
        return checkpoint
    for directory in (model_dir, os.path.join(model_dir, INIT_CHECKPOINT_DIR)):
        found = tf.train.latest_checkpoint(directory) if os.path.isdir(directory) else None
        if found:
            return found
    raise ConversionError(f"no checkpoint in {model_dir} (nor in {INIT_CHECKPOINT_DIR}/): train "
                          "first, import one with from-google, or pass --checkpoint")


def checkpoint_step(path: str) -> int:
    """The step stored in an electra-tf checkpoint (optimizer iterations or `step`), else the
    number in its name (`ckpt-1000`), else 0."""
    reader = tf.train.load_checkpoint(path)
    for key in _STEP_KEYS:
        if reader.has_tensor(key):
            return int(reader.get_tensor(key))
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else 0


def load_model_dir(model_dir: str, checkpoint: Optional[str] = None) -> LoadedModel:
    """Builds the model described by `model_dir/config.json` and restores its weights.

    Args:
        model_dir: an electra-tf model directory.
        checkpoint: optional checkpoint prefix (or directory) instead of the latest one.

    Raises:
        ConversionError: files missing, or the checkpoint does not match the config.
    """
    from electra_tf.pretraining.pretrainer import ElectraPretrainer

    config_path = os.path.join(model_dir, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise ConversionError(f"--model-dir {model_dir}: no {CONFIG_NAME} (not an electra-tf model directory)")
    try:
        config = PretrainingConfig.load(config_path)
    except (ConfigError, TypeError) as e:
        raise ConversionError(f"{config_path}: {e}") from None
    vocab_path = os.path.join(model_dir, VOCAB_NAME)
    vocab = load_vocab(vocab_path if os.path.isfile(vocab_path) else config.vocab_file)
    path = find_checkpoint(model_dir, checkpoint)
    model = ElectraPretrainer.from_pretraining_config(config, vocab.special)
    model.build_from_sequence_length()
    try:
        # Only the model: optimizer slots, data position and RNG states are not needed.
        tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError(f"checkpoint {path} does not match {config_path}: {first[:300]}") from None
    step = checkpoint_step(path)
    logger.info("read %s (step %d) with the model of %s", path, step, config_path)
    return LoadedModel(config, vocab, model, path, step)


def prepare_output_dir(output_dir: str, outputs: Sequence[str], overwrite: bool, create: bool = True) -> None:
    """Creates `output_dir` (if `create`); refuses to replace any of `outputs` in it without `overwrite`.

    Only the named outputs are ever replaced (by the writer, later); nothing else in the directory
    is touched.

    Raises:
        ConversionError: an output already exists and `overwrite` is False.
    """
    existing = [name for name in outputs if os.path.exists(os.path.join(output_dir, name))]
    if existing and not overwrite:
        raise ConversionError(f"--output-dir {output_dir} already holds {', '.join(existing)}; "
                              "pass --overwrite to replace them")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConversionError(f"--output-dir {output_dir} is a file, not a directory")
    if create:
        os.makedirs(output_dir, exist_ok=True)
