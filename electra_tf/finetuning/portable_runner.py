"""Fine-tuning's training loop, checkpoints and prediction on JAX and PyTorch
(`run_finetuning.py --backend jax|torch`).

`runner.run` does everything else the same on every backend (tasks, the training table, trials,
scoring, results files); on JAX and PyTorch it calls `train` and `predict` here instead of the
TensorFlow ones, with the TF-free tokenizer (`data.portable_tokenization`, the same ids) and text
encoder (`portable_encoding`). The step is the TensorFlow runner's, written with `keras.ops`:

    loss  = Σ over the batch of each record's loss under its own task   (`model.summed_loss`)
    grads = d loss / d weights, clipped at global norm 1.0 (dense gradients: the true norm,
            as TensorFlow's default with the repeated embedding rows summed)
    AdamWeightDecay (no bias correction, wd 0.01 except LayerNorm/bias, the layer-wise
            learning-rate multipliers, warmup then linear decay): `runner.make_optimizer`

On JAX `jax.value_and_grad` of the model's `stateless_call`, compiled once (`jax.jit`,
`_JaxSteps`); on PyTorch eager autograd (`_TorchSteps`, as `training.portable_fit`'s step).
Dropout draws the counter-based "hash" stream of the encoder and the heads'
(`kernel_settings.DROPOUT_RNG`), so on the same weights and batches the losses equal
TensorFlow's (tests/finetuning/test_finetuning_backends.py).

Families: classification, regression, tagging and question answering (every head is
`keras.ops`; QA's features and n-best decoding are numpy and Python, its SavedModel serving
stays TensorFlow's). The training order is a seeded full shuffle each epoch (numpy: TensorFlow's
`tf.data` order cannot be drawn without TensorFlow), so a JAX trial sees other batches than a
TensorFlow trial of the same seed; the metrics agree within seed noise, not digit for digit.

Checkpoints (`TrialCheckpoints`): every `save_checkpoints_steps` steps and at a trial's last
step, `training.npz_checkpoint`'s `ckpt-N.npz` (model with its dropout seed states,
optimizer) in `<tasks>_checkpoints_<trial>/`, the newest kept (`runner` removes it once
results_json records the trial); its data_state records the hparams that train
(`checkpoint_state`) and the loss report in progress. A rerun restores the newest intact one
(`resume_step`) and continues the same batch order from its step
(`shuffled_batches(start=)`), so an interrupted trial ends on the weights and metrics of an
uninterrupted one; a checkpoint of other hparams is refused in one line naming the first.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional

import keras
import numpy as np

from electra_tf import atomic
from electra_tf.console import KERAS_BACKENDS
from electra_tf.finetuning.model import FinetuningModel, summed_loss
from electra_tf.finetuning.task import (CLASSIFICATION, QUESTION_ANSWERING, REGRESSION, TAGGING,
                                        prefixed)
from electra_tf.training import npz_checkpoint, optimization

logger = logging.getLogger("electra_tf")

BACKENDS = KERAS_BACKENDS
PORTABLE_FAMILIES = (CLASSIFICATION, REGRESSION, TAGGING, QUESTION_ANSWERING)
TASK_ID = "task_id"
WEIGHTS_NAME = "weights.npz"  # in <tasks>_model_<trial>/ on JAX: `weights_archive`


def check_families(backend: str, families: Dict[str, str]) -> None:
    """Raises ValueError (one line) naming the tasks `backend` cannot fine-tune yet.

    Args:
        backend: "tensorflow" (every family) or "jax".
        families: {task name: family}.
    """
    if backend == "tensorflow":
        return
    refused = [f"{name} ({family})" for name, family in families.items()
               if family not in PORTABLE_FAMILIES]
    if refused:
        supported = f"{', '.join(PORTABLE_FAMILIES[:-1])} and {PORTABLE_FAMILIES[-1]}"
        raise ValueError(f"fine-tuning on --backend {backend} supports the {supported} "
                         f"families; not {', '.join(refused)}: use --backend tensorflow for them")


def shuffled_batches(table: Dict[str, np.ndarray], batch_size: int, seed: int,
                     start: int = 0) -> Iterator[Dict[str, np.ndarray]]:
    """Endless batches of `table`: a seeded full shuffle each epoch (`np.random.default_rng((seed,
    epoch))`), full batches only (the table is padded to a multiple of the batch).

    Args:
        start: int. Batches to skip (a resumed trial's step): the batches after them are those
            an uninterrupted trial draws, without slicing the skipped ones.
    """
    n = len(table[TASK_ID])
    per_epoch = n // batch_size
    epoch, first = divmod(start, per_epoch)
    while True:
        order = np.random.default_rng((seed, epoch)).permutation(n)
        for begin in range(first * batch_size, n - batch_size + 1, batch_size):
            rows = order[begin:begin + batch_size]
            yield {k: v[rows] for k, v in table.items()}
        epoch, first = epoch + 1, 0


class TrialCheckpoints(NamedTuple):
    """Where and how often one trial saves (`ckpt-N.npz`, `training.npz_checkpoint`).

    Attributes:
        directory: str. `FinetuningConfig.trial_checkpoint_dir(trial)`.
        every: int. Save every this many steps (`save_checkpoints_steps`), and at the last step.
        state: dict. What the checkpoint must match to be resumed (`checkpoint_state`).
    """

    directory: str
    every: int
    state: dict


def checkpoint_state(config_dict: dict, trial: int, seed: int, num_records: int) -> dict:
    """What a trial's checkpoints belong to: the hparams that decide its training (the run's
    config less what only logs or reports), the trial, its seed and the table's size."""
    hparams = {k: v for k, v in config_dict.items() if k not in UNTRAINED_HPARAMS}
    return {"hparams": hparams, "trial": trial, "seed": seed, "num_records": num_records}


# Hparams that change no weight of a trial: a resumed trial may differ in them.
UNTRAINED_HPARAMS = ("log_steps", "num_trials", "keep_all_models", "do_eval", "do_export",
                     "write_test_outputs", "n_writes_test", "results_txt", "results_json",
                     "save_checkpoints_steps", "eval_batch_size", "predict_batch_size",
                     "legacy_tagging_loss", "export_precision")


class Resumed(NamedTuple):
    """Where a trial resumes: `step` (0: from the start), the loss last reported before it (nan
    for none: `train`'s result when nothing is left to train), and the losses summed since that
    report over `chunk_steps` steps (so the next report averages the same steps as an
    uninterrupted trial's)."""

    step: int
    loss: float
    chunk_total: float = 0.0
    chunk_steps: int = 0


def resume_step(model: FinetuningModel, optimizer, checkpoints: TrialCheckpoints) -> Resumed:
    """Restores the trial's newest intact checkpoint into `model` and `optimizer`; returns its
    step and last loss (step 0 without one).

    Raises:
        ValueError: the checkpoint belongs to other hparams (one line naming the first that
            differs) or another trial.
    """
    path = npz_checkpoint.latest_good(checkpoints.directory)
    if path is None:
        return Resumed(0, float("nan"))
    saved = npz_checkpoint.read_meta(path).get("data_state") or {}
    mine = checkpoints.state
    if saved.get("hparams") != mine["hparams"]:
        theirs = saved.get("hparams") or {}
        key = next(k for k in sorted(set(theirs) | set(mine["hparams"]))
                   if theirs.get(k) != mine["hparams"].get(k))
        raise ValueError(f"{path} was written with {key}={theirs.get(key)!r}, this run has "
                         f"{key}={mine['hparams'].get(key)!r}: rerun with the same hparams to "
                         "resume, or pass --overwrite to start over")
    for key in ("trial", "seed", "num_records"):
        if saved.get(key) != mine[key]:
            raise ValueError(f"{path} belongs to {key} {saved.get(key)!r}, this trial has "
                             f"{mine[key]!r}: pass --overwrite to start over")
    step = npz_checkpoint.restore(path, model, optimizer).step
    logger.info("  resumed from %s (step %d)", path, step)
    return Resumed(step, *(saved[key] for key in PROGRESS_KEYS))


# Beside the state in a checkpoint's data_state: `Resumed`'s loss fields.
PROGRESS_KEYS = ("loss", "chunk_total", "chunk_steps")


def _save(model: FinetuningModel, optimizer, progress: Resumed,
          checkpoints: TrialCheckpoints) -> None:
    os.makedirs(checkpoints.directory, exist_ok=True)
    state = dict(checkpoints.state, **dict(zip(PROGRESS_KEYS, progress[1:])))
    npz_checkpoint.save(checkpoints.directory, progress.step, model, optimizer, state,
                             data_key=None)
    # The newest intact one is all a resume reads: the older go once it is written whole.
    npz_checkpoint.enforce_retention(checkpoints.directory, 1)


def train(model: FinetuningModel, optimizer, batches: Iterable[Dict[str, np.ndarray]],
          steps: int, task_names: List[str],
          on_chunk: Callable[[int, float], None], chunk: int,
          checkpoints: Optional[TrialCheckpoints] = None,
          start: Resumed = Resumed(0, float("nan"))) -> float:
    """Runs steps `start`..`steps` on `batches`; calls `on_chunk(done, mean loss)` every `chunk`
    steps (and at the end); saves a checkpoint every `checkpoints.every` steps and at the end.
    Returns the last chunk's mean loss (summed over the batch, as trained; nan when nothing was
    left to train: the restored loss).

    Args:
        model: built FinetuningModel.
        optimizer: built `AdamWeightDecay` (`runner.make_optimizer`).
        batches: iterator of {feature: numpy [batch, ...]}, from step `start` on
            (`shuffled_batches`).
        steps: int. The trial's step count.
        task_names: in task-id order.
        on_chunk: logging and the non-finite check (`runner.train`).
        chunk: int. Steps per report.
        checkpoints: where to save, or None (no checkpoints).
        start: where the model and optimizer are (`resume_step`).
    """
    batches = iter(batches)
    if start.step >= steps:
        return start.loss
    first = next(batches)
    _build(model, first)
    batches = itertools.chain([first], batches)
    stepper = (_JaxSteps if keras.backend.backend() == "jax" else _TorchSteps)(
        model, optimizer, task_names)
    done, loss, total, in_chunk = start
    while done < steps:
        total += float(stepper.step(next(batches)))  # synchronises: one step in flight
        done += 1
        in_chunk += 1
        if in_chunk == chunk or done == steps:
            loss = total / in_chunk
            on_chunk(done, loss)
            total, in_chunk = 0.0, 0
        if checkpoints is not None and (done % checkpoints.every == 0 or done == steps):
            stepper.sync()
            _save(model, optimizer, Resumed(done, loss, total, in_chunk), checkpoints)
    stepper.sync()
    return loss


class _JaxSteps:
    """The step as one jitted stateless function; the state lives outside the variables until
    `sync` writes it back (a checkpoint, the end)."""

    def __init__(self, model: FinetuningModel, optimizer, task_names: List[str]):
        # lazy: only the backend in use is installed for sure
        import jax

        self.model, self.optimizer = model, optimizer

        def loss_fn(trainable, non_trainable, batch):
            outputs, non_trainable = model.stateless_call(trainable, non_trainable, batch,
                                                          training=True)
            return summed_loss(outputs, batch[TASK_ID], task_names), non_trainable

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def step(state, batch):
            trainable, non_trainable, optimizer_vars = state
            (loss, non_trainable), grads = grad_fn(trainable, non_trainable, batch)
            clipped = optimization.dense_clip_by_global_norm(grads, optimization.CLIP_NORM)
            trainable, optimizer_vars = optimizer.stateless_apply(
                optimizer_vars, clipped.gradients, trainable)
            return loss, (trainable, non_trainable, optimizer_vars)

        self._step = jax.jit(step, donate_argnums=0, compiler_options=cpu_compiler_options())
        self.state = ([v.value for v in model.trainable_variables],
                      [v.value for v in model.non_trainable_variables],
                      [v.value for v in optimizer.variables])

    def step(self, batch):
        loss, self.state = self._step(self.state, batch)
        return loss

    def sync(self) -> None:
        trainable, non_trainable, optimizer_vars = self.state
        for variables, values in ((self.model.trainable_variables, trainable),
                                  (self.model.non_trainable_variables, non_trainable),
                                  (self.optimizer.variables, optimizer_vars)):
            for variable, value in zip(variables, values):
                variable.assign(value)
        # The donated buffers now back the variables: continue from the variables' values.
        self.state = ([v.value for v in self.model.trainable_variables],
                      [v.value for v in self.model.non_trainable_variables],
                      [v.value for v in self.optimizer.variables])


class _TorchSteps:
    """The step eagerly on PyTorch: autograd's backward, the same clip and optimizer update (as
    `training.portable_fit.torch_train_step`); the variables hold the state throughout."""

    def __init__(self, model: FinetuningModel, optimizer, task_names: List[str]):
        self.model, self.optimizer, self.task_names = model, optimizer, task_names

    def step(self, batch):
        # lazy: only the backend in use is installed for sure
        import torch

        model = self.model
        batch = {k: keras.ops.convert_to_tensor(v) for k, v in batch.items()}
        model.zero_grad()
        loss = summed_loss(model(batch, training=True), batch[TASK_ID], self.task_names)
        loss.backward()
        variables = model.trainable_variables
        grads = [v.value.grad if v.value.grad is not None else torch.zeros_like(v.value)
                 for v in variables]
        with torch.no_grad():
            clipped = optimization.dense_clip_by_global_norm(grads, optimization.CLIP_NORM)
            self.optimizer.apply(clipped.gradients, variables)
        return loss.detach()

    def sync(self) -> None:
        pass


def cpu_compiler_options() -> Optional[Dict[str, str]]:
    """XLA options for the jitted training step and prediction: on XLA:CPU, YNNPACK fusions
    off; elsewhere none.

    jaxlib 0.10's XLA:CPU hands dots and element-wise chains to YNNPACK ("ynn_fusion" in the
    compiled HLO). On a 2-core AMD EPYC Zen 4 (AVX-512 with AVX512_BF16, no AMX) the tiny BBC
    News model's step (batch 32, sequence 128) took 85-89 ms of CPU time without them against
    94-100 ms with them, in one process,
    alternating, and the eval forward 16.6-17.3 against 18.0-20.5 ms (docs/finetuning.md,
    "Measured"); the losses stay within the backends' rtol.
    """
    import jax

    return {"xla_cpu_experimental_ynn_fusion_type": ""} if jax.default_backend() == "cpu" else None


def _build(model: FinetuningModel, batch: Dict[str, np.ndarray],
           task_name: Optional[str] = None) -> None:
    """Marks the model built (its variables exist from construction; `stateless_call` wants a
    call first): one eval-mode call on a row of `batch` (no dropout draw, no state change).

    Args:
        batch: every task's features (a training batch), or `task_name`'s only.
        task_name: when given, only that task's head is called: an unbuilt multi-task model
            (evaluation without training) has no other task's features to call the others
            with, and their variables exist already (`TaskHeads` builds every head).
    """
    if model.built:
        return
    row = {k: v[:1] for k, v in batch.items()}
    if task_name is None:
        model(row, training=False)
    else:
        model.task_outputs(row, task_name, training=False)
        model.built = True


def predict(model: FinetuningModel, task_name: str, features: Dict[str, np.ndarray],
            batch_size: int) -> Dict[str, np.ndarray]:
    """The head outputs of one task over every record (eval mode), as `runner.predict`.

    Every batch is `batch_size` rows (the last one padded with copies of its first row and cut
    after), so the forward pass compiles once.
    """
    features = prefixed(task_name, features)
    _build(model, features, task_name)
    forward = _jax_forward(model, task_name) if keras.backend.backend() == "jax" \
        else _torch_forward(model, task_name)
    n = len(features["input_ids"])
    outputs: Dict[str, List[np.ndarray]] = {}
    for start in range(0, n, batch_size):
        batch = {k: v[start:start + batch_size] for k, v in features.items()}
        rows = len(batch["input_ids"])
        if rows < batch_size:
            batch = {k: np.concatenate([v, np.repeat(v[:1], batch_size - rows, axis=0)])
                     for k, v in batch.items()}
        for key, value in forward(batch).items():
            outputs.setdefault(key, []).append(np.asarray(value)[:rows])
    return {k: np.concatenate(v) for k, v in outputs.items()}


def _jax_forward(model: FinetuningModel, task_name: str) -> Callable:
    # lazy: only the backend in use is installed for sure
    import jax

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    @functools.partial(jax.jit, compiler_options=cpu_compiler_options())
    def forward(trainable, non_trainable, batch):
        with keras.StatelessScope(state_mapping=list(zip(
                model.trainable_variables + model.non_trainable_variables,
                trainable + non_trainable))):
            return model.task_outputs(batch, task_name, training=False)

    return lambda batch: forward(trainable, non_trainable, batch)


def _torch_forward(model: FinetuningModel, task_name: str) -> Callable:
    # lazy: only the backend in use is installed for sure
    import torch

    def forward(batch):
        with torch.no_grad():
            batch = {k: keras.ops.convert_to_tensor(v) for k, v in batch.items()}
            return {k: keras.ops.convert_to_numpy(v)
                    for k, v in model.task_outputs(batch, task_name, training=False).items()}

    return forward


def weights_archive(model: FinetuningModel, path: str, meta: Optional[dict] = None) -> str:
    """Writes the fine-tuned model's weights as {variable path: array} (+ "meta" JSON) to the
    .npz `path` atomically; returns path. `export.export_weights` turns it into the SavedModel
    (TensorFlow)."""
    import json

    arrays = {v.path: np.asarray(keras.ops.convert_to_numpy(v.value)) for v in model.weights}
    arrays["meta"] = np.array(json.dumps(meta or {}))
    with atomic.atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    return path
