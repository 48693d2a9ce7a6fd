"""The pretraining input pipeline: TFRecord shards to batches of int32 features.

Follows the official `pretrain_data.get_input_fn` (file list from comma-separated globs, shuffled
files, interleaved readers, a record shuffle, fixed-size batches with the remainder dropped), run
per input pipeline under `strategy.distribute_datasets_from_function`:

- files are sharded per input pipeline (worker) when there are enough of them, else records are
  (`order.pipeline_files`);
- `MAX_INTERLEAVE_CYCLE` files are read at once, one record from each in turn (a finished
  file's slot taken by the next file); in training the file order is reshuffled every epoch
  and the interleaved records are shuffled in consecutive windows of `RECORD_SHUFFLE_BUFFER`;
- both shuffles are permutations by a seeded hash defined in `electra_tf.data.records.order`, not
  tf.data's `shuffle`: the order is a pure function of the seed, the same in the TensorFlow-free
  reader of the JAX and PyTorch trainers (`record_reader.BatchReader`, same batches in the same
  order), and this pipeline's iterator state can still be checkpointed (exact resume);
- records are batched *before* parsing (one vectorised parse per batch, ~3x faster than per
  record).

Mixing does not rest on this pipeline: the builder shuffles examples globally, so every stretch
of every shard is already a random sample of the corpus, and a batch is statistically a random
draw for 1 shard or 1000 (docs/design.md, "Data order"). The file reshuffle and the interleave
make each epoch's batches different; the record shuffle only breaks up the interleave's pattern.

Masking is not done here: it is dynamic, drawn in the training step from the step's seed.
The integrity checks the trainer runs first are in `integrity`.
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from electra_tf.data.records import order, tfrecord_io
from electra_tf.data.records.integrity import list_files

# Records per window of the record shuffle (`order.record_order`; official: a 100-record
# shuffle buffer after the interleave).
RECORD_SHUFFLE_BUFFER = order.RECORD_SHUFFLE_WINDOW
# Official: cycle_length = min(4, number of files).
MAX_INTERLEAVE_CYCLE = order.MAX_INTERLEAVE_CYCLE


def make_dataset(patterns: str, *, batch_size: int, max_seq_length: int, is_training: bool,
                 seed: int = 0, input_context: Optional[tf.distribute.InputContext] = None,
                 repeat: bool = True, record_plan: Optional[dict] = None) -> tf.data.Dataset:
    """Builds one input pipeline.

    Args:
        patterns: str. Comma-separated file globs.
        batch_size: int. Batch size of THIS pipeline (per replica under a strategy: use
            `input_context.get_per_replica_batch_size(global_batch)`).
        max_seq_length: int. Feature length the shards were written with.
        is_training: bool. Shuffle files (per epoch) and records (`order`).
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
    all_files = list_files(patterns)
    if record_plan is not None:
        all_files = [f for f in all_files if f in record_plan]
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    files, shard_records = order.pipeline_files(all_files, num_pipelines, pipeline_id)
    dataset = _file_stream(len(files), is_training, seed, repeat)
    paths = tf.constant(files)
    if record_plan is None:
        dataset = dataset.map(lambda i: tf.gather(paths, i))
        read_file = tf.data.TFRecordDataset
    else:
        takes = tf.constant([record_plan[f]["take"] for f in files], tf.int64)
        dataset = dataset.map(lambda i: (tf.gather(paths, i), tf.gather(takes, i), i))
        read_file = _planned_reader(files, record_plan)
    cycle = order.interleave_cycle(len(all_files))
    dataset = dataset.interleave(read_file, cycle_length=cycle,
                                 num_parallel_calls=cycle, deterministic=True)
    if shard_records:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if is_training:
        dataset = _shuffle_windows(dataset, seed)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda records: tfrecord_io.parse_example(records, max_seq_length),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _file_stream(num_files: int, is_training: bool, seed: int, repeat: bool) -> tf.data.Dataset:
    """int64 indices into the pipeline's files, epoch after epoch: `order.file_order` of each
    epoch in training, list order otherwise; one epoch unless `repeat`."""
    epochs = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)

    def epoch_files(epoch):
        if is_training:
            return tf.data.Dataset.from_tensor_slices(order.file_order_tf(seed, epoch, num_files))
        return tf.data.Dataset.range(num_files)

    return epochs.flat_map(epoch_files)


def _shuffle_windows(dataset: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    """Each window of `RECORD_SHUFFLE_BUFFER` records (the last one shorter where the stream
    ends) in the order `order.record_order(seed, window index, window size)`."""

    def permute(window, records):
        return tf.gather(records, order.record_order_tf(seed, window, tf.size(records)))

    return dataset.batch(RECORD_SHUFFLE_BUFFER).enumerate().map(permute).unbatch()


def _planned_reader(files: List[str], record_plan: dict):
    """(path, take, file index) -> that file's good records, per `record_plan`."""
    # Bad records are rare: one constant vector of (file index, record index) keys is enough.
    keys = [i * (1 << 32) + j for i, f in enumerate(files) for j in record_plan[f]["skip"]]
    skip_keys = tf.constant(keys, dtype=tf.int64)

    def read(path, take, file_index):
        records = tf.data.TFRecordDataset(path).take(take)
        if not keys:
            return records
        base = file_index * (1 << 32)
        return records.enumerate().filter(
            lambda j, _: tf.logical_not(tf.reduce_any(tf.equal(base + j, skip_keys)))
        ).map(lambda _, record: record)

    return read
