"""`ElectraPretrainer.compile()` / `fit()` / `evaluate()` on the JAX and PyTorch backends.

The same step as the TensorFlow path (`keras_fit` over `train_step`), written once in
`keras.ops` around the backend's own differentiation (JAX: `jax.value_and_grad` of the model's
`stateless_call`, inside Keras' jitted loop; PyTorch: autograd, eagerly):

1. the step seed is (run seed, optimizer step): the optimizer's `iterations` counter, so a
   restored optimizer resumes the draws exactly;
2. with `gradient_accumulation_steps` k > 1 the whole batch is masked first and the loss
   denominators of the whole step computed once (`ElectraPretrainer.mask`,
   `loss_weight_sums`), then the k micro-batches run one after the other (each example keeps
   its global index, so masks and samples are those of the unaccumulated step) and their
   gradients are summed;
3. the summed gradient is clipped at global norm 1.0 (official), then the optimizer applies it
   (AdamWeightDecay / Lamb: weight decay, schedule, one step counter tick);
4. the loss and the official metrics (`PretrainingMetrics`) see the whole batch.

So for the same seed, initial weights and batches the losses and weights equal the TensorFlow
path's up to float rounding (tests/training/test_backends_fit.py). On several devices, shard the
batch with `keras.distribution.DataParallel`: the step is one program over the global batch, so
its losses are the global batch's as they are (no per-replica contributions to add).

Evaluation batch i masks from `seeds.eval_seed(seed, i)`, i counted from the start of each
`evaluate()` (the TensorFlow path's stream).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List

import keras
from keras import ops

from electra_tf.modeling import rng
from electra_tf.pretraining import seeds
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

    def update_state(self):
        self.count.assign(self.count + 1)

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
    """

    metrics: PretrainingMetrics
    loss: keras.metrics.Mean
    eval_batches: _Counter
    accumulation_steps: int
    # Means of the step's loss terms and pre-clip gradient norm, never reported by fit() (the
    # official metrics of the same names are per-slot / per-sequence means): what the trainer
    # logs as the TensorFlow trainer's per-step `masked_lm_loss`, `disc_loss`, `grad_norm`.
    step_terms: Dict[str, keras.metrics.Mean] = dataclasses.field(default_factory=lambda: {
        key: keras.metrics.Mean(name=f"step_{key}") for key in STEP_TERMS})

    @property
    def all_metrics(self) -> List[keras.metrics.Metric]:
        return ([self.loss] + list(self.metrics.metrics) + [self.eval_batches]
                + list(self.step_terms.values()))

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


def compile_state(model, gradient_accumulation_steps: int,
                  disc_auc_include_padding: bool) -> FitState:
    """Builds the model, its optimizer and the metrics of `fit()` / `evaluate()`."""
    check_accumulation_steps(gradient_accumulation_steps)
    return FitState(build_for_fit(model, disc_auc_include_padding),
                    keras.metrics.Mean(name="loss"), _Counter(), gradient_accumulation_steps)


# --- The step's pieces, the same on both backends ------------------------------------------------
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


# --- JAX -----------------------------------------------------------------------------------------
def jax_train_step(model, fit: FitState, state, data):
    """Keras' JAX `train_step(state, data)` for the objective (see the module docstring)."""
    import jax

    trainable, non_trainable, optimizer_vars, metrics_vars = state
    optimizer = model.optimizer
    with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, optimizer_vars))):
        seed = train_seed(model)

    def loss_fn(trainable, non_trainable, micro, offset, denominators):
        outputs, non_trainable = model.stateless_call(
            trainable, non_trainable, micro, seed=seed, training=True, example_offset=offset,
            loss_denominators=denominators)
        loss = outputs["total_loss"]
        with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, optimizer_vars))):
            scaled = optimizer.scale_loss(loss)
        return scaled, (outputs, non_trainable)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    batches, denominators = micro_batches(model, features(data), seed, fit.accumulation_steps)
    grads, outputs = None, []
    for micro, offset in batches:
        (_, (out, non_trainable)), g = grad_fn(trainable, non_trainable, micro, offset,
                                               denominators)
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        outputs.append(out)
    clipped = optimization.clip_gradients(optimizer, grads, model.trainable_variables, CLIP_NORM)
    trainable, optimizer_vars = optimizer.stateless_apply(optimizer_vars, clipped.gradients,
                                                          trainable)
    merged = dict(merge_outputs(outputs), grad_norm=clipped.global_norm)
    logs, metrics_vars = _stateless_metrics(model, fit, metrics_vars, merged)
    return logs, (trainable, non_trainable, optimizer_vars, metrics_vars)


def jax_test_step(model, fit: FitState, state, data):
    """Keras' JAX `test_step(state, data)`: one evaluation batch."""
    trainable, non_trainable, metrics_vars = state
    with keras.StatelessScope(
            state_mapping=list(zip(model.metrics_variables, metrics_vars))) as scope:
        seed = seeds.eval_seed(model.seed, fit.eval_batches.result())
        fit.eval_batches.update_state()
        metrics_vars = _current(model.metrics_variables, scope)
    outputs, non_trainable = model.stateless_call(trainable, non_trainable, features(data),
                                                  seed=seed, training=False)
    logs, metrics_vars = _stateless_metrics(model, fit, metrics_vars, outputs)
    return logs, (trainable, non_trainable, metrics_vars)


def jax_train_function(model, fit: FitState, steps: int):
    """Keras' JAX `train_function(state, iterator)` with `steps` (k > 1) steps per compiled call.

    Keras' own `steps_per_execution` on JAX calls the jitted step k times from Python; this one
    compiles the k steps as one program: the k batches are stacked on the device and
    `jax.lax.scan` runs `jax_train_step` over them, carrying the whole state (weights, seed
    states, optimizer, metrics), so one call dispatches k steps and the metrics accumulate on
    the device; the reported results (`loss` and the official metrics, the 200-threshold AUC
    among them) are computed once per call, after the k-th step. The step is traced once (the
    scan's body), so compilation takes about as long as one step's.

    An iterator that runs out within a call (fewer than k batches left) runs the batches it gave
    one jitted step at a time (compiled once, when first needed): a call never takes more
    batches than fit()'s `steps_per_epoch` allows. Each step draws, updates and counts as a
    single step would (same seeds: the optimizer's step counter is carried), so k steps in one
    call give the weights and metrics of k calls (tests/training/test_multi_step.py).

    Args:
        model: the compiled `ElectraPretrainer`.
        fit: its FitState.
        steps: int k > 1.

    Returns:
        `iterator_step(state, iterator) -> (logs, state)`, as Keras' `make_train_function` sets.
    """
    import jax

    out_shardings = None
    if keras.distribution.distribution() is not None:
        # As Keras' own: the new state keeps the variables' layouts.
        out_shardings = (None, model._get_state_sharding_spec())

    def many(state, batches):
        stacked = jax.tree_util.tree_map(lambda *xs: jax.numpy.stack(xs), *batches)

        def body(carry, data):
            _, carry = model.train_step(carry, data)  # its logs are unused: XLA drops them
            return carry, None

        state, _ = jax.lax.scan(body, state, stacked)
        with keras.StatelessScope(state_mapping=list(zip(model.metrics_variables, state[3]))):
            logs = {m.name: m.result() for m in fit.reported}
        return logs, state

    many = jax.jit(many, donate_argnums=0, out_shardings=out_shardings)
    single = jax.jit(model.train_step, donate_argnums=0, out_shardings=out_shardings)

    def iterator_step(state, iterator):
        batches = []
        for _ in range(steps):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
        if not batches:
            raise StopIteration  # fit() ends the epoch (Keras catches it)
        if len(batches) == steps:
            return many(state, tuple(batches))
        for data in batches:
            logs, state = single(state, data)
        return logs, state

    return iterator_step


def _stateless_metrics(model, fit: FitState, metrics_vars, outputs):
    with keras.StatelessScope(
            state_mapping=list(zip(model.metrics_variables, metrics_vars))) as scope:
        logs = update_metrics(fit, outputs)
    return logs, _current(model.metrics_variables, scope)


def _current(variables, scope):
    values = []
    for variable in variables:
        value = scope.get_current_value(variable)
        values.append(variable.value if value is None else value)
    return values


# --- PyTorch ----------------------------------------------------------------------------------
def torch_train_step(model, fit: FitState, data):
    """Keras' PyTorch `train_step(data)` for the objective (see the module docstring)."""
    import torch

    optimizer = model.optimizer
    seed = train_seed(model)
    batches, denominators = micro_batches(model, features(data), seed, fit.accumulation_steps)
    model.zero_grad()
    outputs = []
    for micro, offset in batches:
        out = model(micro, seed=seed, training=True, example_offset=offset,
                    loss_denominators=denominators)
        # backward() adds into each weight's .grad: the micro-batches' gradients are summed.
        optimizer.scale_loss(out["total_loss"]).backward()
        outputs.append(out)
    variables = model.trainable_variables
    grads = [v.value.grad if v.value.grad is not None else torch.zeros_like(v.value)
             for v in variables]
    with torch.no_grad():
        clipped = optimization.clip_gradients(optimizer, grads, variables, CLIP_NORM)
        optimizer.apply(clipped.gradients, variables)
        merged = dict(merge_outputs(outputs), grad_norm=clipped.global_norm)
        return update_metrics(fit, _detached(merged))


def torch_test_step(model, fit: FitState, data):
    """Keras' PyTorch `test_step(data)`: one evaluation batch."""
    import torch

    with torch.no_grad():
        seed = seeds.eval_seed(model.seed, fit.eval_batches.result())
        fit.eval_batches.update_state()
        outputs = model(features(data), seed=seed, training=False)
        return update_metrics(fit, outputs)


def _detached(outputs):
    return keras.tree.map_structure(lambda t: t.detach() if hasattr(t, "detach") else t, outputs)
