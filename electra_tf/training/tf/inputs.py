"""The trainer's data: dataset checks, this worker's checkpointable batches, the eval dataset.

`tf.distribute` iterators over several devices cannot be checkpointed, so each worker reads its
own part of the global batch with a plain `tf.data` iterator (checkpointable: the data position
is saved with the model) and each replica slices its rows in the step (`replica_slice`). A
fingerprint of the pipeline (`train_data_key`: files, batch split, seed) is saved with the
position, and a run resumed with another batch size or other shards restarts the data instead of
failing. Evaluation uses an ordinary distributed dataset (its position is never saved).
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.data.records import pipeline
from electra_tf.training import run_base


class InputSplit(NamedTuple):
    """How the global training batch is split over this worker's pipeline and replicas.

    Attributes:
        context: tf.distribute.InputContext. This worker's pipeline index and counts.
        per_replica_batch: int. Rows each replica trains on.
        local_replicas: int. Replicas this worker feeds.
    """

    context: tf.distribute.InputContext
    per_replica_batch: int
    local_replicas: int

    @property
    def local_batch(self) -> int:
        """Rows this worker's pipeline yields per step (its replicas' rows together)."""
        return self.per_replica_batch * self.local_replicas


def input_split(strategy: tf.distribute.Strategy, global_batch: int) -> InputSplit:
    """This worker's input pipeline and its share of `global_batch`."""
    contexts = []

    def capture(input_context):
        contexts.append(input_context)
        return tf.data.Dataset.range(1)

    # The strategy itself says which pipeline this worker is (public API, no data read).
    strategy.distribute_datasets_from_function(capture)
    context = contexts[0]
    return InputSplit(context, context.get_per_replica_batch_size(global_batch),
                      context.num_replicas_in_sync // context.num_input_pipelines)


def train_iterator(config: PretrainingConfig, split: InputSplit, seed: int,
                   plan: Optional[dict] = None):
    """A plain (checkpointable) iterator over this worker's [local_batch, L] training batches,
    the examples the distributed iterator would hand its replicas."""
    return iter(pipeline.make_dataset(
        config.pretrain_tfrecords, batch_size=split.local_batch,
        max_seq_length=config.max_seq_length, is_training=True, seed=seed,
        input_context=split.context, record_plan=plan))


def train_data_key(config: PretrainingConfig, split: InputSplit, plan: Optional[dict] = None) -> str:
    """What the saved data position depends on (`run_base.data_position_key`): files, batch
    split, seed, sequence length, and this pipeline's replicas and input pipelines."""
    return run_base.data_position_key(
        config, plan, {"replicas": split.context.num_replicas_in_sync,
                       "input_pipelines": split.context.num_input_pipelines,
                       # The order's definition (electra_tf/data/records/order.py): a position saved
                       # under another (tf.data's own shuffles, before) restarts the data instead
                       # of failing to restore.
                       "data_order": 2},
        size=lambda path: tf.io.gfile.stat(path).length)


def replica_slice(local_batch: Dict[str, tf.Tensor], split: InputSplit) -> Dict[str, tf.Tensor]:
    """This replica's [per_replica_batch, L] rows of the worker's local batch (in a replica
    context)."""
    if split.local_replicas == 1:
        return local_batch
    context = tf.distribute.get_replica_context()
    # Replicas are numbered worker-major, so the id modulo the local count is the local index.
    start = (tf.cast(context.replica_id_in_sync_group, tf.int32) % split.local_replicas
             ) * split.per_replica_batch
    return {k: v[start:start + split.per_replica_batch] for k, v in local_batch.items()}


def distributed_dataset(strategy: tf.distribute.Strategy, config: PretrainingConfig,
                        patterns: str, global_batch: int, is_training: bool,
                        plan: Optional[dict] = None) -> tf.distribute.DistributedDataset:
    """`pipeline.make_dataset` per input pipeline, distributed over the replicas."""

    def dataset_fn(input_context):
        return pipeline.make_dataset(
            patterns, batch_size=input_context.get_per_replica_batch_size(global_batch),
            max_seq_length=config.max_seq_length, is_training=is_training, seed=config.seed,
            input_context=input_context, record_plan=plan)

    return strategy.distribute_datasets_from_function(dataset_fn)
