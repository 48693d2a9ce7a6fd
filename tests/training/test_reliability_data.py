"""Fault injection on the training data: garbled, truncated and foreign TFRecord shards.

Shards are damaged on disk after a real (fixture) build with its manifest: the trainer must refuse
at start naming the file (sizes against the manifest always; records with `verify_tfrecords`),
or, when a record fails mid-run, stop naming the file.
"""

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.errors import DataError
from electra_tf.data.records import integrity, pipeline, tfrecord_io
from electra_tf.training.tf import trainer as trainer_lib
from tests import pretraining_fixtures as fx


pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


def _dataset(tmp_path, name):
    data_dir = str(tmp_path / name)
    out = fx.write_dataset(data_dir)
    return data_dir, os.path.join(out, tfrecord_io.shard_name(tfrecord_io.TRAIN_PREFIX, 1, 2))


def _garble(path):
    """Flips bytes in the middle of the file (size unchanged, so only a record read finds it)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        chunk = f.read(16)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))


def test_garbled_shard_is_refused_at_start_with_verify(tmp_path):
    data_dir, shard = _dataset(tmp_path, "garbled")
    _garble(shard)
    with pytest.raises(DataError, match=rf"{shard}: corrupted or truncated TFRecord"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, verify_tfrecords=True))
    assert not os.path.exists(os.path.join(data_dir, "models"))  # refused before writing


def test_garbled_shard_mid_run_stops_naming_the_file(tmp_path):
    data_dir, shard = _dataset(tmp_path, "garbled_mid_run")
    _garble(shard)
    config = fx.tiny_config(data_dir, num_train_steps=40, iterations_per_loop=5,
                            save_checkpoints_steps=5)
    trainer = trainer_lib.Trainer(config)  # sizes match the manifest: accepted without verify
    with pytest.raises(trainer_lib.TrainingError, match=rf"failed to read at step \d+: {shard}"):
        trainer.train()


def test_truncated_shard_is_refused_at_start(tmp_path):
    data_dir, shard = _dataset(tmp_path, "truncated")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(DataError, match=os.path.basename(shard)):
        trainer_lib.Trainer(fx.tiny_config(data_dir))
    # Without a manifest (data from another tool), verify still names the file.
    os.remove(os.path.join(os.path.dirname(shard), tfrecord_io.MANIFEST_NAME))
    with pytest.raises(DataError, match=rf"{shard}: corrupted or truncated"):
        integrity.validate_dataset(os.path.join(os.path.dirname(shard), "pretrain_data.tfrecord*"),
                                  max_seq_length=fx.MAX_SEQ_LENGTH, vocab_sha256="", vocab_size=100,
                                  verify=True)


def _rewrite_shard(shard, transform):
    """Rewrites every record through `transform` and fixes the manifest's byte count, so only
    reading the records can find the problem."""
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(shard)]
    with tf.io.TFRecordWriter(shard) as writer:
        for example in records:
            writer.write(transform(example).SerializeToString())
    manifest_path = os.path.join(os.path.dirname(shard), tfrecord_io.MANIFEST_NAME)
    manifest = json.load(open(manifest_path))
    for entry in manifest["splits"]["train"]["shards"]:
        if entry["file"] == os.path.basename(shard):
            entry["bytes"] = os.path.getsize(shard)
    json.dump(manifest, open(manifest_path, "w"))


def test_wrong_feature_name_is_refused_naming_the_file(tmp_path):
    data_dir, shard = _dataset(tmp_path, "renamed")

    def rename(example):
        features = example.features.feature
        features["segment_id"].CopyFrom(features["segment_ids"])
        del features["segment_ids"]
        return example

    _rewrite_shard(shard, rename)
    with pytest.raises(DataError, match=rf"{shard}: .*segment_ids of length 32"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, verify_tfrecords=True))


def test_wrong_feature_length_is_refused_naming_the_file(tmp_path):
    data_dir, shard = _dataset(tmp_path, "short")

    def shorten(example):
        ids = example.features.feature["input_ids"].int64_list.value
        del ids[-1]
        return example

    _rewrite_shard(shard, shorten)
    with pytest.raises(DataError, match=rf"{shard}: .*of length 32"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, verify_tfrecords=True))


def test_record_count_must_match_the_manifest(tmp_path):
    data_dir, shard = _dataset(tmp_path, "count")
    manifest_path = os.path.join(os.path.dirname(shard), tfrecord_io.MANIFEST_NAME)
    manifest = json.load(open(manifest_path))
    manifest["splits"]["train"]["shards"][1]["examples"] += 1
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(DataError, match=rf"{shard} holds 40 records but its manifest lists 41"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, verify_tfrecords=True))


# ------------------------------------------------------------------------------------------------
# skip_bad_records: train on the good records, count the rest
# ------------------------------------------------------------------------------------------------
def _readable_prefix(path):
    """Records the TFRecord reader returns before the first corrupted one (independent count)."""
    count = 0
    iterator = iter(tf.data.TFRecordDataset(path))
    while True:
        try:
            next(iterator)
        except (StopIteration, tf.errors.DataLossError):
            return count
        count += 1


def _all_input_ids(data_dir, record_plan, pattern="pretrain_data.tfrecord*"):
    dataset = pipeline.make_dataset(os.path.join(data_dir, "pretrain_tfrecords", pattern),
                                    batch_size=1, max_seq_length=fx.MAX_SEQ_LENGTH,
                                    is_training=False, repeat=False, record_plan=record_plan)
    return sorted(tuple(batch["input_ids"].numpy()[0].tolist()) for batch in dataset)


def test_skip_bad_records_trains_on_the_readable_part_of_a_garbled_shard(tmp_path, caplog):
    data_dir, shard = _dataset(tmp_path, "garbled_skip")
    _garble(shard)
    readable = _readable_prefix(shard)
    assert 0 < readable < fx.EXAMPLES_PER_SHARD
    config = fx.tiny_config(data_dir, num_train_steps=24, iterations_per_loop=4,
                            save_checkpoints_steps=8, skip_bad_records=True)
    with caplog.at_level("WARNING", logger="electra_tf"):
        trainer = trainer_lib.Trainer(config)
    summary = trainer.dataset_summaries["train"]
    skipped = fx.EXAMPLES_PER_SHARD - readable  # the manifest says how many the shard had
    assert summary["skipped_records"] == skipped
    assert summary["num_examples"] == 2 * fx.EXAMPLES_PER_SHARD - skipped
    assert summary["record_plan"][shard] == {"take": readable, "skip": []}
    assert f"{shard}: unreadable after record #{readable - 1}" in caplog.text
    # 24 steps x 8 = 192 records: the data repeats past the damage without a read error.
    trainer.train()
    assert trainer.step == 24
    values = fx.read_scalars(config.model_dir, ["skipped_records"])["skipped_records"]
    assert values and set(values.values()) == {float(skipped)}, values


def test_skip_bad_records_drops_exactly_the_malformed_records(tmp_path):
    data_dir, shard = _dataset(tmp_path, "malformed_skip")
    clean = _all_input_ids(data_dir, None)
    originals = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(shard)]
    bad = {3, 17, 39}
    position = iter(range(len(originals)))

    def damage_some(example):
        if next(position) in bad:
            del example.features.feature["input_ids"].int64_list.value[-1]
        return example

    _rewrite_shard(shard, damage_some)
    dropped = {tuple(originals[i].features.feature["input_ids"].int64_list.value) for i in bad}
    assert integrity.scan_file(shard, fx.MAX_SEQ_LENGTH).bad_indices == (3, 17, 39)
    # Refusing a file (verify_tfrecords) needs only the first bad record.
    assert integrity.scan_file(shard, fx.MAX_SEQ_LENGTH, stop_at_first=True).bad_indices == (3,)
    summary = integrity.validate_dataset(
        os.path.join(data_dir, "pretrain_tfrecords", "pretrain_data.tfrecord*"),
        max_seq_length=fx.MAX_SEQ_LENGTH, vocab_sha256=_vocab_sha(data_dir),
        vocab_size=fx.VOCAB_SIZE, skip_bad_records=True)
    assert summary["skipped_records"] == 3
    assert summary["record_plan"][shard] == {"take": fx.EXAMPLES_PER_SHARD, "skip": sorted(bad)}
    assert summary["problems"] == [
        f"{shard}: 3 record(s) with other features or lengths (first #3): skipping 3 record(s)"]
    kept = _all_input_ids(data_dir, summary["record_plan"])
    assert kept == sorted(row for row in clean if row not in dropped)
    assert len(kept) == 2 * fx.EXAMPLES_PER_SHARD - 3


def test_record_plan_without_damage_keeps_the_data_order(tmp_path):
    data_dir, _ = _dataset(tmp_path, "undamaged_plan")
    patterns = os.path.join(data_dir, "pretrain_tfrecords", "pretrain_data.tfrecord*")
    summary = integrity.validate_dataset(patterns, max_seq_length=fx.MAX_SEQ_LENGTH,
                                        vocab_sha256=_vocab_sha(data_dir), vocab_size=fx.VOCAB_SIZE,
                                        skip_bad_records=True)
    assert summary["skipped_records"] == 0 and summary["problems"] == []

    def batches(plan):
        dataset = pipeline.make_dataset(patterns, batch_size=8, max_seq_length=fx.MAX_SEQ_LENGTH,
                                        is_training=True, seed=5, record_plan=plan)
        return [b["input_ids"].numpy() for b, _ in zip(dataset, range(25))]

    for planned, plain in zip(batches(summary["record_plan"]), batches(None)):
        np.testing.assert_array_equal(planned, plain)


def test_skip_bad_records_accepts_a_truncated_shard_and_counts_its_lost_records(tmp_path):
    data_dir, shard = _dataset(tmp_path, "truncated_skip")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    readable = _readable_prefix(shard)
    trainer = trainer_lib.Trainer(fx.tiny_config(data_dir, skip_bad_records=True))
    summary = trainer.dataset_summaries["train"]
    assert summary["skipped_records"] == fx.EXAMPLES_PER_SHARD - readable >= 1
    assert summary["record_plan"][shard]["take"] == readable


def test_skip_bad_records_refuses_data_with_no_good_record(tmp_path):
    data_dir, shard = _dataset(tmp_path, "all_bad")
    for path in glob.glob(os.path.join(os.path.dirname(shard), "pretrain_data.tfrecord*")):
        with open(path, "r+b") as f:
            f.write(b"\xff" * 32)  # the first record's header: nothing readable
    with pytest.raises(DataError, match="no readable example"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, skip_bad_records=True))


def _vocab_sha(data_dir):
    from electra_tf.vocab import load_vocab

    return load_vocab(os.path.join(data_dir, "vocab.txt")).sha256
