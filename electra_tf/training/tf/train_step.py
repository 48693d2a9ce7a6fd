"""One training step and the compiled loops around it.

Read top-down: `make_train_loop` compiles a loop of steps; a step is either `step` (one replica
function: `forward_backward`, then `apply_or_skip`) or, when non-finite steps are skipped on
several replicas, `agreed_skip_step` (two replica functions with the decision between them).
`count_skipped` and `check_history` turn the loop's per-step values into warnings and errors;
`make_eval_loop` is the evaluation counterpart.

Every replica computes its contribution to the global-batch loss (see `ElectraPretrainer`), so
the optimizer's cross-replica gradient sum is the one-device gradient
(`optimization.apply_gradients`). Per-step randomness (masking, sampling) comes from the seed
(run seed, global step): a resumed run draws what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Callable, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from electra_tf.errors import TrainingError
from electra_tf.modeling import rng
from electra_tf.pretraining import seeds
from electra_tf.training import optimization, run_base
from electra_tf.training.tf import accumulation

logger = logging.getLogger("electra_tf")

# Per-step values summed over replicas (each replica holds its contribution); the others are
# the same on every replica.
SUMMED = ("total_loss", "masked_lm_loss", "disc_loss", "tokens", "skipped")
HISTORY_KEYS = SUMMED + ("grad_norm", "learning_rate")
LOSS_KEYS = ("total_loss", "masked_lm_loss", "disc_loss")


@dataclasses.dataclass(eq=False)
class StepContext:
    """What a step needs; built once per traced loop (`make_step_context`).

    Attributes:
        model: the ElectraPretrainer (or anything called like it).
        optimizer: the optimizer (maybe a LossScaleOptimizer).
        schedule: the learning-rate schedule (for the logged rate).
        metrics: PretrainingMetrics, updated with every applied step.
        strategy: the tf.distribute strategy.
        seed: int. The run seed; a step's seed is (seed, global step).
        skip_nonfinite: bool. Skip non-finite steps (`max_skipped_nonfinite_steps` > 0) instead
            of applying them (the loop then stops at the first one).
        replica_slice: local batch -> this replica's rows.
        forward_backward: (batch, seed) -> (outputs, gradients); maybe XLA-compiled, and over
            `gradient_accumulation_steps` micro-batches (`accumulation`) when that is > 1.
        gradient_slots: which variables receive a gradient, recorded when the agreed skip is
            traced (`compute_replica`) for its second phase (`apply_replica`).
        stop: optional `preemption.StopRequest`, read before every step (SIGTERM).
        sum_repeated_rows: bool. The clip's norm: True (default) sums an embedding gradient's
            rows of a repeated id first, as the official on TPU; False counts them apart, as the
            official on CPU/GPU (`official_gpu_clip_norm`).
    """

    model: object
    optimizer: keras.optimizers.Optimizer
    schedule: Callable
    metrics: object
    strategy: tf.distribute.Strategy
    seed: int
    skip_nonfinite: bool
    replica_slice: Callable
    forward_backward: Optional[Callable] = None
    gradient_slots: List[bool] = dataclasses.field(default_factory=list)
    stop: Optional[object] = None
    sum_repeated_rows: bool = True

    @property
    def variables(self):
        return self.model.trainable_variables

    @property
    def loss_scaled(self) -> bool:
        return isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)


def make_step_context(model, optimizer, schedule, metrics, strategy, config,
                      replica_slice: Callable, stop=None) -> StepContext:
    """A StepContext for `config` (seed, skipping, `jit_compile` of the forward-backward pass,
    `gradient_accumulation_steps`): a PretrainingConfig, or `keras_fit.FitSettings`."""
    ctx = StepContext(model, optimizer, schedule, metrics, strategy, config.seed,
                      config.max_skipped_nonfinite_steps > 0, replica_slice, stop=stop,
                      sum_repeated_rows=not getattr(config, "official_gpu_clip_norm", False))

    def compute(batch, seed, **call_kwargs):
        return forward_backward(ctx, batch, seed, **call_kwargs)

    ctx.forward_backward = tf.function(compute, jit_compile=True) if config.jit_compile else compute
    if config.gradient_accumulation_steps > 1:
        ctx.forward_backward = accumulation.accumulating(model, ctx.forward_backward,
                                                         config.gradient_accumulation_steps)
    return ctx


# --- The compiled loop -----------------------------------------------------------------------------
def make_train_loop(ctx: StepContext):
    """A tf.function `(iterator, num_steps) -> (done, history)` running up to num_steps steps.

    `history` maps HISTORY_KEYS to float32 [done] per-step values, reduced over replicas. The
    loop stops early after a step that diverged and was not skipped (`diverged`), and before a
    step once a stop is agreed (`ctx.stop`, SIGTERM; `done` may then be 0).
    """
    two_phase = ctx.skip_nonfinite and ctx.strategy.num_replicas_in_sync > 1
    run_step = agreed_skip_step if two_phase else step

    @tf.function
    def train_loop(iterator, num_steps):
        history = {k: tf.TensorArray(tf.float32, size=num_steps, element_shape=[])
                   for k in HISTORY_KEYS}
        done = tf.constant(0)
        for i in tf.range(num_steps):
            if ctx.stop is not None:
                if ctx.stop.agreed():
                    break
            values = run_step(ctx, next(iterator))
            # Reassign (not mutate) so autograph carries the arrays through the loop.
            history = {k: ta.write(i, values[k]) for k, ta in history.items()}
            done = i + 1
            if values["skipped"] == 0.0 and diverged(ctx, values["total_loss"], values["grad_norm"]):
                break
        return done, {k: ta.stack()[:done] for k, ta in history.items()}

    return train_loop


def step(ctx: StepContext, local_batch) -> Dict[str, tf.Tensor]:
    """One step in one replica function; the values reduced over replicas."""
    per_replica = ctx.strategy.run(functools.partial(apply_or_skip, ctx), args=(local_batch,))
    return reduce_values(ctx.strategy, per_replica)


# --- One replica's step ---------------------------------------------------------------------------
def replica_forward(ctx: StepContext, local_batch):
    """This replica's rows of the batch, the model outputs and the gradients."""
    batch = ctx.replica_slice(local_batch)
    seed = tf.stack([tf.constant(rng.int32_bits(ctx.seed), tf.int32),
                     tf.cast(ctx.optimizer.iterations, tf.int32)])
    outputs, grads = ctx.forward_backward(batch, seed)
    return batch, outputs, grads


def forward_backward(ctx: StepContext, batch, seed, **call_kwargs):
    """(model outputs, gradients of the total loss, or of the scaled loss under loss scaling)."""
    with tf.GradientTape() as tape:
        outputs = ctx.model(batch, seed=seed, training=True, **call_kwargs)
        loss = outputs["total_loss"]
        scaled = ctx.optimizer.scale_loss(loss) if ctx.loss_scaled else loss
    return outputs, tape.gradient(scaled, ctx.variables)


def apply_or_skip(ctx: StepContext, local_batch) -> Dict[str, tf.Tensor]:
    """Forward-backward, then the update; with `skip_nonfinite`, a bad batch changes neither
    the weights nor the optimizer (slots, step counter); the data iterator has moved past it."""
    batch, outputs, grads = replica_forward(ctx, local_batch)
    lr = ctx.schedule(ctx.optimizer.iterations)
    if not ctx.skip_nonfinite:
        grad_norm = apply(ctx, grads, outputs["metric_inputs"])
        skipped = tf.constant(0.0)
    else:
        bad = nonfinite(ctx, outputs, grads)
        grad_norm = tf.cond(bad, lambda: tf.constant(float("nan")),
                            lambda: apply(ctx, grads, outputs["metric_inputs"]))
        skipped = tf.cast(bad, tf.float32)
    return step_values(outputs, batch, grad_norm, lr, skipped)


def apply(ctx: StepContext, grads, metric_inputs) -> tf.Tensor:
    """Applies the gradients (summed over replicas, clipped) and counts the step's metrics;
    returns the gradient norm before clipping."""
    norm = optimization.apply_gradients(ctx.optimizer, grads, ctx.variables,
                                        sum_repeated_rows=ctx.sum_repeated_rows)
    ctx.metrics.update_state(metric_inputs)
    return norm


def nonfinite(ctx: StepContext, outputs, grads) -> tf.Tensor:
    return diverged(ctx, outputs["total_loss"],
                    tf.linalg.global_norm([g for g in grads if g is not None]))


def diverged(ctx: StepContext, loss, grad_norm) -> tf.Tensor:
    """A non-finite loss, or gradient norm: the clipped update would be NaN (the weights lost
    even though the loss was finite), except under loss scaling, where the LossScaleOptimizer
    skips such a step and lowers the scale."""
    bad = tf.logical_not(tf.math.is_finite(loss))
    if not ctx.loss_scaled:
        bad = tf.logical_or(bad, tf.logical_not(tf.math.is_finite(grad_norm)))
    return bad


def step_values(outputs, batch, grad_norm, lr, skipped) -> Dict[str, tf.Tensor]:
    tokens = tf.reduce_sum(tf.cast(batch["input_mask"], tf.float32))
    return {"total_loss": outputs["total_loss"], "masked_lm_loss": outputs["masked_lm_loss"],
            "disc_loss": outputs["disc_loss"], "tokens": tokens, "grad_norm": grad_norm,
            "learning_rate": tf.cast(lr, tf.float32), "skipped": skipped}


def reduce_values(strategy: tf.distribute.Strategy, per_replica) -> Dict[str, tf.Tensor]:
    return {k: strategy.reduce(tf.distribute.ReduceOp.SUM if k in SUMMED
                               else tf.distribute.ReduceOp.MEAN, v, axis=None)
            for k, v in per_replica.items()}


# --- Skipping with several replicas ---------------------------------------------------------------
# Every replica must take the same branch, and a synchronisation point (the gradient sum) may not
# sit inside control flow in a replica function. So the step runs in two replica functions with
# the decision between them, in cross-replica context: skip when any replica's loss or gradient
# is bad (its NaN would reach every replica through the gradient sum).
def agreed_skip_step(ctx: StepContext, local_batch) -> Dict[str, tf.Tensor]:
    strategy = ctx.strategy
    per_replica, metric_inputs, present, bad = strategy.run(functools.partial(compute_replica, ctx),
                                                            args=(local_batch,))
    any_bad = strategy.reduce(tf.distribute.ReduceOp.SUM, bad, axis=None) > 0
    values = reduce_values(strategy, per_replica)
    values["grad_norm"] = tf.cond(
        any_bad, lambda: tf.constant(float("nan")),
        lambda: strategy.reduce(tf.distribute.ReduceOp.MEAN,
                                strategy.run(functools.partial(apply_replica, ctx),
                                             args=(metric_inputs, present)),
                                axis=None))
    values["skipped"] = tf.cast(any_bad, tf.float32)
    return values


def compute_replica(ctx: StepContext, local_batch):
    """Phase 1: forward-backward; the gradients that exist (which ones is known when traced)."""
    batch, outputs, grads = replica_forward(ctx, local_batch)
    ctx.gradient_slots[:] = [g is not None for g in grads]
    present = [g for g in grads if g is not None]
    bad = tf.cast(nonfinite(ctx, outputs, grads), tf.float32)
    values = step_values(outputs, batch, tf.constant(0.0), ctx.schedule(ctx.optimizer.iterations),
                         tf.constant(0.0))
    return values, outputs["metric_inputs"], present, bad


def apply_replica(ctx: StepContext, metric_inputs, present) -> tf.Tensor:
    """Phase 2 (only when every replica's step was finite): the update."""
    remaining = iter(present)
    grads = [next(remaining) if slot else None for slot in ctx.gradient_slots]
    return apply(ctx, grads, metric_inputs)


# --- After a loop ---------------------------------------------------------------------------------
def count_skipped(history: Dict[str, np.ndarray], first_step: int, skipped_before: int,
                  limit: int) -> int:
    """Logs each step the loop skipped; returns the steps skipped in this process so far.

    Args:
        history: the loop's per-step values (numpy).
        first_step: int. Global step of the loop's first step.
        skipped_before: int. Steps skipped earlier in this process.
        limit: int. `max_skipped_nonfinite_steps`, for the message.
    """
    skipped = skipped_before
    for index in np.flatnonzero(history["skipped"]):
        skipped += 1
        terms = ", ".join(f"{k}={float(history[k][index])}" for k in LOSS_KEYS
                          if not math.isfinite(float(history[k][index])))
        logger.warning("non-finite step at step %d (%s): batch skipped, no update applied "
                       "(%d of at most %d skipped)",
                       first_step + int(np.sum(history["skipped"][:index] == 0)),
                       terms or "gradient norm", skipped, limit)
    return skipped


def check_history(history: Dict[str, np.ndarray], first_step: int, skipped: int, limit: int,
                  loss_scaled: bool, last_good: str) -> None:
    """Raises TrainingError for a run that diverged (nothing is saved then).

    Args:
        history: the loop's per-step values (numpy).
        first_step: int. Global step of the loop's first step.
        skipped: int. Steps skipped in this process (`count_skipped`).
        limit: int. `max_skipped_nonfinite_steps`.
        loss_scaled: bool. Under loss scaling a non-finite gradient norm is the optimizer's
            business (it skips the update and lowers the scale).
        last_good: str. The latest checkpoint, named in the errors.

    Raises:
        TrainingError: more than `limit` steps skipped, or the last step's loss (or gradient
            norm) is not finite and it was not skipped.
    """
    run_base.check_skipped(skipped, limit, last_good)
    if history["skipped"].size and history["skipped"][-1]:
        return  # skipped, not applied
    names = list(LOSS_KEYS) + ([] if loss_scaled else ["grad_norm"])
    bad = [k for k in names if not math.isfinite(float(history[k][-1]))]
    if bad:
        last_step = first_step + len(history["skipped"]) - 1
        values = ", ".join(f"{k}={float(history[k][-1])}" for k in bad)
        raise TrainingError(
            f"non-finite {'loss' if bad[0] == 'total_loss' else bad[0]} at step {last_step} "
            f"({values}). Training stopped without saving; the last good checkpoint is {last_good}")


# --- Evaluation ------------------------------------------------------------------------------------
def eval_step(model, metrics, seed: int, batch, index) -> tf.Tensor:
    """One evaluation batch in a replica: updates `metrics`, returns this replica's
    contribution to the batch's total loss."""
    # Eval masks come from their own seed stream, keyed by the batch index (`seeds.eval_seed`):
    # the same checkpoint always gives the same results.
    step_seed = seeds.eval_seed(seed, index)
    outputs = model(batch, seed=step_seed, training=False)
    metrics.update_state(outputs["metric_inputs"])
    return outputs["total_loss"]


def make_eval_loop(model, metrics, strategy: tf.distribute.Strategy, seed: int, stop=None):
    """A tf.function `(iterator, num_steps) -> mean total loss` that also updates `metrics`.

    With `stop` (a `preemption.StopRequest`, SIGTERM) the loop reads it before every batch and
    ends early once a stop is agreed (the caller checks `stop.requested`; the loss is then
    meaningless).
    """
    eval_fn = functools.partial(eval_step, model, metrics, seed)

    @tf.function
    def eval_loop(iterator, num_steps):
        total = tf.constant(0.0)
        for i in tf.range(num_steps):
            if stop is not None:
                if stop.agreed():
                    break
            per_replica = strategy.run(eval_fn, args=(next(iterator), i))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total / tf.cast(num_steps, tf.float32)

    return eval_loop
