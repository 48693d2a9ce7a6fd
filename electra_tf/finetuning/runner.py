"""The fine-tuning run: data, trials (train, evaluate, export), results.

`run(config)` is what `run_finetuning.py` calls. For each of `num_trials` trials (seed
`seed + trial - 1`):

1. build the classifier (encoder + one head per task) and copy in the pretrained encoder weights
   (`pretrained.py`; random for `random_init`);
2. train `int(num_train_examples / train_batch_size * num_train_epochs)` steps (official count)
   on the shuffled training examples of all tasks, with the official optimizer: AdamWeightDecay
   (no bias correction, wd 0.01 except LayerNorm/bias), the global-norm clip at 1.0, linear
   warmup over `warmup_proportion` of the steps multiplied by linear decay to 0, and the
   layer-wise learning-rate multipliers (`optimization.py`);
3. evaluate every labelled dev/test split: accuracy, F1, macro F1, MCC (`metrics.py`); write test
   predictions for unlabelled test files when `write_test_outputs`;
4. export a SavedModel serving raw text (`export.py`) to `model_dir/<tasks>_model_<trial>`
   (every trial with `keep_all_models`, else the last).

Then the mean and sample std over trials of every metric go to `results_json` and `results_txt`.
Existing outputs are never replaced without `overwrite`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Dict, List, NamedTuple, Optional

import keras
import numpy as np
import tensorflow as tf

from electra_tf import atomic
from electra_tf.data.tokenization import Tokenizer
from electra_tf.errors import ElectraError
from electra_tf.finetuning import metrics as metrics_lib
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.encoding import FEATURE_NAMES, TextEncoder
from electra_tf.finetuning.export import FinetunedModule, export_finetuned
from electra_tf.finetuning.model import ElectraClassifier, summed_loss
from electra_tf.finetuning.optimization import check_covered, layerwise_lr_multipliers
from electra_tf.finetuning.pretrained import Pretrained, load_pretrained
from electra_tf.finetuning.tasks import Example, Task, TaskData, load_task
from electra_tf.progress import eta_seconds, format_duration
from electra_tf.training.optimization import WarmupPolynomialDecay, apply_gradients
from electra_tf.training.optimizers import AdamWeightDecay
from electra_tf.training.strategy import set_inter_op_threads

logger = logging.getLogger("electra_tf")

EVAL_SPLITS = ("dev", "test")
TEST_PREDICTIONS_DIR = "test_predictions"


class FinetuningError(ElectraError, RuntimeError):
    """The run cannot proceed (outputs exist without overwrite, no training data, ...)."""


class EncodedSplit(NamedTuple):
    """Features of one split of one task.

    Attributes:
        features: dict of int32 numpy [n, max_seq_length] (`input_ids`, `input_mask`,
            `segment_ids`).
        label_ids: int32 numpy [n], or None when the split has no labels.
        examples: the examples, in the same order.
    """

    features: Dict[str, np.ndarray]
    label_ids: Optional[np.ndarray]
    examples: List[Example]


def encode_split(text_encoder: TextEncoder, task: Task, examples: List[Example],
                 labelled: bool) -> EncodedSplit:
    """Tokenizes and packs examples; label ids checked against the task's labels."""
    texts_b = [e.text_b for e in examples] if task.is_pair else None
    features = text_encoder.encode_examples([e.text_a for e in examples], texts_b)
    label_ids = (np.array([task.label_id(e) for e in examples], np.int32) if labelled else None)
    return EncodedSplit(features, label_ids, examples)


def training_features(tasks_data: List[TaskData], encoded: Dict[str, EncodedSplit]) -> Dict[str, np.ndarray]:
    """All tasks' training features in one table, with `label_ids` and `task_ids` columns."""
    parts = []
    for task_id, data in enumerate(tasks_data):
        split = encoded[data.task.name]
        part = dict(split.features)
        part["label_ids"] = split.label_ids
        part["task_ids"] = np.full([len(split.label_ids)], task_id, np.int32)
        parts.append(part)
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def num_train_steps(num_examples: int, config: FinetuningConfig) -> int:
    """Official: int(num_train_examples / train_batch_size * num_train_epochs), at least 1."""
    return max(1, int(num_examples / config.train_batch_size * config.num_train_epochs))


def build_model(pretrained: Pretrained, tasks: List[Task], seed: int) -> ElectraClassifier:
    """A classifier with the pretrained encoder weights (random ones for random init)."""
    keras.utils.set_random_seed(seed)  # head init, dropout seeds (and the encoder if random)
    model = ElectraClassifier(pretrained.encoder_config,
                              [{"name": t.name, "num_labels": t.num_labels} for t in tasks])
    if pretrained.weights is not None:
        model.encoder.set_weights(pretrained.weights)
    return model


def make_optimizer(model: ElectraClassifier, config: FinetuningConfig, steps: int) -> AdamWeightDecay:
    """The official fine-tuning optimizer with the layer-wise multipliers (built)."""
    schedule = WarmupPolynomialDecay(config.learning_rate, steps,
                                     warmup_proportion=config.warmup_proportion, lr_decay_power=1.0)
    multipliers = layerwise_lr_multipliers(model.encoder.num_hidden_layers,
                                           config.layerwise_lr_decay, config.layerwise_lr_decay_fix)
    check_covered(model.trainable_variables, multipliers)
    optimizer = AdamWeightDecay(schedule, weight_decay_rate=config.weight_decay_rate,
                                lr_multipliers=multipliers or None, name="adamw")
    optimizer.build(model.trainable_variables)
    return optimizer


def train(model: ElectraClassifier, features: Dict[str, np.ndarray], config: FinetuningConfig,
          seed: int, task_names: List[str]) -> Dict[str, float]:
    """Trains `num_train_steps` steps; returns {"steps", "seconds", "final_loss"}."""
    n = len(features["label_ids"])
    steps = num_train_steps(n, config)
    optimizer = make_optimizer(model, config, steps)
    variables = model.trainable_variables
    dataset = (tf.data.Dataset.from_tensor_slices(features)
               .shuffle(n, seed=seed, reshuffle_each_iteration=True)
               .repeat()
               .batch(config.train_batch_size, drop_remainder=True))
    iterator = iter(dataset)

    @tf.function
    def train_loop(iterator, num_steps):
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            batch = next(iterator)
            with tf.GradientTape() as tape:
                logits = model(batch, training=True)
                loss = summed_loss(logits, batch["label_ids"], batch["task_ids"], task_names)
            grads = tape.gradient(loss, variables)
            apply_gradients(optimizer, grads, variables)
            total += loss
        return total / tf.cast(num_steps, tf.float32)

    start = time.time()
    done, loss = 0, float("nan")
    chunk = min(config.iterations_per_loop, config.log_steps)
    while done < steps:
        k = min(chunk, steps - done)
        loss = float(train_loop(iterator, tf.constant(k)))
        done += k
        if not np.isfinite(loss):
            raise FinetuningError(f"non-finite training loss at step {done}")
        if done % config.log_steps < k or done == steps:
            logger.info("  step %d/%d loss %.4f (summed over the batch) %.1f ex/s, ETA %s", done,
                        steps, loss, done * config.train_batch_size / max(time.time() - start, 1e-9),
                        format_duration(eta_seconds(done, steps, time.time() - start)))
    return {"steps": steps, "seconds": time.time() - start, "final_loss": loss}


def predict_logits(model: ElectraClassifier, features: Dict[str, np.ndarray], task: str,
                   batch_size: int) -> np.ndarray:
    """float32 numpy [n, num_labels] logits, eval mode."""
    @tf.function
    def forward(batch):
        return model(batch, training=False)[task]

    n = len(features["input_ids"])
    outputs = []
    for start in range(0, n, batch_size):
        batch = {k: tf.constant(features[k][start:start + batch_size]) for k in FEATURE_NAMES}
        outputs.append(forward(batch).numpy())
    return np.concatenate(outputs) if outputs else np.zeros([0, 0], np.float32)


def _check_outputs(config: FinetuningConfig, overwrite: bool) -> None:
    outputs = [config.results_txt, config.results_json]
    if config.do_train and config.do_export:
        outputs += [config.trial_model_dir(t) for t in range(1, config.num_trials + 1)]
    existing = [p for p in outputs if os.path.exists(p)]
    if existing and not overwrite:
        raise FinetuningError(f"{existing[0]} already exists; pass --overwrite to replace the "
                              "results and fine-tuned models of this run")


def _log_examples(task: Task, split: EncodedSplit, vocab, count: int = 3) -> None:
    for i in range(min(count, len(split.examples))):
        ids = split.features["input_ids"][i]
        n = int(split.features["input_mask"][i].sum())
        tokens = " ".join(vocab.tokens[t] for t in ids[:n])
        logger.info("%s example %s: label %s | %s | segment_ids %s", task.name, split.examples[i].guid,
                    split.examples[i].label, tokens, split.features["segment_ids"][i][:n].tolist())


def _write_predictions(path: str, task: Task, split: EncodedSplit, logits: np.ndarray) -> None:
    with atomic.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        for i, label_id in enumerate(np.argmax(logits, axis=-1)):
            f.write(f"{i}\t{task.labels[int(label_id)]}\n")


def summarize(trials: List[dict]) -> Dict[str, Dict[str, Dict[str, Dict[str, float]]]]:
    """{task: {split: {metric: {"mean", "std"}}}} over the trials that have it."""
    summary: dict = {}
    for task, splits in trials[0]["metrics"].items():
        for split, values in splits.items():
            for metric in values:
                if metric == "n":
                    continue
                series = [t["metrics"][task][split][metric] for t in trials]
                summary.setdefault(task, {}).setdefault(split, {})[metric] = metrics_lib.mean_and_std(series)
    return summary


def format_results(summary: dict, num_trials: int) -> List[str]:
    """Human-readable lines: `task split metric: mean ± std (n trials)`, in percent."""
    lines = []
    for task, splits in summary.items():
        for split, values in splits.items():
            for metric, stat in values.items():
                lines.append(f"{task} {split} {metric}: {100 * stat['mean']:.2f} ± "
                             f"{100 * stat['std']:.2f} ({num_trials} trial{'s' if num_trials > 1 else ''})")
    return lines


def run(config: FinetuningConfig, overwrite: bool = False) -> dict:
    """Fine-tunes and evaluates as the config says (see module docstring).

    Returns:
        The results dict written to `results_json`: "config", "init", "data", "trials" (per-trial
        metrics, steps, seconds, export path), "summary" ({task: {split: {metric: {mean, std}}}}).

    Raises:
        FinetuningError, DataFileError, PretrainedError, ConfigError: bad input (one line).
    """
    set_inter_op_threads()  # one device: one op at a time on a CPU-only machine (see strategy.py)
    _check_outputs(config, overwrite)
    pretrained = load_pretrained(config)
    tokenizer = Tokenizer(pretrained.vocab, do_lower_case=pretrained.do_lower_case,
                          strip_accents=pretrained.strip_accents)
    text_encoder = TextEncoder(tokenizer, config.max_seq_length)
    splits = ("train",) + EVAL_SPLITS
    tasks_data = [load_task(name, config.raw_data_dir, splits, config.double_unordered)
                  for name in config.task_names]
    tasks = [d.task for d in tasks_data]
    task_names = [t.name for t in tasks]

    train_encoded: Dict[str, EncodedSplit] = {}
    eval_encoded: Dict[str, Dict[str, EncodedSplit]] = {}
    data_summary = {}
    for data in tasks_data:
        task = data.task
        train_encoded[task.name] = encode_split(text_encoder, task, data.train, True)
        if config.log_examples:
            _log_examples(task, train_encoded[task.name], pretrained.vocab)
        eval_encoded[task.name] = {}
        for split in EVAL_SPLITS:
            examples = getattr(data, split)
            if examples:
                eval_encoded[task.name][split] = encode_split(text_encoder, task, examples,
                                                              data.labelled[split])
        data_summary[task.name] = {
            "directory": task.directory, "labels": list(task.labels), "is_pair": task.is_pair,
            **{split: len(getattr(data, split) or []) for split in splits}}
        logger.info("task %s: %d labels, train/dev/test %s", task.name, task.num_labels,
                    "/".join(str(data_summary[task.name][s]) for s in splits))
    features = training_features(tasks_data, train_encoded)

    keras.mixed_precision.set_global_policy(config.mixed_precision)
    trials = []
    try:
        for trial in range(1, config.num_trials + 1):
            seed = config.seed + trial - 1
            logger.info("trial %d/%d (seed %d)", trial, config.num_trials, seed)
            model = build_model(pretrained, tasks, seed)
            record = {"trial": trial, "seed": seed, "metrics": {}}
            if config.do_train:
                record.update(train(model, features, config, seed, task_names))
            if config.do_eval:
                for task in tasks:
                    for split, encoded in eval_encoded[task.name].items():
                        logits = predict_logits(model, encoded.features, task.name,
                                                config.eval_batch_size)
                        if encoded.label_ids is not None:
                            values = metrics_lib.classification_metrics(
                                encoded.label_ids, np.argmax(logits, axis=-1), task.num_labels)
                            record["metrics"].setdefault(task.name, {})[split] = values
                            logger.info("  %s %s: %s", task.name, split, ", ".join(
                                f"{k} {v:.4f}" for k, v in values.items() if k != "n"))
                        elif config.write_test_outputs and trial <= config.n_writes_test:
                            path = os.path.join(os.path.dirname(config.results_json),
                                                TEST_PREDICTIONS_DIR,
                                                f"{task.name}_{split}_{trial}_predictions.tsv")
                            _write_predictions(path, task, encoded, logits)
                            record.setdefault("predictions", {})[f"{task.name}_{split}"] = path
            if config.do_train and config.do_export and (config.keep_all_models
                                                         or trial == config.num_trials):
                module = FinetunedModule(model, text_encoder, tasks)
                record["export"] = export_finetuned(module, config.trial_model_dir(trial),
                                                    config.to_json(), pretrained.vocab.path)
                logger.info("  exported %s", record["export"])
            trials.append(record)
    finally:
        keras.mixed_precision.set_global_policy("float32")

    results = {
        "config": config.to_dict(),
        "init": {"kind": pretrained.kind, "source": pretrained.source, "step": pretrained.step,
                 "encoder_config": pretrained.encoder_config,
                 "do_lower_case": pretrained.do_lower_case, "strip_accents": pretrained.strip_accents},
        "data": data_summary,
        "trials": trials,
        "summary": summarize(trials) if trials and trials[0]["metrics"] else {},
    }
    atomic.write_json(config.results_json, results, sort_keys=True, default=str)
    lines = format_results(results["summary"], config.num_trials)
    atomic.write_text(config.results_txt, "\n".join(lines) + ("\n" if lines else ""))
    for line in lines:
        logger.info("%s", line)
    return results
