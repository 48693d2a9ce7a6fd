"""The fine-tuning run: data, trials (train, evaluate, export), results.

`run(config)` is what `run_finetuning.py` calls:

1. read and featurise every task of `task_names` (`registry.build_task`: classification,
   regression, question answering or tagging), and put all training records in one table
   (`training_table`, official layout: shared features, `task_id`, every task's own features as
   `<task>_<key>`, zeros where a record's task has none; padding records with task_id = number
   of tasks up to a multiple of `train_batch_size`);
2. for each of `num_trials` trials (seed `seed + trial - 1`):
   a. build the model (encoder + one head per task) and copy in the pretrained encoder weights
      (`pretrained.py`; random for `random_init`);
   b. train `int(n_records_padded // train_batch_size * num_train_epochs)` steps (official
      count) on the shuffled table, with the official optimizer: AdamWeightDecay (no bias
      correction, wd 0.01 except LayerNorm/bias), the global-norm clip at 1.0, linear warmup
      over `warmup_proportion` of the steps multiplied by linear decay to 0, and the layer-wise
      learning-rate multipliers (`optimization.py`);
   c. evaluate every labelled dev/test split with the task's official metrics, writing its
      prediction files (QA: `results/<tasks>_qa/<task>_preds.json`, ...), and predict the
      unlabelled ones (written with `write_test_outputs`, first `n_writes_test` trials);
   d. export a SavedModel serving raw text (`export.py`) to `model_dir/<tasks>_model_<trial>`
      (every trial with `keep_all_models`, else the last);
   e. rewrite `results_txt` (official lines "<task>: k: v - ...", one per trial and task, then
      the mean and std over trials) and `results_json`.

Existing outputs are never replaced without `overwrite`.

On JAX and PyTorch (`backend="jax"` / `"torch"`, no TensorFlow imported) the same run, with
the training loop, checkpoints and prediction of `portable_runner` and the TF-free tokenizer
(the same ids); every family. Step 2b saves a
checkpoint every `save_checkpoints_steps` steps and at the end (`<tasks>_checkpoints_<trial>/`),
so a rerun of an interrupted run keeps its finished trials (results_json) and resumes the
interrupted one; step 2d writes the trained weights (`<tasks>_model_<trial>/weights.npz`)
instead of a SavedModel, which `export_weights` (`--export-weights`, on TensorFlow) turns into
that SavedModel.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
from typing import Dict, List, Optional

import keras
import numpy as np

from electra_tf import atomic, precision
from electra_tf.errors import ElectraError
from electra_tf.finetuning import metrics as metrics_lib, portable_runner
from electra_tf.finetuning.config import PRECISIONS, FinetuningConfig
from electra_tf.finetuning.model import FinetuningModel, summed_loss
from electra_tf.finetuning.optimization import check_covered, layerwise_lr_multipliers
from electra_tf.finetuning.portable_encoding import PortableTextEncoder, backend_tokenizer
from electra_tf.finetuning.pretrained import Pretrained, load_pretrained
from electra_tf.finetuning.registry import build_task, task_family
from electra_tf.finetuning.task import SHARED_FEATURES, FinetuningTask, ScoreContext, prefixed
from electra_tf.progress import eta_seconds, format_duration
from electra_tf.training import npz_checkpoint
from electra_tf.training.optimization import WarmupPolynomialDecay, apply_gradients
from electra_tf.training.optimizers import AdamWeightDecay
from electra_tf.training.tf import graph_leaks
from electra_tf.vocab import load_vocab

logger = logging.getLogger("electra_tf")

TASK_ID = "task_id"


class FinetuningError(ElectraError, RuntimeError):
    """The run cannot proceed (outputs exist without overwrite, no training data, ...)."""


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def training_table(tasks: List[FinetuningTask], batch_size: int,
                   max_seq_length: int) -> Dict[str, np.ndarray]:
    """Every task's training records in one table (official layout; see module docstring).

    Args:
        tasks: the run's tasks, in task-id order.
        batch_size: int. The record count is padded up to a multiple of it (official).
        max_seq_length: int.

    Returns:
        {feature: numpy [n_padded, ...]}: `input_ids`, `input_mask`, `segment_ids`, `task_id`
        and `<task>_<key>` for every task's own features.

    Raises:
        FinetuningError: no task has training data.
    """
    parts = []
    specs = {task.name: task.feature_specs() for task in tasks}
    for task_id, task in enumerate(tasks):
        features = task.train_features()
        if features is None or len(features["input_ids"]) == 0:
            continue
        n = len(features["input_ids"])
        part = {key: features[key] for key in SHARED_FEATURES}
        part[TASK_ID] = np.full([n], task_id, np.int32)
        for other in tasks:
            for key, spec in specs[other.name].items():
                column = f"{other.name}_{key}"
                if other is task and key in features:
                    part[column] = features[key].astype(spec.dtype)
                else:
                    part[column] = np.zeros([n, *spec.shape], spec.dtype)
        parts.append(part)
    if not parts:
        raise FinetuningError(f"no training records in {', '.join(t.name for t in tasks)}")
    table = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    n = len(table[TASK_ID])
    padding = -n % batch_size
    if padding:
        # Official padding records: task_id = number of tasks, zeros elsewhere (zero loss).
        for key, column in table.items():
            fill = len(tasks) if key == TASK_ID else 0
            table[key] = np.concatenate(
                [column, np.full([padding, *column.shape[1:]], fill, column.dtype)])
    assert table["input_ids"].shape[1] == max_seq_length
    return table


def num_train_steps(num_records: int, config: FinetuningConfig) -> int:
    """Official: int((n_records_padded // train_batch_size) * num_train_epochs), at least 1.

    `num_records` counts featurised records (QA windows, swapped pairs) and, when it is the
    padded table's length, the padding records (official).
    """
    batches = -(-num_records // config.train_batch_size)  # the padded count // batch size
    return max(1, int(batches * config.num_train_epochs))


# ------------------------------------------------------------------------------------------------
# Model and training
# ------------------------------------------------------------------------------------------------
def build_model(pretrained: Pretrained, tasks: List[FinetuningTask], seed: int) -> FinetuningModel:
    """The model with the pretrained encoder weights (random ones for random init)."""
    keras.utils.set_random_seed(seed)  # head init, dropout seeds (and the encoder if random)
    model = FinetuningModel(pretrained.encoder_config, [t.head_config() for t in tasks])
    if pretrained.weights is not None:
        model.encoder.set_weights(pretrained.weights)
    return model


def make_optimizer(model: FinetuningModel, config: FinetuningConfig, steps: int) -> AdamWeightDecay:
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


def train(model: FinetuningModel, table: Dict[str, np.ndarray], config: FinetuningConfig,
          seed: int, task_names: List[str], batches=None,
          step_losses: Optional[List[float]] = None,
          checkpoints: Optional[portable_runner.TrialCheckpoints] = None) -> Dict[str, float]:
    """Trains `num_train_steps` steps on `training_table` records; returns {"steps",
    "seconds", "final_loss"} (the loss is summed over the batch, as trained), and on JAX /
    PyTorch "resumed_from" (the step a checkpoint restored, 0 for none).

    On the Keras backend in use: TensorFlow (a `tf.function` loop over `tf.data`, shuffled
    with `seed`) or JAX / PyTorch (`portable_runner.train`, numpy batches of
    `shuffled_batches`, checkpoints and resume).

    Args:
        batches: optional iterable of {feature: numpy [batch, ...]} to train on instead of the
            seeded shuffle (tests: the same batches on every backend); a resumed trial skips
            the steps it restored.
        step_losses: optional list; each reported chunk's mean loss is appended to it.
        checkpoints: JAX / PyTorch: the trial's checkpoints (resumed from, saved to); None for
            none.
    """
    n = len(table[TASK_ID])
    steps = num_train_steps(n, config)
    optimizer = make_optimizer(model, config, steps)
    chunk = min(config.iterations_per_loop, config.log_steps)
    start = time.time()

    def report(done: int, loss: float, k: int) -> None:
        if step_losses is not None:
            step_losses.append(loss)
        if not np.isfinite(loss):
            raise FinetuningError(f"non-finite training loss at step {done}")
        if done % config.log_steps < k or done == steps:
            logger.info("  step %d/%d loss %.4f (summed over the batch) %.1f records/s, ETA %s",
                        done, steps, loss,
                        done * config.train_batch_size / max(time.time() - start, 1e-9),
                        format_duration(eta_seconds(done, steps, time.time() - start)))

    if keras.backend.backend() != "tensorflow":
        if config.official_gpu_clip_norm:
            raise FinetuningError("official_gpu_clip_norm needs TensorFlow's IndexedSlices "
                                  "gradients: on JAX an embedding's gradient is dense (its "
                                  "repeated rows already summed); use --backend tensorflow")
        resumed = portable_runner.Resumed(0, float("nan"))
        if checkpoints is not None:
            try:
                resumed = portable_runner.resume_step(model, optimizer, checkpoints)
            except ValueError as e:
                raise FinetuningError(str(e)) from None
        if batches is None:
            batches = portable_runner.shuffled_batches(table, config.train_batch_size, seed,
                                                       start=resumed.step)
        else:
            batches = itertools.islice(batches, resumed.step, None)
        loss = portable_runner.train(
            model, optimizer, batches, steps, task_names,
            lambda done, loss: report(done, loss, 1 if done % chunk else chunk), chunk,
            checkpoints, start=resumed)
        return {"steps": steps, "seconds": time.time() - start, "final_loss": loss,
                "resumed_from": resumed.step}

    import tensorflow as tf

    variables = model.trainable_variables
    if batches is None:
        dataset = (tf.data.Dataset.from_tensor_slices(table)
                   .shuffle(n, seed=seed, reshuffle_each_iteration=True)
                   .repeat()
                   .batch(config.train_batch_size, drop_remainder=True))
        iterator = iter(dataset)
    else:
        iterator = (dict(b) for b in batches)

    @tf.function
    def step_fn(batch):
        with tf.GradientTape() as tape:
            outputs = model(batch, training=True)
            loss = summed_loss(outputs, batch[TASK_ID], task_names)
        grads = tape.gradient(loss, variables)
        apply_gradients(optimizer, grads, variables,
                        sum_repeated_rows=not config.official_gpu_clip_norm)
        return loss

    @tf.function
    def train_loop(iterator, num_steps):
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            total += step_fn(next(iterator))
        return total / tf.cast(num_steps, tf.float32)

    done, loss = 0, float("nan")
    while done < steps:
        k = min(chunk, steps - done)
        if batches is None:
            loss = float(train_loop(iterator, tf.constant(k)))
        else:  # Python batches: one step per call
            loss = sum(float(step_fn(next(iterator))) for _ in range(k)) / k
        done += k
        report(done, loss, k)
    return {"steps": steps, "seconds": time.time() - start, "final_loss": loss}


def predict(model: FinetuningModel, task_name: str, features: Dict[str, np.ndarray],
            batch_size: int) -> Dict[str, np.ndarray]:
    """The head outputs of one task over every record (eval mode, the last batch kept whole).

    Args:
        features: shared features plus the task's own (`<task>_<key>` or unprefixed).

    Returns:
        {output name: numpy [n, ...]}.
    """
    if keras.backend.backend() != "tensorflow":
        return portable_runner.predict(model, task_name, features, batch_size)
    import tensorflow as tf

    features = prefixed(task_name, features)
    # One trace for every batch size (the last batch is smaller).
    spec = {k: tf.TensorSpec([None, *v.shape[1:]], tf.as_dtype(v.dtype)) for k, v in features.items()}

    @tf.function(input_signature=[spec])
    def forward(batch):
        return model.task_outputs(batch, task_name, training=False)

    n = len(features["input_ids"])
    outputs: Dict[str, List[np.ndarray]] = {}
    for start in range(0, n, batch_size):
        batch = {k: tf.constant(v[start:start + batch_size]) for k, v in features.items()}
        for key, value in forward(batch).items():
            outputs.setdefault(key, []).append(value.numpy())
    return {k: np.concatenate(v) for k, v in outputs.items()}


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------
def summarize(trials: List[dict]) -> Dict[str, Dict[str, Dict[str, Dict[str, float]]]]:
    """{task: {split: {metric: {"mean", "std"}}}} over the trials."""
    summary: dict = {}
    for task, splits in trials[0]["metrics"].items():
        for split, values in splits.items():
            for metric in values:
                series = [t["metrics"][task][split][metric] for t in trials]
                summary.setdefault(task, {}).setdefault(split, {})[metric] = metrics_lib.mean_and_std(series)
    return summary


def trial_lines(record: dict) -> List[str]:
    """Official results.txt lines of one trial: "<task>: k1: v1 - k2: v2" (2 decimals) for dev;
    other splits as "<task> <split>: ..."."""
    lines = []
    for task, splits in record["metrics"].items():
        for split, values in splits.items():
            label = task if split == "dev" else f"{task} {split}"
            lines.append(f"{label}: " + " - ".join(f"{k}: {v:.2f}" for k, v in values.items()))
    return lines


def format_results(summary: dict, num_trials: int) -> List[str]:
    """`task split metric: mean ± std (n trials)`, in the metrics' own (official) units."""
    lines = []
    for task, splits in summary.items():
        for split, values in splits.items():
            for metric, stat in values.items():
                lines.append(f"{task} {split} {metric}: {stat['mean']:.2f} ± {stat['std']:.2f} "
                             f"({num_trials} trial{'s' if num_trials > 1 else ''})")
    return lines


def _check_outputs(config: FinetuningConfig, overwrite: bool) -> None:
    outputs = [config.results_txt, config.results_json]
    if config.do_train and config.do_export:
        outputs += [config.trial_model_dir(t) for t in range(1, config.num_trials + 1)]
    existing = [p for p in outputs if os.path.exists(p)]
    if existing and not overwrite:
        raise FinetuningError(f"{existing[0]} already exists; pass --overwrite to replace the "
                              "results and fine-tuned models of this run")


def _json_clean(value):
    """`value` as results.json stores it (tuples as lists, other objects as str)."""
    return json.loads(json.dumps(value, default=str))


def _resumed_trials(config: FinetuningConfig, overwrite: bool) -> Optional[List[dict]]:
    """JAX / PyTorch: what a rerun of an interrupted run of the same hparams keeps, the records
    of the trials it finished (its results_json; [] when it stopped in trial 1 after a
    checkpoint). None when there is nothing to resume: `_check_outputs` then decides (a
    finished run's or another run's outputs are refused without `overwrite`, which also removes
    the trials' checkpoints here).
    """
    if overwrite:
        for trial in range(1, config.num_trials + 1):
            for path in npz_checkpoint.checkpoints(config.trial_checkpoint_dir(trial)):
                os.remove(path)
        return None
    if not os.path.exists(config.results_json):
        has_checkpoints = any(npz_checkpoint.checkpoints(config.trial_checkpoint_dir(t))
                              for t in range(1, config.num_trials + 1))
        return [] if has_checkpoints else None
    try:
        with open(config.results_json, encoding="utf-8") as f:
            previous = json.load(f)
    except (OSError, ValueError):
        return None
    untrained = portable_runner.UNTRAINED_HPARAMS
    mine = {k: v for k, v in _json_clean(config.to_dict()).items() if k not in untrained}
    theirs = {k: v for k, v in (previous.get("config") or {}).items() if k not in untrained}
    trials = previous.get("trials") or []
    if (mine != theirs or previous.get("backend") == "tensorflow"
            or not 0 < len(trials) < config.num_trials):
        return None
    return trials


def _ordered_like(values: dict, template: dict) -> dict:
    """`values` (nested dicts) with the keys `template` has first, in its order."""
    ordered = {k: values[k] for k in template if k in values}
    ordered.update({k: v for k, v in values.items() if k not in ordered})
    return {k: _ordered_like(v, template.get(k, {})) if isinstance(v, dict) else v
            for k, v in ordered.items()}


def _write_results(config: FinetuningConfig, results: dict) -> None:
    atomic.write_json(config.results_json, results, sort_keys=True, default=str,
                      ensure_ascii=False)
    lines = [line for record in results["trials"] for line in trial_lines(record)]
    if results["summary"]:
        lines += format_results(results["summary"], len(results["trials"]))
    atomic.write_text(config.results_txt, "\n".join(lines) + ("\n" if lines else ""))


def _log_examples(task: FinetuningTask, features: Dict[str, np.ndarray], vocab, count: int = 3) -> None:
    for i in range(min(count, len(features["input_ids"]))):
        n = int(features["input_mask"][i].sum())
        tokens = " ".join(vocab.tokens[t] for t in features["input_ids"][i][:n])
        own = {k: v[i].tolist() for k, v in features.items()
               if k not in SHARED_FEATURES and np.ndim(v[i]) == 0}
        logger.info("%s record %d: %s | %s | segment_ids %s", task.name, i, own, tokens,
                    features["segment_ids"][i][:n].tolist())


def _run_trial(config: FinetuningConfig, trial: int, pretrained: Pretrained,
               tasks: List[FinetuningTask], table: Optional[Dict[str, np.ndarray]],
               task_names: List[str], eval_sets: Dict[str, list], results_dir: str) -> dict:
    """Trains, scores and exports one trial's model (seed `config.seed + trial - 1`). Returns its
    record for results.json: trial, seed, metrics, train summary, export."""
    seed = config.seed + trial - 1
    logger.info("trial %d/%d (seed %d)", trial, config.num_trials, seed)
    model = build_model(pretrained, tasks, seed)
    record = {"trial": trial, "seed": seed, "metrics": {}}
    if config.do_train:
        checkpoints = None
        if keras.backend.backend() != "tensorflow":
            checkpoints = portable_runner.TrialCheckpoints(
                config.trial_checkpoint_dir(trial), config.save_checkpoints_steps,
                portable_runner.checkpoint_state(_json_clean(config.to_dict()), trial, seed,
                                                 len(table[TASK_ID])))
        record.update(train(model, table, config, seed, task_names, checkpoints=checkpoints))
    if config.do_eval:
        context = ScoreContext(results_dir, trial,
                               config.write_test_outputs and trial <= config.n_writes_test,
                               config.task_names_str)
        for task in tasks:
            for eval_set in eval_sets[task.name]:
                if not eval_set.labelled and not context.write_test_outputs:
                    continue  # nothing to score or write
                outputs = predict(model, task.name, eval_set.features,
                                  config.predict_batch_size)
                values = task.score(eval_set, outputs, context)
                if values is not None:
                    record["metrics"].setdefault(task.name, {})[eval_set.split] = values
                    logger.info("  %s %s: %s", task.name, eval_set.split,
                                " - ".join(f"{k}: {v:.2f}" for k, v in values.items()))
    if config.do_train and config.do_export and (config.keep_all_models
                                                 or trial == config.num_trials):
        if keras.backend.backend() != "tensorflow":
            path = os.path.join(config.trial_model_dir(trial), portable_runner.WEIGHTS_NAME)
            record["export"] = portable_runner.weights_archive(
                model, path, {"finetuning_config": config.to_dict(),
                              "encoder_config": pretrained.encoder_config,
                              "tasks": [t.head_config() for t in tasks],
                              "vocab": pretrained.vocab.path,
                              "do_lower_case": pretrained.do_lower_case,
                              "strip_accents": pretrained.strip_accents,
                              "backend": keras.backend.backend()})
            logger.info("  saved the fine-tuned weights to %s", record["export"])
            return record
        # lazy: TensorFlow is optional here (export is TensorFlow's; training runs on JAX too)
        from electra_tf.finetuning.export import FinetunedModule, export_finetuned

        module = FinetunedModule(model, tasks, config.export_precision)
        record["export"] = export_finetuned(module, config.trial_model_dir(trial),
                                            config.to_json(), pretrained.vocab.path)
        logger.info("  exported %s", record["export"])
    return record


def export_weights(weights_path: str, target: Optional[str] = None) -> str:
    """The SavedModel of a JAX / PyTorch trial's `weights.npz`, as the TensorFlow runner exports
    it (`--export-weights`; TensorFlow backend).

    The archive's meta names the fine-tuning config, encoder, heads, vocab and casing; the tasks
    are built again from the config's `raw_data_dir` (their labels and serving come from the
    task files), the model gets the archive's arrays by variable path.

    Args:
        weights_path: str. `<tasks>_model_<trial>/weights.npz`.
        target: str. Export directory (replaced); default `saved_model/` beside the archive.

    Returns:
        The export directory.

    Raises:
        FinetuningError: not TensorFlow, not a weights archive, or the task files give other
            heads (labels) than the archive's.
    """
    if keras.backend.backend() != "tensorflow":
        raise FinetuningError("--export-weights writes a TensorFlow SavedModel: run it with "
                              "--backend tensorflow (TensorFlow installed)")
    # lazy: TensorFlow is optional here (the SavedModel export is TensorFlow's)
    from electra_tf.finetuning.export import FinetunedModule, export_finetuned

    try:
        with np.load(weights_path, allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
            arrays = {k: archive[k] for k in archive.files if k != "meta"}
        config = FinetuningConfig.from_dict(meta["finetuning_config"])
        encoder_config, heads = meta["encoder_config"], meta["tasks"]
        casing = (meta["do_lower_case"], meta["strip_accents"])
    except (OSError, ValueError, KeyError) as e:
        raise FinetuningError(f"{weights_path} is not a fine-tuned weights archive of "
                              f"--backend jax/torch ({type(e).__name__}: {e})") from None
    vocab = load_vocab(meta["vocab"])
    pretrained = Pretrained(encoder_config, None, vocab, *casing, "weights", weights_path, 0)
    tokenizer, text_encoder = _text_encoding(pretrained, config.max_seq_length)
    tasks = [build_task(name, config, pretrained, tokenizer, text_encoder)
             for name in config.task_names]
    rebuilt = _json_clean([t.head_config() for t in tasks])
    if rebuilt != heads:
        raise FinetuningError(f"the task files of {config.raw_data_dir} give the heads "
                              f"{rebuilt}, {weights_path} holds {heads}: export where the "
                              "trial's task files are")
    model = FinetuningModel(encoder_config, heads)
    missing = [v.path for v in model.weights if v.path not in arrays]
    if missing:
        raise FinetuningError(f"{weights_path} lacks {missing[0]} of the model it describes")
    for variable in model.weights:
        variable.assign(arrays[variable.path])
    target = target or os.path.join(os.path.dirname(os.path.abspath(weights_path)),
                                    SAVED_MODEL_DIR)
    module = FinetunedModule(model, tasks, config.export_precision)
    return export_finetuned(module, target, config.to_json(), vocab.path)


# --export-weights' default export directory, beside the weights archive.
SAVED_MODEL_DIR = "saved_model"


def run(config: FinetuningConfig, overwrite: bool = False) -> dict:
    """Fine-tunes and evaluates as the config says (see module docstring).

    Returns:
        The results dict written to `results_json`: "config", "init", "data", "precision" (the
        policy `mixed_precision` resolved to and why), "trials" (per-trial
        metrics, steps, seconds, export path, files), "summary" ({task: {split: {metric: {mean,
        std}}}}).

    Raises:
        FinetuningError, DataFileError, PretrainedError, ConfigError: bad input (one line).
    """
    # Every graph traced here goes when the run ends (graph_leaks), each trial's already when the
    # trial ends.
    with _graphs_released():
        return _run(config, overwrite)


def _text_encoding(pretrained: Pretrained, max_seq_length: int):
    """(tokenizer, text encoder) of the run: in-graph on TensorFlow, TF-free elsewhere (the same
    ids: `data.portable_tokenization`)."""
    tokenizer = backend_tokenizer(pretrained.vocab, pretrained.do_lower_case,
                                  pretrained.strip_accents)
    if keras.backend.backend() == "tensorflow":
        # lazy: TensorFlow is optional here (the in-graph encoder; JAX runs encode in numpy)
        from electra_tf.finetuning.encoding import TextEncoder

        return tokenizer, TextEncoder(tokenizer, max_seq_length)
    return tokenizer, PortableTextEncoder(tokenizer, max_seq_length)


def _graphs_released():
    """`graph_leaks.custom_gradients_released` on TensorFlow; nothing to release elsewhere."""
    if keras.backend.backend() == "tensorflow":
        return graph_leaks.custom_gradients_released()
    return contextlib.nullcontext()


def _run(config: FinetuningConfig, overwrite: bool) -> dict:
    backend = keras.backend.backend()
    try:
        portable_runner.check_families(
            backend, {name: task_family(name) for name in config.task_names})
    except ValueError as e:
        raise FinetuningError(str(e)) from None
    if backend == "tensorflow":
        # lazy: TensorFlow is optional here (JAX and PyTorch fine-tuning never import it)
        from electra_tf.training.tf.strategy import set_inter_op_threads

        set_inter_op_threads()  # one device: one op at a time on a CPU-only machine (strategy.py)
    elif backend == "jax":
        # Each trial compiles its step and forward anew (a new model): with the persistent
        # cache, the second trial and every later run of the same shapes load them instead.
        from electra_tf.training.portable import support as portable_support  # lazy: JAX only

        portable_support.use_compilation_cache(backend)
    done_trials = _resumed_trials(config, overwrite) if backend != "tensorflow" else None
    if done_trials is None:
        _check_outputs(config, overwrite)
        done_trials = []
    pretrained = load_pretrained(config)
    tokenizer, text_encoder = _text_encoding(pretrained, config.max_seq_length)
    tasks = [build_task(name, config, pretrained, tokenizer, text_encoder)
             for name in config.task_names]
    task_names = [t.name for t in tasks]
    eval_sets = {task.name: task.eval_sets() for task in tasks}
    data_summary = {}
    for task in tasks:
        data_summary[task.name] = task.summary()
        logger.info("task %s (%s): %s", task.name, task.family, {
            k: v for k, v in data_summary[task.name].items() if isinstance(v, int)})
    table = training_table(tasks, config.train_batch_size, config.max_seq_length) \
        if config.do_train else None
    if config.log_examples and table is not None:
        for task_id, task in enumerate(tasks):
            mine = table[TASK_ID] == task_id
            _log_examples(task, {k: v[mine] for k, v in table.items()}, pretrained.vocab)

    results = {
        "config": config.to_dict(),
        "backend": backend,
        "init": {"kind": pretrained.kind, "source": pretrained.source, "step": pretrained.step,
                 "encoder_config": pretrained.encoder_config,
                 "do_lower_case": pretrained.do_lower_case, "strip_accents": pretrained.strip_accents},
        "data": data_summary,
        "trials": [],
        "summary": {},
    }
    results_dir = os.path.dirname(config.results_json)
    choice = precision.choose(config.mixed_precision, allowed=PRECISIONS[1:],
                              facts=None if backend == "tensorflow"
                              else precision.detect_keras_backend(backend))
    results["precision"] = {"policy": choice.policy, "reason": choice.reason}
    keras.mixed_precision.set_global_policy(choice.policy)
    try:
        if done_trials:
            logger.info("resuming: trial%s %s done (%s)", "s" if len(done_trials) > 1 else "",
                        ", ".join(str(t["trial"]) for t in done_trials), config.results_json)
            results["trials"] = done_trials
        for trial in range(len(done_trials) + 1, config.num_trials + 1):
            # The trial's traced graphs go with its model (graph_leaks: TensorFlow's
            # custom-gradient registry would keep every trial's for the life of the process).
            with _graphs_released():
                record = _run_trial(config, trial, pretrained, tasks, table, task_names,
                                    eval_sets, results_dir)
            if done_trials and trial == len(done_trials) + 1:
                # results.json sorts keys: the kept trials' metrics back in the scorers' order
                # (results.txt's), which this trial's record has.
                for kept in done_trials:
                    kept["metrics"] = _ordered_like(kept["metrics"], record["metrics"])
            results["trials"].append(record)
            if results["trials"][0]["metrics"]:
                results["summary"] = summarize(results["trials"])
            _write_results(config, results)  # after every trial (official)
            if backend != "tensorflow":
                # results_json now holds the trial, which is all a rerun keeps of it: its
                # checkpoints (model and optimizer, 3x the weights) would only take disk.
                for path in npz_checkpoint.checkpoints(config.trial_checkpoint_dir(trial)):
                    os.remove(path)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for line in format_results(results["summary"], config.num_trials):
        logger.info("%s", line)
    return results
