"""The pieces of the pretraining step that every backend's `fit()` shares (backend-neutral).

`ElectraPretrainer.compile()` builds a `FitState` (`compile_state`) on every backend; the JAX and
PyTorch steps (`portable_fit`) are written from the pieces below, and the TensorFlow step
(`keras_fit` over `train_step`) uses the same accumulation check and metrics:

- `features`: the objective's inputs out of Keras' (x,) / (x, y, sample_weight) tuples;
- `train_seed`: the step seed, (run seed, optimizer step);
- `micro_batches`: with gradient accumulation, the whole batch masked once and split, with the
  loss denominators of the whole step;
- `merge_outputs`: one step's outputs from its micro-batches';
- `update_metrics`: the loss, the step terms and the official metrics of one step;
- `nonfinite`: whether a step is skipped (`max_skipped_nonfinite_steps`), as TensorFlow's.

Nothing here imports a backend: `keras.ops` only.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List

import keras
from keras import ops

from electra_tf.modeling import rng
from electra_tf.pretraining.metrics import PretrainingMetrics
from electra_tf.training import optimization

CLIP_NORM = optimization.CLIP_NORM  # the official global-norm clip
LOSS_KEYS = ("total_loss", "masked_lm_loss", "disc_loss")
STEP_TERMS = ("masked_lm_loss", "disc_loss", "grad_norm")


class _Counter(keras.metrics.Metric):
    """A step counter kept among the metric variables (so JAX carries it through its state),
    reset with them; never reported."""

    def __init__(self, name="eval_batches"):
        super().__init__(name=name)
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="int32",
                                       name="count")

    def update_state(self, increment=1):
        self.count.assign(self.count + ops.cast(increment, "int32"))

    def result(self):
        return self.count.value


@dataclasses.dataclass(eq=False)
class FitState:
    """What `compile()` sets up for `fit()` / `evaluate()` on JAX and PyTorch.

    Attributes:
        metrics: PretrainingMetrics (official names).
        loss: keras.metrics.Mean, the total loss per step.
        eval_batches: the index of the next evaluation batch (its seed).
        accumulation_steps: int k.
        skip_nonfinite: bool. A step whose loss or gradient norm is not finite changes neither
            the weights, the optimizer (slots, step counter) nor the metrics; it is counted in
            `skipped` (the run's `max_skipped_nonfinite_steps` > 0).
        skipped: the steps skipped since the metrics' last reset (one `fit()` call).
    """

    metrics: PretrainingMetrics
    loss: keras.metrics.Mean
    eval_batches: _Counter
    accumulation_steps: int
    skip_nonfinite: bool = False
    skipped: _Counter = dataclasses.field(default_factory=lambda: _Counter("skipped_steps"))
    # Means of the step's loss terms and pre-clip gradient norm, never reported by fit() (the
    # official metrics of the same names are per-slot / per-sequence means): what the trainer
    # logs as the TensorFlow trainer's per-step `masked_lm_loss`, `disc_loss`, `grad_norm`.
    step_terms: Dict[str, keras.metrics.Mean] = dataclasses.field(default_factory=lambda: {
        key: keras.metrics.Mean(name=f"step_{key}") for key in STEP_TERMS})

    @property
    def all_metrics(self) -> List[keras.metrics.Metric]:
        return ([self.loss] + list(self.metrics.metrics) + [self.eval_batches]
                + list(self.step_terms.values()) + [self.skipped])

    @property
    def reported(self) -> List[keras.metrics.Metric]:
        return [self.loss] + list(self.metrics.metrics)


def check_accumulation_steps(gradient_accumulation_steps: int) -> None:
    """Raises ValueError unless k >= 1 (compile()'s `gradient_accumulation_steps`)."""
    if gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1, got "
                         f"{gradient_accumulation_steps}")


def build_for_fit(model, disc_auc_include_padding: bool) -> PretrainingMetrics:
    """Builds the model and its optimizer (on every backend; under a tf.distribute strategy,
    call it in the strategy's scope) and returns the official metrics of `fit()`. A decoupled
    optimizer is given the model's `generator_variables()` unless it has them."""
    if not model.built:
        model.build_from_sequence_length()
    inner = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    if getattr(inner, "decoupled", False) and not inner.generator_variables_known:
        inner.set_generator_variables(model.generator_variables())  # decoupled optimizers
    model.optimizer.build(model.trainable_variables)
    return PretrainingMetrics(electra_objective=model.electra_objective,
                              disc_auc_include_padding=disc_auc_include_padding,
                              disc_weight=model.disc_weight)


def compile_state(model, gradient_accumulation_steps: int, disc_auc_include_padding: bool,
                  skip_nonfinite: bool = False) -> FitState:
    """Builds the model, its optimizer and the metrics of `fit()` / `evaluate()`."""
    check_accumulation_steps(gradient_accumulation_steps)
    return FitState(build_for_fit(model, disc_auc_include_padding),
                    keras.metrics.Mean(name="loss"), _Counter(), gradient_accumulation_steps,
                    skip_nonfinite)


# --- The step's pieces, the same on every backend ----------------------------------------------
def features(data):
    """Keras passes (x,) or (x, y, sample_weight) tuples through; the objective needs x only."""
    return data[0] if isinstance(data, (tuple, list)) else data


def train_seed(model):
    return ops.stack([ops.convert_to_tensor(rng.int32_bits(model.seed), "int32"),
                      ops.cast(model.optimizer.iterations, "int32")])


def micro_batches(model, batch, seed, steps: int):
    """[(micro-batch, example offset)] and the loss denominators of the whole step (None
    without accumulation: the model masks the batch itself)."""
    if steps == 1:
        return [(batch, 0)], None
    size = batch["input_ids"].shape[0]
    if size % steps:
        raise ValueError(f"gradient_accumulation_steps={steps} does not divide the batch of "
                         f"{size} rows")
    masked = model.mask(batch, seed=seed, example_offset=0)
    denominators = model.loss_weight_sums(masked)
    size //= steps
    return ([({k: v[j * size:(j + 1) * size] for k, v in masked.items()}, j * size)
             for j in range(steps)], denominators)


def merge_outputs(outputs: List[Dict]) -> Dict:
    """One step's outputs from its micro-batches': losses summed, metric inputs concatenated."""
    if len(outputs) == 1:
        return outputs[0]
    merged = {k: sum(o[k] for o in outputs) for k in LOSS_KEYS}
    merged["metric_inputs"] = {
        k: ops.concatenate([o["metric_inputs"][k] for o in outputs], axis=0)
        for k in outputs[0]["metric_inputs"]}
    return merged


def update_metrics(state: FitState, outputs: Dict) -> Dict:
    state.loss.update_state(outputs["total_loss"])
    for key, mean in state.step_terms.items():
        if key in outputs:
            mean.update_state(outputs[key])
    state.metrics.update_state(outputs["metric_inputs"])
    return {m.name: m.result() for m in state.reported}


def nonfinite(outputs: Dict, grad_norm):
    """Whether a step is skipped: a non-finite loss or gradient norm (the clipped update would
    be NaN even when the loss is finite), as TensorFlow's `train_step.diverged` without loss
    scaling (these backends do not scale the loss). Returns a bool scalar tensor."""
    return ops.logical_not(ops.logical_and(ops.all(ops.isfinite(outputs["total_loss"])),
                                           ops.all(ops.isfinite(grad_norm))))
