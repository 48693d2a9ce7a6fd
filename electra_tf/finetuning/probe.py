"""The learning probe of a pretraining run: is the discriminator learning features that matter?

With the `probe` hparam (`electra_tf.config.probe_settings`), the run fits a linear classifier on
frozen discriminator features of a small labelled task every `every_n_steps` steps and logs its dev
accuracy beside the losses (`probe/dev_accuracy`, `probe/train_accuracy`, `probe/seconds`
TensorBoard scalars and a console line). A healthy run's dev accuracy rises above its step-0
value and the majority-class baseline; a collapsed discriminator's falls back towards it.

- Data: the task directory is read once, when the run starts, by the fine-tuning readers
  (`finetuning.classification.data.load_task`: GLUE or generic TSV/CSV, every error naming the file), and
  encoded once with the run's vocab and the tokenization the pretraining data used
  (`finetuning.encoding.TextEncoder`, truncated to `max_seq_length`). A fixed subsample (seed
  `SUBSAMPLE_SEED`, not the run's: every run of a task probes the same examples) of at most
  `max_train_examples` / `max_dev_examples` is kept as token ids.
- Features: the discriminator encoder on the current weights in inference mode (no dropout, no
  random draw: the training loop's random streams and data are untouched, so a run with the
  probe trains exactly as one without), its last layer mean-pooled over real tokens or at
  [CLS], through `keras.Model.predict` (compiled by Keras on every backend).
- Classifier: `linear_probe.probe_accuracy`, fit from scratch each time (deterministic).
- When: at the start of a fresh run (step 0: the untrained baseline), after the training loop
  that reaches or passes each multiple of `every_n_steps` (logged at that loop's last step), and
  at the last step of training. Not when a stop (SIGTERM) is under way. The chief (host 0) alone
  runs it.
- Wiring: the pretraining command passes `for_run` to the run, which calls it after its input
  checks and sees the probe only as a `training.observers.RunObserver` (`observe`, `results`):
  training/ imports nothing of fine-tuning.

Cost: bounded by construction, (max_train_examples + max_dev_examples) forward passes and one
fit per probe, against every_n_steps x train_batch_size training examples (forward, backward and
the generator); docs/operations.md, "Reading a run", states the measured overhead.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

import keras
import numpy as np
from keras import ops

from electra_tf.config import PretrainingConfig, probe_settings
from electra_tf.errors import TrainingError, shown_path
from electra_tf.finetuning import linear_probe
from electra_tf.pretraining.encoder_interface import sequence_output
from electra_tf.training import observers, run_dir
from electra_tf.vocab import Vocab

logger = logging.getLogger("electra_tf")

# The probe's subsample is the same for every run of a task, whatever the run's seed.
SUBSAMPLE_SEED = 0
# Examples per forward pass (sets are padded to a multiple, so every batch has one shape).
BATCH_SIZE = observers.BATCH_SIZE
INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")
SCALAR_PREFIX = "probe/"


class ProbeSet(NamedTuple):
    """Encoded examples of one split.

    Attributes:
        features: {input_ids, input_mask, segment_ids}: int32 [n, max_seq_length].
        labels: int32 [n]. Label ids.
    """

    features: Dict[str, np.ndarray]
    labels: np.ndarray


class ProbeData(NamedTuple):
    """The probe's task, encoded once at the start of the run.

    Attributes:
        task: str. The task's name.
        label_names: tuple of str, in id order.
        train, dev: ProbeSet.
    """

    task: str
    label_names: Tuple[str, ...]
    train: ProbeSet
    dev: ProbeSet


def _subsample(examples: list, limit: int) -> list:
    """At most `limit` of `examples`: a fixed random subset, in file order."""
    if len(examples) <= limit:
        return list(examples)
    keep = np.random.default_rng(SUBSAMPLE_SEED).permutation(len(examples))[:limit]
    return [examples[i] for i in sorted(keep)]


def read_task(settings: probe_settings.ProbeSettings):
    """Reads the task directory with the fine-tuning readers; returns (Task, train, dev) with
    train and dev subsampled.

    Raises:
        DataFileError: no such directory, not a classification task, no labelled dev file,
            fewer than 2 labels (each naming the directory or file).
    """
    # lazy: the registry imports every task family, TensorFlow with some, and a JAX run
    # without a probe imports this module.
    from electra_tf.finetuning.classification.data import load_task
    from electra_tf.finetuning.registry import task_family
    from electra_tf.finetuning.task import CLASSIFICATION
    from electra_tf.finetuning.task_files import DataFileError

    directory = os.path.normpath(settings.task_dir)
    raw_data_dir, name = os.path.split(directory)
    if not os.path.isdir(directory):
        raise DataFileError(f"probe.task_dir {shown_path(directory)}: no such directory")
    if task_family(name) != CLASSIFICATION:
        raise DataFileError(f"probe.task_dir {shown_path(directory)}: task {name!r} is a "
                            f"{task_family(name)} task; the probe needs a classification task")
    try:
        data = load_task(name, raw_data_dir or ".", ("train", "dev"), double_unordered=False)
    except DataFileError as e:
        raise DataFileError(f"probe.task_dir: {e}") from None
    if not data.dev or not data.labelled.get("dev"):
        raise DataFileError(f"probe.task_dir {shown_path(data.task.directory)}: no labelled "
                            "dev file (dev.tsv or dev.csv with a label column) to score on")
    train = _subsample(data.train, settings.max_train_examples)
    if len({e.label for e in train}) < 2:
        raise DataFileError(f"probe.task_dir: the {len(train)} training examples kept "
                            f"(probe.max_train_examples) have fewer than 2 labels; raise "
                            "probe.max_train_examples")
    return data.task, train, _subsample(data.dev, settings.max_dev_examples)


def encode_task(settings: probe_settings.ProbeSettings, config: PretrainingConfig,
                vocab: Vocab) -> ProbeData:
    """Reads and encodes the probe's task as the run's pretraining data was tokenised."""
    # lazy: both import TensorFlow and tensorflow-text (checked in `for_run`).
    from electra_tf.data.text.tokenization import Tokenizer
    from electra_tf.finetuning.encoding import TextEncoder

    task, train, dev = read_task(settings)
    tokenization = run_dir.tokenization_settings(config)
    encoder = TextEncoder(Tokenizer(vocab, do_lower_case=tokenization.do_lower_case,
                                    strip_accents=tokenization.strip_accents),
                          config.max_seq_length)

    def encoded(examples) -> ProbeSet:
        texts_b = [e.text_b for e in examples] if task.is_pair else None
        features = encoder.encode_examples([e.text_a for e in examples], texts_b)
        return ProbeSet(features, np.array([task.label_id(e) for e in examples], np.int32))

    return ProbeData(task.name, tuple(task.labels), encoded(train), encoded(dev))


def pooled_features(sequence_output, input_mask, pooling: str):
    """One vector per example from the last layer's hidden states (keras.ops).

    Args:
        sequence_output: float [batch, seq_length, hidden].
        input_mask: int [batch, seq_length]. 1 for real tokens.
        pooling: "mean" (over real tokens) or "cls" (position 0).

    Returns:
        float32 [batch, hidden].
    """
    sequence_output = ops.cast(sequence_output, "float32")
    if pooling == "cls":
        return sequence_output[:, 0]
    mask = ops.expand_dims(ops.cast(input_mask, "float32"), -1)
    count = ops.maximum(ops.sum(mask, axis=1), 1.0)  # padded rows: zeros, not NaN
    return ops.sum(sequence_output * mask, axis=1) / count


class ProbeFeatures(keras.Model):
    """Pooled features of `encoder` (sharing its variables), in inference mode.

    Args:
        encoder: the discriminator encoder (any encoder `encoder_interface.sequence_output` runs).
        pooling: "mean" or "cls" (`pooled_features`).

    Call: {input_ids, input_mask, segment_ids} int [batch, seq_length] -> float32
    [batch, hidden].
    """

    def __init__(self, encoder, pooling: str, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.pooling = pooling

    def call(self, inputs):
        hidden = sequence_output(self.encoder, inputs["input_ids"], inputs["input_mask"],
                                 inputs["segment_ids"], training=False)
        return pooled_features(hidden, inputs["input_mask"], self.pooling)

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling,
                "encoder": keras.saving.serialize_keras_object(self.encoder)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        encoder = keras.saving.deserialize_keras_object(config.pop("encoder"))
        return cls(encoder, **config)


def features(model, probe_set: ProbeSet, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """float32 [n, hidden]: `model`'s pooled features of every example (inference mode)."""
    n = len(probe_set.labels)
    padded = -(-n // batch_size) * batch_size
    inputs = {k: np.pad(probe_set.features[k], [(0, padded - n), (0, 0)]) for k in INPUT_NAMES}
    return np.asarray(model.predict(inputs, batch_size=batch_size, verbose=0))[:n]


class Probe:
    """The learning probe of one run (see the module docstring).

    Args:
        settings: probe_settings.ProbeSettings.
        data: ProbeData, encoded.
        batch_size: int. Examples per forward pass (a multiple of the devices under Keras'
            data parallelism).
    """

    def __init__(self, settings: probe_settings.ProbeSettings, data: ProbeData,
                 batch_size: int = BATCH_SIZE):
        self.settings = settings
        self.data = data
        self.batch_size = batch_size
        self.history: Dict[int, Dict[str, float]] = {}  # step -> scalars
        self._model = None
        self._encoder = None

    @classmethod
    def for_run(cls, config: PretrainingConfig, vocab: Vocab, batch_size: int = BATCH_SIZE,
                several_hosts: bool = False) -> Optional["Probe"]:
        """The run's probe (its task read and encoded now), or None without `probe` or
        `do_train`.

        Args:
            config: the run's config. vocab: the run's vocab.
            batch_size: int. Examples per forward pass.
            several_hosts: bool. A JAX run over several hosts (refused: the probe's forward
                passes would be collectives every host must join).

        Raises:
            DataFileError: the task directory is unusable (one line naming the file).
            TrainingError: several hosts, or no tensorflow-text to tokenise the task.
        """
        if config.probe is None or not config.do_train:
            return None
        if several_hosts:
            raise TrainingError("hparam probe runs on one host with --backend jax (--backend "
                                "tensorflow runs it on the chief of several workers): drop it")
        if importlib.util.find_spec("tensorflow_text") is None:
            raise TrainingError("hparam probe tokenises its task with the fine-tuning encoder, "
                                "which needs tensorflow and tensorflow-text: install them or "
                                "drop the probe")
        settings = probe_settings.parse(config.probe)
        data = encode_task(settings, config, vocab)
        logger.info("probe: task %s (%d labels), %d train / %d dev examples, every %d steps",
                    data.task, len(data.label_names), len(data.train.labels),
                    len(data.dev.labels), settings.every_n_steps)
        return cls(settings, data, batch_size)

    def due(self, previous_step: int, step: int, end_step: int) -> bool:
        """Whether to probe at `step`, the training having been at `previous_step` before."""
        every = self.settings.every_n_steps
        return step not in self.history and (
            step == 0 or step >= end_step or step // every > previous_step // every)

    def observe(self, previous_step: int, step: int, end_step: int,
                encoder) -> Dict[str, float]:
        """The probe's scalars at `step` if it is due (`due`), else {} (the run's observer
        call: `training.observers.RunObserver`)."""
        return self.run(step, encoder) if self.due(previous_step, step, end_step) else {}

    def run(self, step: int, encoder) -> Dict[str, float]:
        """Features of both sets on the current weights, a fresh fit, a log line.

        Returns:
            {"probe/dev_accuracy", "probe/train_accuracy", "probe/seconds"}.
        """
        start = time.time()
        if self._encoder is not encoder:
            self._model = ProbeFeatures(encoder, self.settings.pooling, name="probe_features")
            self._encoder = encoder
        data = self.data
        result = linear_probe.probe_accuracy(
            features(self._model, data.train, self.batch_size), data.train.labels,
            features(self._model, data.dev, self.batch_size), data.dev.labels,
            len(data.label_names), self.settings.l2)
        seconds = time.time() - start
        scalars = {SCALAR_PREFIX + "dev_accuracy": result.dev_accuracy,
                   SCALAR_PREFIX + "train_accuracy": result.train_accuracy,
                   SCALAR_PREFIX + "seconds": seconds}
        self.history[step] = scalars
        logger.info("probe at step %d: %s dev accuracy %.4f (train %.4f, majority class %.4f; "
                    "%d train / %d dev examples, %.1f s)", step, data.task, result.dev_accuracy,
                    result.train_accuracy, result.majority_accuracy, len(data.train.labels),
                    len(data.dev.labels), seconds)
        return scalars

    def results(self) -> List[dict]:
        """Every probe of this process, [{"step", "dev_accuracy", "train_accuracy", "seconds"}]."""
        return [{"step": step, **{k[len(SCALAR_PREFIX):]: v for k, v in scalars.items()}}
                for step, scalars in sorted(self.history.items())]


def for_run(config: PretrainingConfig, vocab: Vocab, batch_size: int = BATCH_SIZE,
            several_hosts: bool = False) -> Optional[Probe]:
    """The run's probe, or None (`Probe.for_run`): the `training.observers.ObserverFactory` the
    pretraining command hands the run."""
    return Probe.for_run(config, vocab, batch_size, several_hosts)
