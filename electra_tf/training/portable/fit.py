"""`ElectraPretrainer.compile()` / `fit()` / `evaluate()` on the JAX and PyTorch backends.

The same step as the TensorFlow path (`keras_fit` over `train_step`), written once from the
backend-neutral pieces (`step_pieces`) around the backend's own differentiation (JAX: `jax.value_and_grad` of the model's
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
4. the loss and the official metrics (`PretrainingMetrics`) see the whole batch;
5. with `compile(skip_nonfinite=True)` (the run's `max_skipped_nonfinite_steps`), a step whose
   loss or gradient norm is not finite applies no update and no metrics and is counted
   (`FitState.skipped`), as TensorFlow's `train_step.apply_or_skip`: on JAX inside the compiled
   step (`jnp.where` of the old and new state, so a scan of k steps skips as k calls would).

So for the same seed, initial weights and batches the losses and weights equal the TensorFlow
path's up to float rounding (tests/training/test_backends_fit.py). On several devices, shard the
batch with `keras.distribution.DataParallel`: the step is one program over the global batch, so
its losses are the global batch's as they are (no per-replica contributions to add).

Evaluation batch i masks from `seeds.eval_seed(seed, i)`, i counted from the start of each
`evaluate()` (the TensorFlow path's stream).
"""

from __future__ import annotations

import keras

from electra_tf.pretraining import seeds
from electra_tf.training import optimization
from electra_tf.training.step_pieces import (CLIP_NORM, FitState, features, merge_outputs,
                                             micro_batches, nonfinite, train_seed,
                                             update_metrics)

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
    new_trainable, new_optimizer_vars = optimizer.stateless_apply(
        optimizer_vars, clipped.gradients, trainable)
    merged = dict(merge_outputs(outputs), grad_norm=clipped.global_norm)
    logs, new_metrics_vars = _stateless_metrics(model, fit, metrics_vars, merged)
    if not fit.skip_nonfinite:
        return logs, (new_trainable, non_trainable, new_optimizer_vars, new_metrics_vars)
    # A non-finite step keeps the old weights, optimizer (slots, step counter) and metrics,
    # selected inside the compiled step (the scan's body too), and counts itself; the dropout
    # seed states move on, as TensorFlow's (the forward pass ran).
    bad = nonfinite(merged, clipped.global_norm)

    def keep_old(new, old):
        return [jax.numpy.where(bad, o, n) for n, o in zip(new, old)]

    trainable = keep_old(new_trainable, trainable)
    optimizer_vars = keep_old(new_optimizer_vars, optimizer_vars)
    with keras.StatelessScope(state_mapping=list(zip(
            model.metrics_variables, keep_old(new_metrics_vars, metrics_vars)))) as scope:
        fit.skipped.update_state(bad)
        logs = {m.name: m.result() for m in fit.reported}
        metrics_vars = _current(model.metrics_variables, scope)
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
        merged = dict(merge_outputs(outputs), grad_norm=clipped.global_norm)
        # A non-finite step: no update, no metrics, counted (the one read of the device per
        # step this costs is paid only with skipping on).
        if fit.skip_nonfinite and bool(nonfinite(merged, clipped.global_norm)):
            fit.skipped.update_state()
            return {m.name: m.result() for m in fit.reported}
        optimizer.apply(clipped.gradients, variables)
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
