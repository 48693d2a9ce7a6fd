"""Fine-tuning's training loop and prediction on JAX (`run_finetuning.py --backend jax`).

`runner.run` does everything else the same on every backend (tasks, the training table, trials,
scoring, results files); on JAX it calls `train` and `predict` here instead of the TensorFlow
ones, with the TF-free tokenizer (`data.portable_tokenization`, the same ids) and text encoder
(`portable_encoding`). The step is the TensorFlow runner's, written with `keras.ops` around
`jax.value_and_grad` of the model's `stateless_call`:

    loss  = Σ over the batch of each record's loss under its own task   (`model.summed_loss`)
    grads = d loss / d weights, clipped at global norm 1.0 (dense gradients: the true norm,
            as TensorFlow's default with the repeated embedding rows summed)
    AdamWeightDecay (no bias correction, wd 0.01 except LayerNorm/bias, the layer-wise
            learning-rate multipliers, warmup then linear decay): `runner.make_optimizer`

compiled once (`jax.jit`); dropout draws the counter-based "hash" stream of the encoder and the
heads' (`kernel_settings.DROPOUT_RNG`), so on the same weights and batches the losses equal
TensorFlow's (tests/finetuning/test_finetuning_backends.py).

Families: classification and regression (their heads are `keras.ops`); question answering and
tagging (heads and serving in TensorFlow ops) are refused in one line (`check_families`). The
training order is a seeded full shuffle each epoch (numpy: TensorFlow's `tf.data` order cannot
be drawn without TensorFlow), so a JAX trial sees other batches than a TensorFlow trial of the
same seed; the metrics agree within seed noise, not digit for digit.
"""

from __future__ import annotations

import itertools
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import keras
import numpy as np

from electra_tf.finetuning.model import FinetuningModel, summed_loss
from electra_tf.finetuning.task import CLASSIFICATION, REGRESSION, prefixed
from electra_tf.training import optimization

BACKENDS = ("tensorflow", "jax")
PORTABLE_FAMILIES = (CLASSIFICATION, REGRESSION)
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
        raise ValueError(f"fine-tuning on --backend {backend} supports the "
                         f"{' and '.join(PORTABLE_FAMILIES)} families; not {', '.join(refused)}: "
                         "use --backend tensorflow for them")


def shuffled_batches(table: Dict[str, np.ndarray], batch_size: int,
                     seed: int) -> Iterator[Dict[str, np.ndarray]]:
    """Endless batches of `table`: a seeded full shuffle each epoch (`np.random.default_rng((seed,
    epoch))`), full batches only (the table is padded to a multiple of the batch)."""
    n = len(table[TASK_ID])
    epoch = 0
    while True:
        order = np.random.default_rng((seed, epoch)).permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            rows = order[start:start + batch_size]
            yield {k: v[rows] for k, v in table.items()}
        epoch += 1


def train(model: FinetuningModel, optimizer, batches: Iterable[Dict[str, np.ndarray]],
          steps: int, task_names: List[str],
          on_chunk: Callable[[int, float], None], chunk: int) -> float:
    """Runs `steps` steps on `batches`; calls `on_chunk(done, mean loss)` every `chunk` steps
    (and at the end). Returns the last chunk's mean loss (summed over the batch, as trained).

    Args:
        model: built FinetuningModel.
        optimizer: built `AdamWeightDecay` (`runner.make_optimizer`).
        batches: iterator of {feature: numpy [batch, ...]} (`shuffled_batches`).
        steps: int.
        task_names: in task-id order.
        on_chunk: logging and the non-finite check (`runner.train`).
        chunk: int. Steps per report.
    """
    import jax

    def loss_fn(trainable, non_trainable, batch):
        outputs, non_trainable = model.stateless_call(trainable, non_trainable, batch,
                                                      training=True)
        return summed_loss(outputs, batch[TASK_ID], task_names), non_trainable

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state, batch):
        trainable, non_trainable, optimizer_vars = state
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, batch)
        clipped = optimization.dense_clip_by_global_norm(grads, optimization.CLIP_NORM)
        trainable, optimizer_vars = optimizer.stateless_apply(optimizer_vars, clipped.gradients,
                                                              trainable)
        return loss, (trainable, non_trainable, optimizer_vars)

    step = jax.jit(step, donate_argnums=0)
    batches = iter(batches)
    first = next(batches)
    _build(model, first)
    batches = itertools.chain([first], batches)
    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    done, total, in_chunk, loss = 0, 0.0, 0, float("nan")
    while done < steps:
        loss_value, state = step(state, next(batches))
        total += float(loss_value)  # synchronises: one step in flight, as TensorFlow's loop
        done += 1
        in_chunk += 1
        if in_chunk == chunk or done == steps:
            loss = total / in_chunk
            on_chunk(done, loss)
            total, in_chunk = 0.0, 0
    trainable, non_trainable, optimizer_vars = state
    for variable, value in zip(model.trainable_variables, trainable):
        variable.assign(value)
    for variable, value in zip(model.non_trainable_variables, non_trainable):
        variable.assign(value)
    for variable, value in zip(optimizer.variables, optimizer_vars):
        variable.assign(value)
    return loss


def _build(model: FinetuningModel, batch: Dict[str, np.ndarray]) -> None:
    """Marks the model built (its variables exist from construction; `stateless_call` wants a
    call first): one eval-mode call on a row of `batch` (no dropout draw, no state change)."""
    if not model.built:
        model({k: v[:1] for k, v in batch.items()}, training=False)


def predict(model: FinetuningModel, task_name: str, features: Dict[str, np.ndarray],
            batch_size: int) -> Dict[str, np.ndarray]:
    """The head outputs of one task over every record (eval mode), as `runner.predict`.

    Every batch is `batch_size` rows (the last one padded with copies of its first row and cut
    after), so the forward pass compiles once.
    """
    import jax

    features = prefixed(task_name, features)
    _build(model, {k: v[:1] for k, v in features.items()})
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    @jax.jit
    def forward(trainable, non_trainable, batch):
        with keras.StatelessScope(state_mapping=list(zip(
                model.trainable_variables + model.non_trainable_variables,
                trainable + non_trainable))):
            return model.task_outputs(batch, task_name, training=False)

    n = len(features["input_ids"])
    outputs: Dict[str, List[np.ndarray]] = {}
    for start in range(0, n, batch_size):
        batch = {k: v[start:start + batch_size] for k, v in features.items()}
        rows = len(batch["input_ids"])
        if rows < batch_size:
            batch = {k: np.concatenate([v, np.repeat(v[:1], batch_size - rows, axis=0)])
                     for k, v in batch.items()}
        for key, value in forward(trainable, non_trainable, batch).items():
            outputs.setdefault(key, []).append(np.asarray(value)[:rows])
    return {k: np.concatenate(v) for k, v in outputs.items()}


def weights_archive(model: FinetuningModel, path: str, meta: Optional[dict] = None) -> str:
    """Writes the fine-tuned model's weights as {variable path: array} (+ "meta" JSON) to the
    .npz `path` atomically; returns path. `export.export_weights` turns it into the SavedModel
    (TensorFlow)."""
    import json

    from electra_tf import atomic

    arrays = {v.path: np.asarray(keras.ops.convert_to_numpy(v.value)) for v in model.weights}
    arrays["meta"] = np.array(json.dumps(meta or {}))
    with atomic.atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    return path
