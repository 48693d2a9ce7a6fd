"""Fault injection on the training data: garbled, truncated and foreign TFRecord shards.

Shards are damaged on disk after a real (fixture) build with its manifest: the trainer must refuse
at start naming the file (sizes against the manifest always; records with `verify_tfrecords`),
or, when a record fails mid-run, stop naming the file.
"""

import json
import os

import keras
import pytest
import tensorflow as tf

from electra_tf.data import pipeline, tfrecord_io
from electra_tf.training import trainer as trainer_lib
from tests import pretraining_fixtures as fx


@pytest.fixture(autouse=True)
def _float32_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


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
    with pytest.raises(pipeline.DataError, match=rf"{shard}: corrupted or truncated TFRecord"):
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
    with pytest.raises(pipeline.DataError, match=os.path.basename(shard)):
        trainer_lib.Trainer(fx.tiny_config(data_dir))
    # Without a manifest (data from another tool), verify still names the file.
    os.remove(os.path.join(os.path.dirname(shard), tfrecord_io.MANIFEST_NAME))
    with pytest.raises(pipeline.DataError, match=rf"{shard}: corrupted or truncated"):
        pipeline.validate_dataset(os.path.join(os.path.dirname(shard), "pretrain_data.tfrecord*"),
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
    with pytest.raises(pipeline.DataError, match=rf"{shard}: .*segment_ids of length 32"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, verify_tfrecords=True))


def test_wrong_feature_length_is_refused_naming_the_file(tmp_path):
    data_dir, shard = _dataset(tmp_path, "short")

    def shorten(example):
        ids = example.features.feature["input_ids"].int64_list.value
        del ids[-1]
        return example

    _rewrite_shard(shard, shorten)
    with pytest.raises(pipeline.DataError, match=rf"{shard}: .*of length 32"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, verify_tfrecords=True))


def test_record_count_must_match_the_manifest(tmp_path):
    data_dir, shard = _dataset(tmp_path, "count")
    manifest_path = os.path.join(os.path.dirname(shard), tfrecord_io.MANIFEST_NAME)
    manifest = json.load(open(manifest_path))
    manifest["splits"]["train"]["shards"][1]["examples"] += 1
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(pipeline.DataError, match=rf"{shard} holds 40 records but its manifest lists 41"):
        trainer_lib.Trainer(fx.tiny_config(data_dir, verify_tfrecords=True))
