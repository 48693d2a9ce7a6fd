"""The pretraining input pipeline: TFRecord shards to batches of int32 features.

Follows the official `pretrain_data.get_input_fn` (file list from comma-separated globs, shuffled
files, interleaved readers, a record shuffle, fixed-size batches with the remainder dropped), run
per input pipeline under `strategy.distribute_datasets_from_function`:

- files are sharded per input pipeline (worker) when there are enough of them, else records are;
- the file order is reshuffled every epoch (seeded), and `MAX_INTERLEAVE_CYCLE` files are read
  at once, one record from each in turn, followed by a seeded record shuffle; every shuffle is
  seeded and the interleave deterministic, so a run's data order is reproducible and its
  iterator state can be checkpointed (exact resume);
- records are batched *before* parsing (one vectorised parse per batch, ~3x faster than per
  record).

Mixing does not rest on this pipeline: the builder shuffles examples globally, so every stretch
of every shard is already a random sample of the corpus, and a batch is statistically a random
draw for 1 shard or 1000 (docs/design.md, "Data order"). The file reshuffle and the interleave
make each epoch's batches different; the record shuffle only breaks up the interleave's pattern.

Masking is not done here: it is dynamic, drawn in the training step from the step's seed.
The integrity checks the trainer runs first are in `integrity` (re-exported here).
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from electra_tf.data import tfrecord_io
# Re-exported: the trainer calls them through this module.
from electra_tf.data.integrity import (DataError, find_bad_file, list_files,  # noqa: F401
                                       validate_dataset)

# Official: a shuffle of 100 records after the interleave; a larger buffer breaks up the
# interleave's round-robin pattern better at a negligible memory cost (records are ~1-4 KB).
RECORD_SHUFFLE_BUFFER = 1000
# Official: cycle_length = min(4, number of files).
MAX_INTERLEAVE_CYCLE = 4


def make_dataset(patterns: str, *, batch_size: int, max_seq_length: int, is_training: bool,
                 seed: int = 0, input_context: Optional[tf.distribute.InputContext] = None,
                 repeat: bool = True, record_plan: Optional[dict] = None) -> tf.data.Dataset:
    """Builds one input pipeline.

    Args:
        patterns: str. Comma-separated file globs.
        batch_size: int. Batch size of THIS pipeline (per replica under a strategy: use
            `input_context.get_per_replica_batch_size(global_batch)`).
        max_seq_length: int. Feature length the shards were written with.
        is_training: bool. Shuffle files and records.
        seed: int. Seeds the shuffles.
        input_context: tf.distribute.InputContext or None. Shards the input per pipeline.
        repeat: bool. Cycle through the data forever (training and fixed-step eval).
        record_plan: optional {path: {"take": n, "skip": [indices]}} from `validate_dataset(...,
            skip_bad_records=True)`: read only those files, their first n records, minus the
            skipped ones. Without damage the data order is the same as without a plan.

    Returns:
        A dataset of dicts {"input_ids", "input_mask", "segment_ids"}, int32 [batch_size,
        max_seq_length], remainder dropped.
    """
    files = list_files(patterns)
    if record_plan is not None:
        files = [f for f in files if f in record_plan]
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    if record_plan is None:
        dataset = tf.data.Dataset.from_tensor_slices(files)
        read_file = tf.data.TFRecordDataset
    else:
        dataset = tf.data.Dataset.from_tensor_slices(
            (files, [record_plan[f]["take"] for f in files], list(range(len(files)))))
        read_file = _planned_reader(files, record_plan)
    shard_records = num_pipelines > 1 and len(files) < num_pipelines
    if num_pipelines > 1 and not shard_records:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if is_training:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    cycle = min(MAX_INTERLEAVE_CYCLE, len(files))
    dataset = dataset.interleave(read_file, cycle_length=cycle,
                                 num_parallel_calls=cycle, deterministic=True)
    if shard_records:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if is_training:
        dataset = dataset.shuffle(RECORD_SHUFFLE_BUFFER, seed=seed + 1)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda records: tfrecord_io.parse_example(records, max_seq_length),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _planned_reader(files: List[str], record_plan: dict):
    """(path, take, file index) -> that file's good records, per `record_plan`."""
    # Bad records are rare: one constant vector of (file index, record index) keys is enough.
    keys = [i * (1 << 32) + j for i, f in enumerate(files) for j in record_plan[f]["skip"]]
    skip_keys = tf.constant(keys, dtype=tf.int64)

    def read(path, take, file_index):
        records = tf.data.TFRecordDataset(path).take(tf.cast(take, tf.int64))
        if not keys:
            return records
        base = tf.cast(file_index, tf.int64) * (1 << 32)
        return records.enumerate().filter(
            lambda j, _: tf.logical_not(tf.reduce_any(tf.equal(base + j, skip_keys)))
        ).map(lambda _, record: record)

    return read
