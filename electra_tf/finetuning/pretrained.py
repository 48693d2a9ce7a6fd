"""Where fine-tuning starts: the pretrained discriminator's sizes, weights, vocab and tokenization.

`init_checkpoint` (official name) may be any of:

- an electra-tf pretraining model directory (`DATA_DIR/models/NAME`, the default): read with
  `electra_tf.training.run_dir.load_run` (its latest checkpoint, or the imported
  `init_checkpoint/` of a `python -m electra_tf.convert from-google` import). The discriminator
  encoder's weights are kept; the generator and both pretraining heads are ignored (official:
  `init_from_checkpoint` on the intersection of variable names);
- a checkpoint prefix inside such a directory (`.../ckpt-2000`, to fine-tune an intermediate
  checkpoint);
- an exported discriminator SavedModel (`.../export/discriminator`, from `run_pretraining.py`:
  its newest version folder, or a version folder `.../export/discriminator/STEP` itself).
  Its `variables/` are a TensorFlow checkpoint whose object graph holds the encoder under
  `encoder`; a fresh `ElectraEncoder` built from the `config.json` the export carries in
  `assets.extra/` is restored from it (`tf.train.Checkpoint(encoder=...)`, every variable must
  match), so fine-tuning updates every encoder weight (not a frozen feature extractor).

On JAX (`--backend jax`, no TensorFlow in the process) a run of `--backend jax|torch`
(`ckpt-N.npz`, or an `init_checkpoint/ckpt-0.npz` import) is read directly
(`npz_checkpoint`); a TensorFlow checkpoint or SavedModel is read by a child Python on the
TensorFlow backend (`tensorflow_child`), which hands the encoder weights back in an .npz, so it
needs TensorFlow installed beside JAX (without it: one line saying so).

With `random_init` (or `debug`) nothing is loaded: the encoder has the sizes of `model_size` /
`model_hparam_overrides` / `embedding_size` (debug: the official debug model) and random weights,
the floor a pretrained model must beat.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import List, NamedTuple, Optional

import keras
import numpy as np

from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.config.model_config import get_bert_config
from electra_tf.errors import ElectraError, TrainingError, error_line
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.model import ENCODER_NAME
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.sentencepiece_vocab import looks_like_sentencepiece
from electra_tf.training import checkpoint_files, npz_checkpoint, run_dir
from electra_tf.vocab import Vocab, load_vocab

logger = logging.getLogger("electra_tf")

SAVED_MODEL_FILE = "saved_model.pb"


class PretrainedError(ElectraError, ValueError):
    """The starting point cannot be read; the message names the path."""


class Pretrained(NamedTuple):
    """What fine-tuning starts from.

    Attributes:
        encoder_config: dict of ElectraEncoder arguments (ModelConfig fields).
        weights: list of numpy arrays in `ElectraEncoder.get_weights()` order, or None (random).
        vocab: Vocab.
        do_lower_case: bool. How the pretraining data was tokenized.
        strip_accents: bool.
        kind: "model_dir", "checkpoint", "saved_model" or "random".
        source: str. Path (or "random"), for logs and results.
        step: int. Pretraining step of the checkpoint (0 when unknown or random).
    """

    encoder_config: dict
    weights: Optional[List[np.ndarray]]
    vocab: Vocab
    do_lower_case: bool
    strip_accents: bool
    kind: str
    source: str
    step: int


def _tokenization(pretraining: Optional[PretrainingConfig], config: FinetuningConfig,
                  manifest_settings=None):
    do_lower_case = (config.do_lower_case if config.do_lower_case is not None
                     else manifest_settings.do_lower_case if manifest_settings is not None
                     else pretraining.do_lower_case if pretraining is not None else True)
    strip_accents = (config.strip_accents if config.strip_accents is not None
                     else manifest_settings.strip_accents if manifest_settings is not None
                     else run_dir.DEFAULT_STRIP_ACCENTS)
    return do_lower_case, strip_accents


def _random(config: FinetuningConfig) -> Pretrained:
    hparams = {"model_size": config.model_size, "vocab_size": config.vocab_size,
               "model_hparam_overrides": dict(config.model_hparam_overrides),
               "debug": config.debug, "embedding_size": config.embedding_size}
    try:
        bert = get_bert_config(PretrainingConfig.create(config.model_name, config.data_dir, hparams))
    except ConfigError as e:
        raise PretrainedError(f"random_init model sizes: {e}") from None
    vocab = load_vocab(config.vocab_file)
    if vocab.size > bert.vocab_size:
        raise PretrainedError(f"{config.vocab_file} has {vocab.size} tokens but vocab_size is "
                              f"{bert.vocab_size}: set the vocab_size hparam")
    do_lower_case, strip_accents = _tokenization(None, config)
    return Pretrained(bert.to_dict(), None, vocab, do_lower_case, strip_accents, "random",
                      "random", 0)


def _exists(path: str) -> bool:
    """os.path.exists, or TensorFlow's file system (gs://, ...) on the TensorFlow backend."""
    if keras.backend.backend() != "tensorflow":
        return os.path.exists(path)
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def _model_dir_and_checkpoint(path: str):
    """(model_dir, checkpoint prefix or None) for a model dir or a checkpoint prefix."""
    if os.path.isdir(path):
        return path, None
    if _exists(path + ".index"):
        model_dir = os.path.dirname(path)
        if os.path.basename(model_dir) == checkpoint_files.INIT_CHECKPOINT_DIR:  # from-google's import
            model_dir = os.path.dirname(model_dir)
        return model_dir, path
    raise PretrainedError(f"init_checkpoint {path}: not a model directory, a checkpoint prefix "
                          "(no .index file) or a SavedModel")


def _from_model_dir(path: str, config: FinetuningConfig) -> Pretrained:
    model_dir, checkpoint = _model_dir_and_checkpoint(path)
    try:
        loaded = run_dir.load_run(model_dir, checkpoint,
                                  another="set init_checkpoint to a checkpoint prefix")
    except TrainingError as e:
        raise PretrainedError(f"init_checkpoint {path}: {e}") from None
    encoder = loaded.model.exported_discriminator()  # GDES: its merged embeddings
    if not isinstance(encoder, ElectraEncoder):
        raise PretrainedError(f"init_checkpoint {path}: the discriminator is a "
                              f"{type(encoder).__name__}, not an ElectraEncoder")
    bert = get_bert_config(loaded.config)
    do_lower_case, strip_accents = _tokenization(loaded.config, config,
                                                 run_dir.tokenization_settings(loaded.config))
    return Pretrained(bert.to_dict(), encoder.get_weights(), loaded.vocab, do_lower_case,
                      strip_accents, "checkpoint" if checkpoint else "model_dir",
                      loaded.checkpoint, loaded.step)


def _from_saved_model(path: str, config: FinetuningConfig) -> Pretrained:
    import tensorflow as tf

    # lazy: TensorFlow is optional here (only a SavedModel starting point needs it)
    from electra_tf.training.tf.export import EXTRA_DIR

    extra = os.path.join(path, EXTRA_DIR)
    config_path = os.path.join(extra, run_dir.CONFIG_NAME)
    vocab_path = run_dir.find_vocab_copy(extra) or os.path.join(extra, run_dir.VOCAB_NAME)
    for needed in (config_path, vocab_path):
        if not os.path.isfile(needed):
            raise PretrainedError(f"init_checkpoint {path}: SavedModel lacks {needed} (export it "
                                  "with run_pretraining.py, which stores config.json and vocab.txt)")
    try:
        with open(config_path, encoding="utf-8") as f:
            pretraining = PretrainingConfig.from_dict(json.load(f))
    except (ConfigError, TypeError, ValueError) as e:
        raise PretrainedError(f"{config_path}: {e}") from None
    bert = get_bert_config(pretraining)
    encoder = ElectraEncoder.from_model_config(bert, name=ENCODER_NAME)
    variables = os.path.join(path, "variables", "variables")
    try:
        # Not `checkpoint_files.run_checkpoint`: these are an exported SavedModel's variables,
        # whose object graph is the export's (export.DiscriminatorModule: the encoder under
        # `encoder`), not a run's (the pretrainer under `model`); a run's checkpoints are read
        # by `run_dir.load_run` (`_from_model_dir`). `read` (not `restore`): no save_counter of
        # our own to match against the export.
        status = tf.train.Checkpoint(encoder=encoder).read(variables)
        status.expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise PretrainedError(f"init_checkpoint {path}: its variables do not match the encoder "
                              f"of its config.json: {error_line(e)}") from None
    do_lower_case, strip_accents = _tokenization(pretraining, config)
    return Pretrained(bert.to_dict(), encoder.get_weights(), load_vocab(vocab_path), do_lower_case,
                      strip_accents, "saved_model", path, 0)


def latest_version_dir(path: str) -> Optional[str]:
    """`hub.latest_version_dir` (a SavedModel at `path`, or its newest numeric version), without
    importing `hub` (TensorFlow) off the TensorFlow backend."""
    if os.path.isfile(os.path.join(path, SAVED_MODEL_FILE)):
        return path
    try:
        versions = sorted(int(name) for name in os.listdir(path) if name.isdigit() and
                          os.path.isfile(os.path.join(path, name, SAVED_MODEL_FILE)))
    except OSError:
        return None
    return os.path.join(path, str(versions[-1])) if versions else None


def _check_sentencepiece_model(vocab_file: str, vocab: Vocab) -> None:
    """A SentencePiece model given as the vocab (`--spm-model`) must be the one the starting
    point was pretrained with: the ids mean nothing to it otherwise."""
    if not vocab_file or not os.path.isfile(vocab_file):
        return
    with open(vocab_file, "rb") as f:
        head = f.read(1)
    if not looks_like_sentencepiece(vocab_file, head):
        return  # a derived vocab.txt: the starting point's own vocab is used, as before
    given = load_vocab(vocab_file)
    if given.sha256 != vocab.sha256:
        raise PretrainedError(
            f"--spm-model {vocab_file} (sha256 {given.sha256[:12]}...) is not the vocabulary the "
            f"starting point was pretrained with ({vocab.path}, sha256 {vocab.sha256[:12]}...)")


def load_pretrained(config: FinetuningConfig) -> Pretrained:
    """Reads the starting point named by `config.init_checkpoint` (see module docstring).

    Raises:
        PretrainedError: missing or unreadable starting point (names the path).
    """
    if config.random_init or config.debug:
        return _random(config)
    path = config.init_checkpoint
    saved_model = latest_version_dir(path)  # the export dir itself or its newest version
    on_tensorflow = keras.backend.backend() == "tensorflow"
    portable = None if on_tensorflow or saved_model else _portable_run_checkpoint(path)
    if portable is not None:
        pretrained = _from_portable_run(path, portable, config)
    elif not on_tensorflow and (saved_model or os.path.exists(path)
                                or os.path.exists(path + ".index")):
        pretrained = tensorflow_child(config)
    elif saved_model is not None:
        pretrained = _from_saved_model(saved_model, config)
    elif os.path.isdir(path) or _exists(path + ".index"):
        pretrained = _from_model_dir(path, config)
    else:
        raise PretrainedError(f"init_checkpoint {path}: does not exist (give a pretraining model "
                              "directory, a checkpoint prefix or an exported SavedModel, or set "
                              "random_init)")
    _check_sentencepiece_model(config.vocab_file, pretrained.vocab)
    logger.info("fine-tuning from %s (%s, step %d): %d layers, hidden %d", pretrained.source,
                pretrained.kind, pretrained.step, pretrained.encoder_config["num_hidden_layers"],
                pretrained.encoder_config["hidden_size"])
    return pretrained


# --- Without TensorFlow (fine-tuning on JAX) -----------------------------------------------------
def _portable_run_checkpoint(path: str) -> Optional[str]:
    """The `ckpt-N.npz` a JAX / PyTorch run (or an import's `init_checkpoint/ckpt-0.npz`) holds
    at `path` (a run directory or an .npz file), or None when it holds TensorFlow's format."""
    if path.endswith(npz_checkpoint.SUFFIX) and os.path.isfile(path):
        return path
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, run_dir.CONFIG_NAME)):
        return None
    try:
        backend = PretrainingConfig.load(os.path.join(path, run_dir.CONFIG_NAME)).backend
    except (ValueError, TypeError) as e:
        raise PretrainedError(f"init_checkpoint {path}: {e}") from None
    found = npz_checkpoint.latest_good(path)
    if found is None and backend == "tensorflow":
        if not checkpoint_files.checkpoint_candidates(path):  # only an import
            found = npz_checkpoint.latest_good(
                os.path.join(path, checkpoint_files.INIT_CHECKPOINT_DIR))
    return found


def _from_portable_run(path: str, checkpoint: str, config: FinetuningConfig) -> Pretrained:
    """The discriminator encoder of a `ckpt-N.npz`, read on this backend (no TensorFlow)."""
    # lazy: the pretraining model and its training code load only for a ckpt-N.npz start
    from electra_tf.training.pretrainer import ElectraPretrainer

    model_dir = os.path.dirname(checkpoint)
    if os.path.basename(model_dir) == checkpoint_files.INIT_CHECKPOINT_DIR:
        model_dir = os.path.dirname(model_dir)
    try:
        pretraining = PretrainingConfig.load(os.path.join(model_dir, run_dir.CONFIG_NAME))
        vocab = load_vocab(run_dir.find_vocab_copy(model_dir) or pretraining.vocab_file)
        model = ElectraPretrainer.from_pretraining_config(pretraining, vocab.special,
                                                          vocab.tokens, vocab.kind)
        model.build_from_sequence_length()
        saved = npz_checkpoint.restore(checkpoint, model, None)
    except (TrainingError, ValueError, TypeError, OSError) as e:
        raise PretrainedError(f"init_checkpoint {path}: {error_line(e)}") from None
    encoder = model.exported_discriminator()
    if not isinstance(encoder, ElectraEncoder):
        raise PretrainedError(f"init_checkpoint {path}: the discriminator is a "
                              f"{type(encoder).__name__}, not an ElectraEncoder")
    do_lower_case, strip_accents = _tokenization(pretraining, config,
                                                 run_dir.tokenization_settings(pretraining))
    return Pretrained(get_bert_config(pretraining).to_dict(), encoder.get_weights(), vocab,
                      do_lower_case, strip_accents, "model_dir", checkpoint, saved.step)


_CHILD = """
import json, sys
import numpy as np
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.pretrained import load_pretrained
config = FinetuningConfig.from_dict(json.loads(sys.argv[1]))
p = load_pretrained(config)
np.savez(sys.argv[2], meta=np.array(json.dumps({
    "encoder_config": p.encoder_config, "do_lower_case": p.do_lower_case,
    "strip_accents": p.strip_accents, "kind": p.kind, "source": p.source, "step": p.step,
    "vocab": p.vocab.path})), **{f"w{i}": w for i, w in enumerate(p.weights)})
"""


def tensorflow_child(config: FinetuningConfig) -> Pretrained:
    """Reads a TensorFlow checkpoint or SavedModel in a child Python on the TensorFlow backend
    (this process runs another) and returns what it read.

    Raises:
        PretrainedError: TensorFlow is not installed, or the child could not read it (its last
            line).
    """
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        raise PretrainedError(
            f"init_checkpoint {config.init_checkpoint} is in TensorFlow's format (a TensorFlow "
            "run, an import without ckpt-0.npz, or a SavedModel), which needs TensorFlow to "
            f"read; install it, or start from a --backend {keras.backend.backend()} run's "
            "ckpt-N.npz")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "pretrained.npz")
        env = dict(os.environ, KERAS_BACKEND="tensorflow")
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(config.to_dict()), out],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            raise PretrainedError(f"reading init_checkpoint {config.init_checkpoint} with "
                                  f"TensorFlow failed: {lines[-1] if lines else proc.returncode}")
        with np.load(out) as data:
            meta = json.loads(str(data["meta"]))
            weights = [data[f"w{i}"] for i in range(len(data.files) - 1)]
    return Pretrained(meta["encoder_config"], weights, load_vocab(meta["vocab"]),
                      meta["do_lower_case"], meta["strip_accents"], meta["kind"], meta["source"],
                      meta["step"])
