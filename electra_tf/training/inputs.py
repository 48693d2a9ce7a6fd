"""The trainer's data: dataset checks, this worker's checkpointable batches, the eval dataset.

`tf.distribute` iterators over several devices cannot be checkpointed, so each worker reads its
own part of the global batch with a plain `tf.data` iterator (checkpointable: the data position
is saved with the model) and each replica slices its rows in the step (`replica_slice`). A
fingerprint of the pipeline (`train_data_key`: files, batch split, seed) is saved with the
position, and a run resumed with another batch size or other shards restarts the data instead of
failing. Evaluation uses an ordinary distributed dataset (its position is never saved).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Dict, NamedTuple, Optional

import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.data import pipeline
from electra_tf.vocab import Vocab

logger = logging.getLogger("electra_tf")


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


def check_datasets(config: PretrainingConfig, vocab: Vocab) -> Dict[str, dict]:
    """Validates the splits this run reads (manifest, vocab, sequence length, records).

    Runs before anything is written or deleted. Returns {"train"/"eval": summary} (see
    `pipeline.validate_dataset`); problems skipped under `skip_bad_records` are logged.
    """
    splits = {"train": (config.do_train, config.pretrain_tfrecords),
              "eval": (config.do_eval, config.eval_tfrecords)}
    summaries = {}
    for split, (needed, patterns) in splits.items():
        if needed:
            summaries[split] = pipeline.validate_dataset(
                patterns, max_seq_length=config.max_seq_length, vocab_sha256=vocab.sha256,
                vocab_size=config.vocab_size, split=split, verify=config.verify_tfrecords,
                skip_bad_records=config.skip_bad_records)
    for split, summary in summaries.items():
        for problem in summary.get("problems", ()):
            logger.warning("skip_bad_records (%s data): %s", split, problem)
        if summary.get("skipped_records"):
            logger.warning("skip_bad_records: %d %s record(s) skipped, %d used",
                           summary["skipped_records"], split, summary["num_examples"])
    return summaries


def record_plan(summaries: Dict[str, dict], split: str) -> Optional[dict]:
    """The good records to read (`skip_bad_records`), or None to read every record."""
    return summaries.get(split, {}).get("record_plan")


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
    """What the saved data position depends on: files, batch split, seed, sequence length.

    A checkpoint's iterator state can only be restored into the same pipeline (a different
    batch size fails at the first step; rebuilt shards would resume mid-record).
    """
    files = [(os.path.basename(f), tf.io.gfile.stat(f).length)
             for f in pipeline.list_files(config.pretrain_tfrecords)]
    key = {"files": files, "global_batch": config.train_batch_size,
           "replicas": split.context.num_replicas_in_sync,
           "input_pipelines": split.context.num_input_pipelines,
           "seed": config.seed, "max_seq_length": config.max_seq_length}
    if plan is not None:  # other records read = another pipeline
        key["record_plan"] = {os.path.basename(f): v for f, v in plan.items()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


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
