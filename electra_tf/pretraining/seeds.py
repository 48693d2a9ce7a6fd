"""Per-example random keys that do not depend on the backend or on how a global batch is split.

Every stochastic function of the objective (masking, generator sampling) takes `keys` of shape
[batch_size]: one int32 key per example (`electra_tf.modeling.rng`). The key of an example depends
only on the step seed, the example's index in the GLOBAL batch and a `salt` naming the random
stream, so the same example gets the same masks and samples whether it sits in a batch of 8 on one
device or in a batch of 4 on replica 1 of 2, on TensorFlow, JAX or PyTorch. (The official code
draws from stateful TF1 ops, so its draws are not reproducible at all; this is a deliberate
improvement, not a parity item.)

The step seed is an int [2] tensor (run seed, step): the training step is a counter, so a
resumed run draws exactly what the uninterrupted run drew.

Stream history: releases before the three backends derived per-example Philox seeds with
`tf.random.experimental.stateless_fold_in` and drew masking positions with per-example Philox;
that stream exists on TensorFlow only, so it was replaced by the counter-based hash (the same
distributions, other draws).
"""

from __future__ import annotations

from typing import Union

import keras

from electra_tf.modeling import rng

# Salts separating the independent random streams of one step (rng.MASKING_SALT, ...).
MASKING_SALT = rng.MASKING_SALT
SAMPLING_SALT = rng.SAMPLING_SALT

IntLike = Union[int, "keras.KerasTensor"]

# Evaluation batch i draws from the step seed (run seed, EVAL_STEP_BASE - i): training steps
# count up from 0 and evaluation batches down from 2^31 - 1, so the two never share draws
# (num_train_steps is at most 2^31 - 1) and a checkpoint always gives the same eval results.
EVAL_STEP_BASE = 2 ** 31 - 1


def eval_seed(run_seed: int, batch_index):
    """int32 [2]: the step seed of evaluation batch `batch_index` (see `EVAL_STEP_BASE`)."""
    return keras.ops.stack([
        keras.ops.convert_to_tensor(rng.int32_bits(run_seed), "int32"),
        EVAL_STEP_BASE - keras.ops.cast(batch_index, "int32")])


def example_keys(seed, first_example: IntLike, batch_size: int, salt: int):
    """int32 [batch_size]: the keys of examples first_example .. first_example + B - 1.

    Args:
        seed: int [2] tensor (run seed, step): the step seed.
        first_example: int or scalar int tensor. Global index of the first local example; use
            `replica_example_offset(local_batch_size)` inside a tf.distribute replica.
        batch_size: int B (static).
        salt: int. Names the random stream (`MASKING_SALT`, `SAMPLING_SALT`), so masking and
            sampling of one example are independent.
    """
    key = rng.stream_key(seed[0], seed[1], salt)
    return rng.example_keys(key, first_example, batch_size)


def replica_example_offset(local_batch_size: IntLike):
    """Global index of this replica's first example: replica_id_in_sync_group * local_batch_size.

    Under `tf.distribute` each replica holds a consecutive slice of the global batch (what
    `experimental_distribute_dataset` does with drop_remainder batches). Other backends shard one
    global batch across devices (keras.distribution), whose examples are indexed from 0, so the
    offset is 0 there, as outside a replica context and under the default strategy.

    Returns:
        int32 scalar tensor.
    """
    if keras.backend.backend() != "tensorflow":
        return keras.ops.convert_to_tensor(0, "int32")
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None:  # cross-replica context: the caller holds the whole batch
        return tf.constant(0, tf.int32)
    return ctx.replica_id_in_sync_group * tf.cast(local_batch_size, tf.int32)
