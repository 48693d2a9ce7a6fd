"""Gradient accumulation: one step's batch in k micro-batches, the update of the whole batch.

`gradient_accumulation_steps = k` keeps `train_batch_size` the global batch of ONE update (so
the official base 256 / large 2048 stay what they are) and runs its forward and backward passes
k micro-batches at a time, so activations take the memory of batch / k. The result is the update
of the whole batch, not an average of k small-batch updates:

1. The data pipeline yields the same batches as without accumulation (its checkpointed position,
   and so resume, are unchanged); each replica takes its rows as usual.
2. The replica masks its whole batch at once (`ElectraPretrainer.mask`): masks depend on each
   example's global index (`seeds.py`), so they are those of the unaccumulated step.
3. The loss denominators of the WHOLE step are computed once (`loss_weight_sums`, the only
   all-reduce before the update): the official losses divide by the batch's total weight
   (masked slots, real tokens), so each micro-batch's loss is its share of the whole batch's.
4. A graph loop runs the k micro-batches (generator samples again keyed by global example
   index) and sums their gradients; the step's losses are the sums of the micro-batch losses and
   the metrics see the concatenated outputs.
5. The summed gradient then goes through the unchanged update: all-reduce, global-norm clip at
   1.0 of the WHOLE step's gradient, optimizer (weight decay, schedule), one step counter tick.

So k micro-batches equal one k-times-larger batch up to float summation order, with clipping
and weight decay applied once per update. Dropout draws other masks (it consumes Keras' seed
generators per call), as any change of batch layout does. Nothing is carried from one step to
the next, so a checkpoint never holds a partial accumulation and resume stays exact.

Keras' own `Optimizer(gradient_accumulation_steps=)` is not used: it averages k separate
steps' gradients (each normalised by its own micro-batch) and, behind this project's clipping,
would clip each micro-batch separately.

Memory: one accumulator per trainable variable (dense, so the embedding table's gradient is
dense), plus the whole batch's int ids and masks and the micro-batches' metric inputs.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import tensorflow as tf

from electra_tf.pretraining import seeds

LOSS_KEYS = ("total_loss", "masked_lm_loss", "disc_loss")


def micro_batch_size(local_batch: int, steps: int) -> int:
    """Rows per micro-batch; raises ValueError if `steps` does not divide the replica's batch."""
    if local_batch % steps:
        raise ValueError(f"gradient_accumulation_steps={steps} does not divide the per-replica "
                         f"batch of {local_batch} rows: make train_batch_size a multiple of "
                         f"replicas x gradient_accumulation_steps")
    return local_batch // steps


def accumulating(model, forward_backward: Callable, steps: int) -> Callable:
    """A `(batch, seed) -> (outputs, gradients)` running `forward_backward` on `steps` slices.

    Args:
        model: the ElectraPretrainer (`mask`, `loss_weight_sums`).
        forward_backward: `(batch, seed, example_offset=, loss_denominators=) -> (outputs,
            gradients)` for one micro-batch (maybe XLA-compiled).
        steps: int k > 1.

    Returns:
        The step's forward-backward: outputs with the summed losses and concatenated
        `metric_inputs`, and the summed gradients (None where a variable gets none).
    """

    def run(batch, seed):
        local = batch["input_ids"].shape[0]
        if local is not None:
            size = micro_batch_size(local, steps)
        else:  # a batch size known only when the step runs
            local = tf.shape(batch["input_ids"])[0]
            tf.debugging.assert_equal(local % steps, 0, message=(
                f"gradient_accumulation_steps={steps} does not divide the per-replica batch"))
            size = local // steps
        offset = seeds.replica_example_offset(local)
        masked = model.mask(batch, seed=seed, example_offset=offset)
        denominators = model.loss_weight_sums(masked)
        micro = {k: tf.reshape(v, tf.concat([[steps, size], tf.shape(v)[1:]], axis=0))
                 for k, v in masked.items()}

        def one(j):
            return forward_backward({k: v[j] for k, v in micro.items()}, seed,
                                    example_offset=offset + tf.cast(j * size, tf.int32),
                                    loss_denominators=denominators)

        outputs, grads = one(0)
        present = [i for i, g in enumerate(grads) if g is not None]
        return _sum_micro_batches(one, steps, outputs, grads, present)

    return run


def _sum_micro_batches(one: Callable, steps: int, outputs: Dict, grads: List, present: List[int]):
    """Runs micro-batches 1..k-1 in a graph loop after micro-batch 0 (`outputs`, `grads`)."""
    accumulated = [_dense(grads[i]) for i in present]
    loss_sums = {k: outputs[k] for k in LOSS_KEYS}
    arrays = {k: tf.TensorArray(v.dtype, size=steps, element_shape=v.shape).write(0, v)
              for k, v in outputs["metric_inputs"].items()}

    def body(j, accumulated, loss_sums, arrays):
        out, g = one(j)
        accumulated = [a + _dense(g[i]) for a, i in zip(accumulated, present)]
        loss_sums = {k: loss_sums[k] + out[k] for k in LOSS_KEYS}
        arrays = {k: arrays[k].write(j, out["metric_inputs"][k]) for k in arrays}
        return j + 1, accumulated, loss_sums, arrays

    # One micro-batch at a time: their activations are never alive together.
    _, accumulated, loss_sums, arrays = tf.while_loop(
        lambda j, *_: j < steps, body, (tf.constant(1), accumulated, loss_sums, arrays),
        parallel_iterations=1, maximum_iterations=steps - 1)
    summed = [None] * len(grads)
    for i, g in zip(present, accumulated):
        summed[i] = g
    outputs = dict(loss_sums, metric_inputs={k: a.concat() for k, a in arrays.items()})
    return outputs, summed


def _dense(grad) -> tf.Tensor:
    # An embedding's IndexedSlices has as many rows as lookups, which differ per micro-batch; a
    # loop variable needs one shape, and the optimizer densifies the gradient anyway.
    return tf.convert_to_tensor(grad)
