"""TensorFlow's side of the parameter update: fused Adam kernels, IndexedSlices, replica sums.

`optimizers` and `optimization` import this module only when `keras.backend.backend()` is
"tensorflow", so the JAX and PyTorch paths never import TensorFlow. What lives here has no
counterpart there:

* `fusable_handles`, `fused_adamw_update`: `AdamWeightDecay`'s update as TensorFlow's fused
  ResourceApplyAdam kernel, one pass over m, v and the weights (the TF default; the keras.ops
  update in `optimizers` computes the same function and is what distributed variables use).
* `dense`: an IndexedSlices gradient as the dense tensor the keras.ops update reads.
* `clip_by_global_norm`, `global_norm`, `scale`: the official clip over Tensors and IndexedSlices
  (embedding lookups), with repeated rows summed first. JAX and PyTorch gradients are dense.
* `replica_context`, `all_reduce_sum`: the cross-replica sum of tf.distribute.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import keras
import tensorflow as tf


# ------------------------------------------------------------------------------------------------
# Fused AdamW
# ------------------------------------------------------------------------------------------------
def fusable_handles(variable, m, v):
    """(var handle, m handle, v handle, var) when all three are plain resource variables, else None.

    The fused kernels take resource handles, which are only unambiguous for ordinary (one-device)
    variables; distributed variables (MirroredStrategy) keep the per-op path, whose assignments
    go through tf.distribute's update context.
    """
    values = [getattr(x, "value", x) if isinstance(x, keras.Variable) else x
              for x in (variable, m, v)]
    for x in values:
        if (isinstance(x, tf.distribute.DistributedValues) or not isinstance(x, tf.Variable)
                or not hasattr(x, "handle")):
            return None
    return values[0].handle, values[1].handle, values[2].handle, values[0]


def fused_adamw_update(gradient, handles, lr, beta_1: float, beta_2: float, epsilon: float,
                       weight_decay_rate: Optional[float], adam_lr=None) -> None:
    """The official AdamW update of one variable with TensorFlow's fused kernels.

    ResourceApplyAdam computes m, v and var -= lr_t * m / (sqrt(v) + epsilon) in one
    vectorised loop, with lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power): powers of 0
    give lr_t = lr, i.e. the official update WITHOUT bias correction. The decoupled decay
    lr * wd * var is taken from the weights before the Adam step (as official: the step does
    not read the weights), by one fused var -= alpha * var. Equal to the keras.ops update up to
    float rounding (tests/training/test_optimizers_backends.py compares the two, and
    tests/training/test_optimization.py both with the float64 reference).
    Measured on ELECTRA-small (13.5M weights, 2-core CPU): ~17 elementwise passes per
    variable become 1-2.

    Args:
        gradient: Tensor or IndexedSlices, the variable's gradient.
        handles: the tuple `fusable_handles` returned for the variable and its slots.
        lr: scalar Tensor of the variable's dtype, the scheduled rate times its multiplier.
        beta_1, beta_2, epsilon: float, the Adam constants.
        weight_decay_rate: float, or None for a variable excluded from decay.
        adam_lr: the rate of the Adam part, when it differs from the decay's `lr` (the
            optimizer's `bias_correction`: lr times sqrt(1 - beta_2^t) / (1 - beta_1^t)); None
            is `lr`.
    """
    var_handle, m_handle, v_handle, var = handles
    dtype = var.dtype
    gradient = tf.cast(tf.convert_to_tensor(gradient), dtype)
    if weight_decay_rate is not None:
        tf.raw_ops.ResourceApplyGradientDescent(
            var=var_handle, alpha=lr * tf.cast(weight_decay_rate, dtype),
            delta=var.read_value())
    zero = tf.constant(0.0, dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=var_handle, m=m_handle, v=v_handle, beta1_power=zero, beta2_power=zero,
        lr=lr if adam_lr is None else adam_lr,
        beta1=tf.cast(beta_1, dtype), beta2=tf.cast(beta_2, dtype),
        epsilon=tf.cast(epsilon, dtype), grad=gradient)


def dense(gradient) -> tf.Tensor:
    """`gradient` as a dense Tensor (an IndexedSlices is scattered into zeros).

    Dense, as the official: m and v of rows without gradient still decay, and weight decay
    touches every row of an embedding table.
    """
    return tf.convert_to_tensor(gradient)


# ------------------------------------------------------------------------------------------------
# Clipping over Tensors and IndexedSlices
# ------------------------------------------------------------------------------------------------
def _dedupe_indexed_slices(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    # An embedding gradient lists one row per lookup, so a token seen twice appears twice, and
    # the norm of `.values` (what tf.linalg.global_norm uses) is not the gradient's norm. The
    # official code computes the dense gradient only on TPU (use_tpu=True: one-hot embedding
    # lookups, a dense matmul gradient); on CPU/GPU (use_tpu=False) it gathers and gets such
    # rows, and its clip sees the unsummed ones. Duplicate rows are summed first, so the clip
    # uses the true gradient norm: the official TPU path (docs/parity.md, item 32).
    unique_indices, positions = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique_indices)[0])
    return tf.IndexedSlices(values, unique_indices, grad.dense_shape)


def clip_by_global_norm(grads: Sequence, clip_norm: float,
                        sum_repeated_rows: bool = True) -> Tuple[List, tf.Tensor]:
    """`tf.clip_by_global_norm` over Tensors and IndexedSlices; see `optimization`'s.

    Returns:
        (clipped gradients, float32 global norm before clipping); IndexedSlices come back with
        unique indices, None stays None.
    """
    present = [g for g in grads if g is not None]
    rows_norm = None if sum_repeated_rows or not present else tf.linalg.global_norm(present)
    grads = [_dedupe_indexed_slices(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    if not present:
        return grads, tf.constant(0.0)
    clipped, norm = tf.clip_by_global_norm(grads, clip_norm, use_norm=rows_norm)
    return list(clipped), norm


def global_norm(grads: Sequence, sum_repeated_rows: bool = True) -> tf.Tensor:
    """The global norm `clip_by_global_norm` clips by, without clipping (float32 scalar)."""
    grads = [g for g in grads if g is not None]
    if sum_repeated_rows:
        grads = [_dedupe_indexed_slices(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
    return tf.linalg.global_norm(grads) if grads else tf.constant(0.0)


def scale(grad, factor):
    """`grad * factor` for a Tensor, an IndexedSlices (its values) or None."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


# ------------------------------------------------------------------------------------------------
# tf.distribute
# ------------------------------------------------------------------------------------------------
def replica_context() -> tf.distribute.ReplicaContext:
    """The replica context the update runs in (the default one without a strategy).

    Raises:
        RuntimeError: called in a cross-replica context, where the per-replica gradients are
            not at hand.
    """
    if tf.distribute.in_cross_replica_context():
        raise RuntimeError("apply_gradients must run in a replica context: call it inside "
                           "strategy.run(...), where the gradients were computed")
    return tf.distribute.get_replica_context()


def all_reduce_sum(context: tf.distribute.ReplicaContext, grads: Sequence) -> List:
    """The cross-replica sums of `grads` (no None), Tensors and IndexedSlices alike."""
    return list(context.all_reduce(tf.distribute.ReduceOp.SUM, list(grads)))
