"""The pretraining input pipeline: TFRecord shards to batches of int32 features.

Follows the official `pretrain_data.get_input_fn` (file list from comma-separated globs, shuffled
files, interleaved readers, a record shuffle, fixed-size batches with the remainder dropped), run
per input pipeline under `strategy.distribute_datasets_from_function`:

- files are sharded per input pipeline (worker) when there are enough of them, else records are;
- every shuffle is seeded and the interleave deterministic, so a run's data order is reproducible
  (needed for exact resume and for comparing strategies);
- records are batched *before* parsing (one vectorised parse per batch, ~3x faster than per record).

Masking is not done here: it is dynamic, drawn in the training step from the step's seed.
"""

from __future__ import annotations

import os
from typing import List, Optional

import tensorflow as tf

from electra_tf.data import tfrecord_io

# Official: a shuffle of 100 records after the interleave; a larger buffer mixes documents better
# at a negligible memory cost (records are ~1-4 KB).
RECORD_SHUFFLE_BUFFER = 1000
# Official: cycle_length = min(4, number of files).
MAX_INTERLEAVE_CYCLE = 4
# Temporary shard names of build_pretraining_dataset.py (electra_tf.data.builder), whose manifest
# is written last: such files and no manifest mean a build that was killed.
PARTIAL_PREFIX = ".partial-"
# Records per read in `verify_records` (a vectorised parse; the size only sets memory use).
VERIFY_BATCH = 1024


class DataError(ValueError):
    """The pretraining data is missing or does not match the config."""


def list_files(patterns: str) -> List[str]:
    """Sorted union of the files matched by comma-separated globs (official `pretrain_tfrecords`).

    Raises:
        DataError: no file matches.
    """
    files = set()
    for pattern in (p.strip() for p in patterns.split(",")):
        if pattern:
            files.update(tf.io.gfile.glob(pattern))
    if not files:
        raise DataError(f"no TFRecord files match {patterns!r} "
                        "(build them with build_pretraining_dataset.py)")
    return sorted(files)


def verify_records(paths: List[str], *, max_seq_length: int,
                   expected_counts: Optional[dict] = None) -> int:
    """Reads and parses every record of each file once; returns the number of records.

    The TFRecord reader checks each record's CRC32C, so a garbled or truncated shard fails here,
    named, instead of mid-run; the parse checks the feature names and lengths.

    Args:
        paths: TFRecord files.
        max_seq_length: int. The length every feature must have.
        expected_counts: optional {path: number of records} (from the manifest).

    Raises:
        DataError: naming the file, the record index and what is wrong.
    """
    total = 0
    for path in paths:
        count = 0
        try:
            for records in tf.data.TFRecordDataset(path).batch(VERIFY_BATCH):
                tfrecord_io.parse_example(records, max_seq_length)
                count += int(records.shape[0])
        except tf.errors.DataLossError as e:
            raise DataError(f"{path}: corrupted or truncated TFRecord file after {count} good "
                            f"records ({_first_line(e)}); rebuild the dataset") from None
        except tf.errors.InvalidArgumentError as e:
            raise DataError(f"{path}: records near #{count} are not examples with the features "
                            f"{', '.join(tfrecord_io.FEATURE_NAMES)} of length {max_seq_length} "
                            f"({_first_line(e)})") from None
        expected = (expected_counts or {}).get(os.path.abspath(path))
        if expected is not None and count != expected:
            raise DataError(f"{path} holds {count} records but its manifest lists {expected}; "
                            "rebuild the dataset")
        total += count
    return total


def find_bad_file(patterns: str, max_seq_length: int) -> Optional[str]:
    """The DataError message for the first unreadable file of `patterns`, or None (used to name
    the file after a record fails mid-run: tf.data's own message has no file name)."""
    for path in list_files(patterns):
        try:
            verify_records([path], max_seq_length=max_seq_length)
        except DataError as e:
            return str(e)
    return None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def validate_dataset(patterns: str, *, max_seq_length: int, vocab_sha256: str, vocab_size: int,
                     split: str = "train", verify: bool = False) -> Optional[dict]:
    """Checks the builder's manifest beside the matched shards against the training config.

    Every directory holding matched files must have a `manifest.json` whose vocab checksum and
    max_seq_length agree, and the matched shards must be the manifest's (sizes included).

    With `verify`, every record is also read once (`verify_records`: CRC, features, counts).

    Returns:
        A summary {"num_examples": int or None, "manifests": [paths]}; num_examples is None when
        a directory has no manifest (data built by another tool: checked only by parsing).

    Raises:
        DataError: a mismatch, naming the manifest and both values.
    """
    files = list_files(patterns)
    total, manifests = 0, []
    for directory in sorted({os.path.dirname(f) for f in files}):
        manifest_path = os.path.join(directory, tfrecord_io.MANIFEST_NAME)
        if not os.path.exists(manifest_path):
            partial = [n for n in os.listdir(directory) if n.startswith(PARTIAL_PREFIX)]
            if partial:
                raise DataError(f"{directory} holds an interrupted dataset build ({partial[0]}, no "
                                f"{tfrecord_io.MANIFEST_NAME}): rerun build_pretraining_dataset.py "
                                "with --overwrite")
            total = None
            if verify:
                verify_records([f for f in files if os.path.dirname(f) == directory],
                               max_seq_length=max_seq_length)
            continue
        try:
            manifest = tfrecord_io.read_manifest(manifest_path)
            tfrecord_io.check_manifest(manifest, max_seq_length=max_seq_length,
                                       vocab_sha256=vocab_sha256, vocab_size=vocab_size)
            listed = {os.path.abspath(p) for p in tfrecord_io.shard_paths(manifest, directory, split)}
        except tfrecord_io.ManifestError as e:
            raise DataError(f"{manifest_path}: {e}") from None
        matched = {os.path.abspath(f) for f in files if os.path.dirname(f) == directory}
        stray = sorted(matched - listed)
        if stray:
            raise DataError(f"{stray[0]} matches the {split} file pattern but is not listed in "
                            f"{manifest_path} (a leftover or foreign shard?)")
        manifests.append(manifest_path)
        if verify:
            counts = {os.path.abspath(os.path.join(directory, sh["file"])): sh["examples"]
                      for sh in manifest["splits"][split]["shards"]}
            verify_records(sorted(matched), max_seq_length=max_seq_length, expected_counts=counts)
        if total is not None:
            total += sum(s["examples"] for s in manifest["splits"][split]["shards"]
                         if os.path.abspath(os.path.join(directory, s["file"])) in matched)
    return {"num_examples": total, "manifests": manifests}


def make_dataset(patterns: str, *, batch_size: int, max_seq_length: int, is_training: bool,
                 seed: int = 0, input_context: Optional[tf.distribute.InputContext] = None,
                 repeat: bool = True) -> tf.data.Dataset:
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

    Returns:
        A dataset of dicts {"input_ids", "input_mask", "segment_ids"}, int32 [batch_size,
        max_seq_length], remainder dropped.
    """
    files = list_files(patterns)
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    dataset = tf.data.Dataset.from_tensor_slices(files)
    shard_records = num_pipelines > 1 and len(files) < num_pipelines
    if num_pipelines > 1 and not shard_records:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if is_training:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    cycle = min(MAX_INTERLEAVE_CYCLE, len(files))
    dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=cycle,
                                 num_parallel_calls=cycle, deterministic=True)
    if shard_records:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if is_training:
        dataset = dataset.shuffle(RECORD_SHUFFLE_BUFFER, seed=seed + 1)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda records: tfrecord_io.parse_example(records, max_seq_length),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)
