"""`ElectraPretrainer.compile()` / `fit()` / `evaluate()`: Keras' loops around this project's step.

`fit()` runs the very step `run_pretraining.py` runs (`train_step.apply_or_skip`): the step's
seed (run seed, optimizer step), the forward-backward pass (over `gradient_accumulation_steps`
micro-batches when > 1, XLA-compiled with `jit_compile`), the cross-replica gradient sum, the
official global-norm clip at 1.0 of that sum, the optimizer, then the metrics. With the same
seed, initial weights and batches it therefore gives the same losses and weights as the custom
loop; the Keras parts are only the outer loop, the callbacks and the logs. `evaluate()` runs
`train_step.eval_step` with the evaluation seed stream (batch i of an evaluation masks from
`seeds.eval_seed(seed, i)`, as the trainer's evaluation).

Logs: `loss` (the mean total loss over the epoch's steps) and the official metrics
(`PretrainingMetrics`: masked_lm_accuracy, masked_lm_loss, sampled_masked_lm_accuracy,
disc_loss, disc_auc, disc_accuracy, disc_precision, disc_recall; and disc_replaced_share, not
official: the share of real tokens replaced). Each replica adds its
contribution to the global loss, so the loss metric counts a step as 1/replicas per replica;
the epoch and `evaluate()` values are computed across replicas by Keras at the end and are those
of one device with the whole batch (per-batch progress-bar values of the accuracy-type metrics
are the mean of the replicas' partial values).

Under MirroredStrategy, create the model in `strategy.scope()` (as Keras requires) and batch the
dataset by the GLOBAL batch size; Keras splits each batch over the replicas in order, the split
`seeds.replica_example_offset` assumes. `training_dataset(config)` is that dataset: the batches
`run_pretraining.py` trains on, in its order (with tf.data's auto-sharding off: on one worker it
would rewrite the pipeline and change the shuffle order). The optimizer must be `AdamWeightDecay` or `Lamb` then
(`optimization.apply_gradients`). Keras' `fit()` under MultiWorkerMirroredStrategy is broken
upstream (keras-team/keras#20585): use `run_pretraining.py` for several workers.

Nothing here is a checkpoint dependency of the model: the state lives in a plain object, so a
compiled model's checkpoints are the trainer's (model and, once compiled, `optimizer`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, NamedTuple, Optional

import keras
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.data.records import pipeline
from electra_tf.pretraining.metrics import PretrainingMetrics
from electra_tf.training import optimizers, step_pieces
from electra_tf.training.tf import train_step


class FitSettings(NamedTuple):
    """The `make_step_context` settings of a compiled model (a PretrainingConfig's names)."""

    seed: int
    jit_compile: bool
    gradient_accumulation_steps: int
    max_skipped_nonfinite_steps: int = 0  # fit() applies every step (see TerminateOnNaN)


@dataclasses.dataclass(eq=False)
class FitState:
    """What `compile()` sets up for `fit()` / `evaluate()` (not tracked for checkpoints).

    Attributes:
        context: train_step.StepContext of the training step.
        metrics: PretrainingMetrics (official names), updated by training and evaluation.
        loss: keras.metrics.Mean, the total loss per step.
        eval_batches: int64 variable, the index of the next evaluation batch (its seed).
    """

    context: train_step.StepContext
    metrics: PretrainingMetrics
    loss: keras.metrics.Mean
    eval_batches: tf.Variable

    @property
    def all_metrics(self) -> List[keras.metrics.Metric]:
        return [self.loss] + list(self.metrics.metrics)


def compile_state(model, gradient_accumulation_steps: int, jit_compile: bool,
                  disc_auc_include_padding: bool) -> FitState:
    """Builds the model and `model.optimizer` and the step of a compiled model.

    Raises:
        ValueError: gradient accumulation configured in the optimizer (use
            `gradient_accumulation_steps` of `compile()`, which is exact).
    """
    step_pieces.check_accumulation_steps(gradient_accumulation_steps)
    inner = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    if getattr(inner, "gradient_accumulation_steps", None):
        raise ValueError(
            "the optimizer accumulates gradients itself (gradient_accumulation_steps="
            f"{inner.gradient_accumulation_steps}), which averages separately normalised and "
            "separately clipped steps: pass gradient_accumulation_steps to compile() instead")
    strategy = model.distribute_strategy
    check_optimizer(model.optimizer, strategy)
    with strategy.scope():
        metrics = step_pieces.build_for_fit(model, disc_auc_include_padding)
        loss = keras.metrics.Mean(name="loss")
        # On-read: every replica counts its own (equal) evaluation batches, without a sync.
        eval_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   synchronization=tf.VariableSynchronization.ON_READ,
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    settings = FitSettings(seed=model.seed, jit_compile=jit_compile,
                           gradient_accumulation_steps=gradient_accumulation_steps)
    context = train_step.make_step_context(
        model, model.optimizer, lambda step: _learning_rate(model.optimizer), metrics, strategy,
        settings, replica_slice=lambda batch: batch)  # Keras hands each replica its rows
    return FitState(context, metrics, loss, eval_batches)


def _learning_rate(optimizer) -> tf.Tensor:
    return tf.convert_to_tensor(optimizer.learning_rate)


def fit_train_step(state: FitState, data) -> Dict[str, tf.Tensor]:
    """One `fit()` step in a replica: the trainer's step, then the logs."""
    values = train_step.apply_or_skip(state.context, _features(data))
    _add_loss(state, values["total_loss"])
    return logs(state)


def fit_test_step(state: FitState, model, data) -> Dict[str, tf.Tensor]:
    """One `evaluate()` batch in a replica (the trainer's evaluation step), then the logs."""
    index = state.eval_batches.read_value()
    with tf.control_dependencies([index]):
        state.eval_batches.assign_add(1)
    _add_loss(state, train_step.eval_step(model, state.metrics, model.seed, _features(data), index))
    return logs(state)


def reset(state: FitState) -> None:
    """Clears the metrics and restarts the evaluation seeds (start of an epoch or evaluation)."""
    for metric in state.all_metrics:
        metric.reset_state()
    state.eval_batches.assign(0)


def logs(state: FitState) -> Dict[str, tf.Tensor]:
    return {m.name: m.result() for m in state.all_metrics}


def _add_loss(state: FitState, contribution: tf.Tensor) -> None:
    # total += contribution, count += 1 / replicas: summed over replicas, one step of the
    # global loss (exact for a power-of-two replica count).
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    state.loss.update_state(contribution * replicas, sample_weight=1.0 / replicas)


def _features(data):
    # Keras passes (x,) or (x, y, sample_weight) tuples through; the objective needs x only.
    return data[0] if isinstance(data, (tuple, list)) else data


def check_optimizer(optimizer, strategy: tf.distribute.Strategy) -> None:
    """Raises ValueError for an optimizer that cannot give the official update here."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if (strategy.num_replicas_in_sync > 1
            and not isinstance(inner, optimizers.DecoupledWeightDecayOptimizer)):
        raise ValueError(
            f"fit() under {strategy.num_replicas_in_sync} replicas needs AdamWeightDecay or Lamb "
            f"(electra_tf.training.optimizers; got {type(inner).__name__}): the gradient is "
            "summed over replicas and clipped before the optimizer, which other Keras "
            "optimizers would sum again")


def training_dataset(config: PretrainingConfig, seed: Optional[int] = None) -> tf.data.Dataset:
    """`fit()`'s training data: the batches `run_pretraining.py` trains on, in its order.

    Global batches of `train_batch_size` from `pretrain_tfrecords` (one worker), shuffled from
    `seed` (default `config.seed`), repeated. tf.data's auto-sharding is off: under
    MirroredStrategy Keras' `experimental_distribute_dataset` would otherwise rewrite the
    pipeline, which changes the shuffle order (the data would still be right, in another order).

    Returns:
        A dataset of dicts {"input_ids", "input_mask", "segment_ids"}, int32
        [train_batch_size, max_seq_length].
    """
    dataset = pipeline.make_dataset(
        config.pretrain_tfrecords, batch_size=config.train_batch_size,
        max_seq_length=config.max_seq_length, is_training=True,
        seed=config.seed if seed is None else seed)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
