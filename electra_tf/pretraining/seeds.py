"""Per-example random seeds that do not depend on how a global batch is split across replicas.

Every stochastic function of the objective (masking, generator sampling) takes `seeds` of shape
[batch_size, 2]: one stateless-RNG seed per example. The seed of an example depends only on the
step seed, the example's index in the GLOBAL batch and a `salt` naming the random stream, so the
same example gets the same masks and samples whether it sits in a batch of 8 on one device or in
a batch of 4 on replica 1 of 2. (The official code draws from stateful TF1 ops, so its draws are
not reproducible at all; this is a deliberate improvement, not a parity item.)

Seed derivation: `example_seeds(seed, first, B, salt)[i]` equals
`stateless_fold_in(stateless_fold_in(seed, salt), first + i)` with the Philox algorithm, i.e. the
TensorFlow-recommended way to derive independent streams, vectorised over the batch. The caller
should fold the training step into `seed` first (`stateless_fold_in(base_seed, step)`), so that
every step draws fresh masks.

Practical notes: the per-example loops (`map_examples`) are graph loops, so call the objective
functions inside `tf.function` (eagerly a `tf.map_fn` runs a Python loop, ~10 ms per example).
Draws are reproducible for a fixed seed within one execution mode; an XLA-compiled
(`jit_compile=True`) function draws different (equally valid) bits than the TensorFlow kernels,
because XLA implements the stateless Philox ops itself.
"""

from __future__ import annotations

from typing import Callable, Union

import tensorflow as tf

# Stateless algorithm pinned (instead of "auto_select") so that draws do not change with the
# device a step runs on.
RNG_ALG = "philox"

# Salts separating the independent random streams of one step. Any distinct integers work;
# new stochastic components must use a new value.
MASKING_SALT = 1
SAMPLING_SALT = 2

# How many examples' draws run concurrently inside the per-example loops. Measured (2-core CPU,
# [32, 19, 30522] Gumbel sampling): 2 is as fast as 10 or 32 while keeping at most two
# [max_predictions_per_seq, vocab_size] noise buffers alive.
PARALLEL_EXAMPLES = 2

IntLike = Union[int, tf.Tensor]


def example_seeds(seed: tf.Tensor, first_example: IntLike, batch_size: IntLike, salt: int) -> tf.Tensor:
    """Stateless seeds for examples `first_example .. first_example + batch_size - 1` of a global batch.

    Args:
        seed: int32 or int64 [2]. The step seed (already folded with the step number).
        first_example: int or scalar int tensor. Global index of the first local example; use
            `replica_example_offset(local_batch_size)` inside a replica function.
        batch_size: int or scalar int tensor. Number of local examples B.
        salt: int. Names the random stream (`MASKING_SALT`, `SAMPLING_SALT`, ...), so masking and
            sampling of one example are independent.

    Returns:
        int64 [batch_size, 2]. Row i is the seed of global example `first_example + i`.
    """
    seed = tf.convert_to_tensor(seed)
    stream = tf.random.experimental.stateless_fold_in(seed, tf.constant(salt, tf.int64), alg=RNG_ALG)
    # stateless_fold_in(stream, i) == [uniform_full_int(stream), i]; the first component is the
    # same for every i, so it is drawn once.
    key = tf.random.stateless_uniform([], seed=stream, minval=None, maxval=None, dtype=tf.int64, alg=RNG_ALG)
    index = tf.cast(first_example, tf.int64) + tf.range(tf.cast(batch_size, tf.int64), dtype=tf.int64)
    return tf.stack([tf.fill(tf.shape(index), key), index], axis=1)


def replica_example_offset(local_batch_size: IntLike) -> tf.Tensor:
    """Global index of this replica's first example: replica_id_in_sync_group * local_batch_size.

    Assumes the global batch is split into equal consecutive slices in replica order (what
    `experimental_distribute_dataset` does with drop_remainder batches). Returns 0 outside a
    replica context and under the default (single-device) strategy.

    Args:
        local_batch_size: int or scalar int tensor. The per-replica batch size.

    Returns:
        int64 scalar tensor.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None:  # cross-replica context: the caller holds the whole batch
        return tf.constant(0, tf.int64)
    return tf.cast(ctx.replica_id_in_sync_group, tf.int64) * tf.cast(local_batch_size, tf.int64)


def map_examples(fn: Callable, seeds: tf.Tensor, fn_output_signature) -> tf.Tensor:
    """Runs `fn(b, seeds[b])` for every example b and stacks the results.

    Stateless random ops take one seed, and TensorFlow has no vectorised (pfor) rule for them with
    per-example seeds, so per-example streams need one op per example. A `tf.map_fn` keeps the
    graph small for any (even dynamic) batch size; measured, it is no slower than one op over
    the whole batch because each example's tensors stay cache-sized.

    Args:
        fn: callable (b: int32 scalar, seed: [2]) -> tensor or nest of tensors for example b.
        seeds: int [B, 2].
        fn_output_signature: as for `tf.map_fn`.

    Returns:
        The stacked outputs, with a leading dimension B.
    """
    seeds = tf.convert_to_tensor(seeds)
    batch_size = tf.shape(seeds)[0]
    return tf.map_fn(
        lambda b: fn(b, seeds[b]),
        tf.range(batch_size),
        fn_output_signature=fn_output_signature,
        parallel_iterations=PARALLEL_EXAMPLES,
    )
