"""Optimisation exactly as the official `model/optimization.py` (parity items 30-32).

* `WarmupPolynomialDecay`: lr(t) = lr0 * (1 - min(t, T)/T)^power * min(1, t/W). The warmup factor
  MULTIPLIES the decay (it is not BERT's switch-over schedule), so lr(0) = 0 and the first update
  leaves the weights unchanged while Adam's moments still move.
* The optimizers (`AdamWeightDecay`, `Lamb`) are in `optimizers.py`.
* `clip_by_global_norm`: one joint norm over ALL gradients (generator and discriminator).
* `apply_gradients`: the training-step helper. It sums the gradients across replicas, clips the SUM
  and applies it, so a distributed step at a given global batch matches one device.
* `create_optimizer`: builds the optimizer and schedule from a `PretrainingConfig`.

Backends: the schedule, the optimizers, the clip and `apply_gradients` run on TensorFlow, JAX and
PyTorch. On TensorFlow, gradients may be IndexedSlices and steps may run under tf.distribute, so the
clip, the norm and the cross-replica sum go through `tf_update` (tf.clip_by_global_norm, the kernels
TensorFlow always ran). On JAX and PyTorch the gradients are dense arrays, clipped in keras.ops by
`dense_clip_by_global_norm`, the same formula (tested against tf.clip_by_global_norm). TensorFlow is
imported only on the TensorFlow backend.

Distributed use (TensorFlow): Keras 3's TF optimizer, when `apply()` runs in a replica context, first sums the
gradients across replicas (`TFOptimizer._backend_update_step` -> `_all_reduce_sum_gradients`) and
then updates every replica's copy of each variable. Its own `global_clipnorm` runs before that sum,
so it clips each replica's partial gradient, which is not the official semantics. `apply_gradients`
therefore all-reduces the gradients itself, clips the summed gradient, and calls `optimizer.apply()`
inside a scope that tells the project optimizers to skip their own (now redundant) summation.
"""

from __future__ import annotations

import contextlib
from typing import Any, List, NamedTuple, Optional, Sequence

import keras
from keras import ops

from electra_tf.training.optimizers import (AdamWeightDecay, DecoupledWeightDecayOptimizer, Lamb,
                                            LrMultipliers)

if keras.backend.backend() == "tensorflow":
    from electra_tf.training.tf import update as tf_update
else:
    tf_update = None  # JAX / PyTorch: dense gradients, no tf.distribute

# create_optimizer(): tf.clip_by_global_norm(grads, clip_norm=1.0) (official).
CLIP_NORM = 1.0
OPTIMIZER_NAMES = ("adamw", "lamb")


# ------------------------------------------------------------------------------------------------
# Learning-rate schedule
# ------------------------------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="electra_tf")
class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """The official learning rate: polynomial decay to 0 times a linear warmup factor.

    lr(t) = learning_rate * (1 - min(t, T)/T)^lr_decay_power * min(1, t/W), with
    T = num_train_steps and W = max(num_warmup_steps, warmup_proportion * T).

    The warmup factor multiplies the decay from step 0 (at t = W the rate is already
    learning_rate * (1 - W/T)), exactly as the official `create_optimizer`. With W = 0 the official
    code computes 0/0 = NaN at t = 0 (a latent bug); here W = 0 means "no warmup" (factor 1).

    Args:
        learning_rate: float. Peak rate lr0 (official `learning_rate`, 5e-4 for pretraining).
        num_train_steps: int. Decay horizon T; the rate is 0 from step T on.
        num_warmup_steps: int. Warmup length in steps (official `num_warmup_steps`).
        warmup_proportion: float. Warmup as a fraction of T (official fine-tuning uses 0.1); the
            longer of the two warmups wins, as in the official.
        lr_decay_power: float. Polynomial power (1.0 = linear).
    """

    def __init__(self, learning_rate: float, num_train_steps: int, num_warmup_steps: int = 0,
                 warmup_proportion: float = 0.0, lr_decay_power: float = 1.0):
        if learning_rate < 0:
            raise ValueError(f"learning_rate must be >= 0, got {learning_rate}")
        if num_train_steps < 1:
            raise ValueError(f"num_train_steps must be >= 1, got {num_train_steps}")
        if num_warmup_steps < 0:
            raise ValueError(f"num_warmup_steps must be >= 0, got {num_warmup_steps}")
        if warmup_proportion < 0:
            raise ValueError(f"warmup_proportion must be >= 0, got {warmup_proportion}")
        if lr_decay_power < 0:
            raise ValueError(f"lr_decay_power must be >= 0, got {lr_decay_power}")
        self.learning_rate = learning_rate
        self.num_train_steps = num_train_steps
        self.num_warmup_steps = num_warmup_steps
        self.warmup_proportion = warmup_proportion
        self.lr_decay_power = lr_decay_power

    @property
    def warmup_steps(self) -> float:
        """The effective warmup length W = max(num_warmup_steps, warmup_proportion * T)."""
        return float(max(self.num_warmup_steps, self.warmup_proportion * self.num_train_steps))

    def __call__(self, step):
        """Returns the learning rate (float32 scalar) at `step` (the number of updates applied)."""
        with keras.name_scope("warmup_polynomial_decay"):
            step = ops.cast(step, "float32")
            total = float(self.num_train_steps)
            remaining = ops.subtract(1.0, ops.divide(ops.minimum(step, total), total))
            lr = ops.multiply(self.learning_rate,
                              ops.power(remaining, float(self.lr_decay_power)))
            if self.warmup_steps > 0:
                lr = ops.multiply(lr, ops.minimum(1.0, ops.divide(step, self.warmup_steps)))
            return lr

    def get_config(self) -> dict:
        return {
            "learning_rate": self.learning_rate,
            "num_train_steps": self.num_train_steps,
            "num_warmup_steps": self.num_warmup_steps,
            "warmup_proportion": self.warmup_proportion,
            "lr_decay_power": self.lr_decay_power,
        }


# ------------------------------------------------------------------------------------------------
# Gradient clipping and the training-step helper
# ------------------------------------------------------------------------------------------------
class ClippedGradients(NamedTuple):
    """Result of `clip_by_global_norm`.

    Attributes:
        gradients: list, the clipped gradients (None kept as None; on TensorFlow, IndexedSlices
            kept as IndexedSlices with unique indices).
        global_norm: float32 scalar, the joint norm BEFORE clipping.
    """

    gradients: List[Any]
    global_norm: Any


def clip_by_global_norm(grads: Sequence, clip_norm: float = CLIP_NORM,
                        sum_repeated_rows: bool = True) -> ClippedGradients:
    """Scales all gradients jointly so their global norm is at most `clip_norm` (parity item 32).

    g <- g * clip_norm / max(global_norm, clip_norm), with global_norm = sqrt(sum_i ||g_i||^2)
    over every non-None gradient, as the official `tf.clip_by_global_norm(grads, 1.0)`. A
    non-finite norm makes every gradient NaN (tf.clip_by_global_norm's behaviour), so a diverged
    step is visible rather than silently rescaled.

    On TensorFlow an embedding's IndexedSlices gradient has its repeated rows summed first
    (`tf_update`), then `tf.clip_by_global_norm` clips; JAX and PyTorch give the embedding a
    dense gradient, which is that summed gradient already, and `dense_clip_by_global_norm`
    applies the same formula.

    Args:
        grads: list of gradients, each a Tensor, an IndexedSlices (embedding lookups, TensorFlow)
            or None (a variable that does not reach the loss, e.g. an unused head).
        clip_norm: float > 0.
        sum_repeated_rows: bool. An IndexedSlices' rows of a repeated index are summed before
            the norm (the gradient's true norm: the official TPU path, the default). False: its
            rows enter the norm as they are, one per lookup (the official CPU/GPU path,
            `use_tpu=False`; a larger or smaller norm when ids repeat). The clipped gradients
            are the same sums of rows either way; only the scale differs. TensorFlow only.

    Returns:
        ClippedGradients(gradients, global_norm).

    Raises:
        ValueError: clip_norm <= 0, or sum_repeated_rows=False off TensorFlow.
    """
    if clip_norm is None or clip_norm <= 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if tf_update is not None:
        return ClippedGradients(*tf_update.clip_by_global_norm(grads, clip_norm,
                                                               sum_repeated_rows))
    _check_rows_summed(sum_repeated_rows)
    return dense_clip_by_global_norm(grads, clip_norm)


def dense_clip_by_global_norm(grads: Sequence, clip_norm: float = CLIP_NORM) -> ClippedGradients:
    """`clip_by_global_norm` for dense gradients in keras.ops (the JAX and PyTorch clip).

    tf.clip_by_global_norm's formula: scale = clip_norm * min(1 / norm, 1 / clip_norm), i.e.
    clip_norm / max(norm, clip_norm) for a finite norm, plus (norm - norm), which is 0 for a
    finite norm and NaN otherwise (a diverged step shows as NaN, as on TensorFlow).

    Args:
        grads: list of dense gradients (arrays or tensors of any backend) or None.
        clip_norm: float > 0.

    Returns:
        ClippedGradients(gradients, global_norm).
    """
    norm = _dense_global_norm(grads)
    scale = ops.multiply(clip_norm, ops.minimum(ops.divide(1.0, norm), 1.0 / clip_norm))
    scale = ops.add(scale, ops.subtract(norm, norm))
    return ClippedGradients([None if g is None else ops.multiply(g, ops.cast(scale, g.dtype))
                             for g in grads], norm)


def clip_gradients(optimizer: keras.optimizers.Optimizer, grads: Sequence, variables: Sequence,
                   clip_norm: float = CLIP_NORM, sum_repeated_rows: bool = True) -> ClippedGradients:
    """The official clip (`clip_by_global_norm` over all gradients), or, under decoupled
    optimizers, one clip per side: the generator's gradients by their own global norm, the
    discriminator's by theirs, as two optimizers each clipping their own.

    Args:
        optimizer: the optimizer (maybe a LossScaleOptimizer) whose sides to clip by.
        grads: list of gradients matching `variables` (None allowed).
        variables: list of the model variables.
        clip_norm, sum_repeated_rows: see `clip_by_global_norm`.

    Returns:
        ClippedGradients; `global_norm` is the norm of all gradients before clipping (the
        official one), sqrt(generator norm^2 + discriminator norm^2) when decoupled.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not getattr(inner, "decoupled", False):
        return clip_by_global_norm(grads, clip_norm, sum_repeated_rows)
    generator = [inner.is_generator_variable(v) for v in variables]
    clipped, squares = list(grads), []
    for side in (True, False):
        indices = [i for i, g in enumerate(grads) if g is not None and generator[i] == side]
        if not indices:
            continue
        part = clip_by_global_norm([grads[i] for i in indices], clip_norm, sum_repeated_rows)
        for i, g in zip(indices, part.gradients):
            clipped[i] = g
        squares.append(ops.square(ops.cast(part.global_norm, "float32")))
    return ClippedGradients(clipped, ops.sqrt(ops.sum(ops.stack(squares))))


def _dense_global_norm(grads: Sequence):
    squares = [ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads if g is not None]
    if not squares:
        return ops.convert_to_tensor(0.0, "float32")
    return ops.sqrt(ops.sum(ops.stack(squares)))


def _check_rows_summed(sum_repeated_rows: bool) -> None:
    if not sum_repeated_rows:
        raise ValueError(f"sum_repeated_rows=False needs TensorFlow's IndexedSlices gradients; "
                         f"on {keras.backend.backend()} an embedding's gradient is dense, its "
                         "repeated rows already summed")


def _global_norm(grads: Sequence, sum_repeated_rows: bool = True):
    if tf_update is not None:
        return tf_update.global_norm(grads, sum_repeated_rows)
    _check_rows_summed(sum_repeated_rows)
    return _dense_global_norm(grads)


def _scale(grad, factor):
    if tf_update is not None:
        return tf_update.scale(grad, factor)  # IndexedSlices too
    return None if grad is None else ops.multiply(grad, ops.cast(factor, grad.dtype))


def apply_gradients(optimizer: keras.optimizers.Optimizer, grads: Sequence, variables: Sequence,
                    clip_norm: Optional[float] = CLIP_NORM,
                    sum_repeated_rows: bool = True):
    """Sums gradients across replicas, clips the sum by global norm, applies it. One train step.

    Call it where the gradients were computed: inside `strategy.run` (replica context) or with no
    strategy at all (JAX and PyTorch: no strategy, one global gradient). Each replica's loss must be its CONTRIBUTION to the global loss (e.g. summed
    per-example losses divided by the global batch size), so that the cross-replica sum of the
    gradients is the gradient of the global loss. The clip then sees the same global gradient as
    one device with the whole batch, and so does the update (official: clip over all variables
    jointly, then apply).

    With a `keras.optimizers.LossScaleOptimizer` (mixed_float16), pass the gradients of the SCALED
    loss: they are unscaled before clipping and re-scaled by the same power of two (exactly) for
    the wrapper, which skips the step and lowers the scale when they are not finite.

    Args:
        optimizer: an `AdamWeightDecay` / `Lamb` (or a LossScaleOptimizer wrapping one), built on
            all trainable variables under the strategy scope: `optimizer.build(variables)`.
            With a single replica any Keras optimizer works.
        grads: list of gradients matching `variables`; None for variables outside the loss.
        variables: list of the trainable variables.
        clip_norm: float, or None to skip clipping (the norm is still returned).
        sum_repeated_rows: bool. See `clip_by_global_norm` (False: the official CPU/GPU norm).

    Returns:
        float32 scalar: the global norm of the summed, unscaled gradients before clipping
        (identical on every replica).
    """
    grads = list(grads)
    variables = list(variables)
    replica_context = _check_can_apply(optimizer, grads, variables)
    num_replicas = 1 if replica_context is None else replica_context.num_replicas_in_sync
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    inner = optimizer.inner_optimizer if loss_scaled else optimizer
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        raise ValueError("apply_gradients: every gradient is None (no variable reaches the loss)")
    if num_replicas > 1:
        summed = tf_update.all_reduce_sum(replica_context, [grads[i] for i in present])
        for i, g in zip(present, summed):
            grads[i] = g
    if loss_scaled:
        scale = ops.convert_to_tensor(optimizer.dynamic_scale)
        grads = [_scale(g, 1.0 / scale) for g in grads]
    if clip_norm is None:
        norm = _global_norm(grads, sum_repeated_rows)
    else:
        grads, norm = clip_gradients(optimizer, grads, variables, clip_norm, sum_repeated_rows)
    if loss_scaled:
        grads = [_scale(g, scale) for g in grads]  # exact: the scale is a power of two

    # Only variables with a gradient are passed: Keras would otherwise warn on every trace.
    context = (inner._gradients_summed_across_replicas()
               if isinstance(inner, DecoupledWeightDecayOptimizer) else contextlib.nullcontext())
    with context:
        optimizer.apply([grads[i] for i in present], [variables[i] for i in present])
    return norm


def _check_can_apply(optimizer: keras.optimizers.Optimizer, grads: List, variables: List):
    """The replica context `apply_gradients` runs in (None off TensorFlow); builds a
    single-device optimizer if needed.

    Raises:
        ValueError, RuntimeError, TypeError: a call that cannot give the official update.
    """
    if len(grads) != len(variables):
        raise ValueError(f"apply_gradients: {len(grads)} gradients for {len(variables)} variables")
    replica_context = None if tf_update is None else tf_update.replica_context()
    num_replicas = 1 if replica_context is None else replica_context.num_replicas_in_sync
    inner = (optimizer.inner_optimizer
             if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer)
    if num_replicas > 1 and not isinstance(inner, DecoupledWeightDecayOptimizer):
        raise TypeError(f"apply_gradients under {num_replicas} replicas needs an AdamWeightDecay "
                        f"or Lamb optimizer (got {type(inner).__name__}), which can skip "
                        "Keras' second cross-replica sum")
    if not optimizer.built:
        if num_replicas > 1:
            raise ValueError("build the optimizer before the first distributed step: "
                             "optimizer.build(model.trainable_variables) under strategy.scope()")
        optimizer.build(variables)
    return replica_context


# ------------------------------------------------------------------------------------------------
# Factory
# ------------------------------------------------------------------------------------------------
class OptimizerAndSchedule(NamedTuple):
    """Result of `create_optimizer`."""

    optimizer: DecoupledWeightDecayOptimizer
    schedule: WarmupPolynomialDecay


def create_optimizer(config, optimizer_name: str = "adamw",
                     lr_multipliers: LrMultipliers = None,
                     generator_variables: Optional[Sequence] = None) -> OptimizerAndSchedule:
    """The official optimizer and schedule from a `PretrainingConfig`.

    Uses `learning_rate`, `lr_decay_power`, `weight_decay_rate`, `num_warmup_steps`,
    `num_train_steps` and `adam_bias_correction`, the official defaults for betas and epsilon,
    and the official exclusion list. Clip with `apply_gradients(..., clip_norm=CLIP_NORM)`.

    With `decoupled_optimizers` the generator's variables get their own schedule, of the same
    warmup and decay from `generator_learning_rate` (null: `learning_rate`), and their own clip
    (`optimizers` module docstring, `clip_gradients`).

    Args:
        config: electra_tf.config.PretrainingConfig.
        optimizer_name: "adamw" (official) or "lamb" (large global batches).
        lr_multipliers: optional per-variable multipliers (see `AdamWeightDecay`).
        generator_variables: with `decoupled_optimizers`, the generator side's variables
            (`ElectraPretrainer.generator_variables()`); `ElectraPretrainer.compile` sets them
            when they are not given here.

    Returns:
        OptimizerAndSchedule(optimizer, schedule); `schedule` is the discriminator's (the
        logged `learning_rate`). Create it under `strategy.scope()`.
    """
    if optimizer_name not in OPTIMIZER_NAMES:
        raise ValueError(f"optimizer_name must be one of {', '.join(OPTIMIZER_NAMES)}, "
                         f"got {optimizer_name!r}")
    schedule = WarmupPolynomialDecay(
        learning_rate=config.learning_rate,
        num_train_steps=config.num_train_steps,
        num_warmup_steps=config.num_warmup_steps,
        lr_decay_power=config.lr_decay_power,
    )
    generator_schedule = None
    if getattr(config, "decoupled_optimizers", False):
        rate = config.generator_learning_rate
        generator_schedule = WarmupPolynomialDecay(
            learning_rate=config.learning_rate if rate is None else rate,
            num_train_steps=config.num_train_steps, num_warmup_steps=config.num_warmup_steps,
            lr_decay_power=config.lr_decay_power)
    cls = AdamWeightDecay if optimizer_name == "adamw" else Lamb
    extra = ({"bias_correction": True}
             if optimizer_name == "adamw" and getattr(config, "adam_bias_correction", False) else {})
    optimizer = cls(learning_rate=schedule, weight_decay_rate=config.weight_decay_rate,
                    lr_multipliers=lr_multipliers, name=optimizer_name,
                    generator_learning_rate=generator_schedule, **extra)
    if generator_schedule is not None and generator_variables is not None:
        optimizer.set_generator_variables(generator_variables)
    return OptimizerAndSchedule(optimizer, schedule)
