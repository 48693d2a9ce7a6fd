"""TFRecord format: fast serialisation equals tf.train.Example; official parsing; manifest."""

import json
import os
import random

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.build.example_builder import PackedExample, example_features
from electra_tf.data.records.tfrecord_io import (FEATURE_NAMES, ExampleSerializer, ManifestError,
                                         check_manifest, make_tf_example, parse_example,
                                         read_manifest, shard_name, shard_paths)

CLS, SEP = 101, 102


def random_examples(n, max_len, seed=0, top_id=2 ** 32):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        n_first = rng.randint(1, max_len - 2)
        n_second = rng.randint(0, max(0, max_len - n_first - 3))
        # Ids of every varint width (1..5 bytes), including 0 and the largest 32-bit id.
        top = [2 ** 7, 2 ** 14, 2 ** 21, 2 ** 28, top_id][i % 5]
        first = [rng.randrange(top) for _ in range(n_first)]
        second = [rng.randrange(top) for _ in range(n_second)]
        out.append(PackedExample(first, second, 0))
    out.append(PackedExample([0, top_id - 1], [], 0))
    out.append(PackedExample(list(range(max_len - 2)), [], 0))  # exactly full
    return out


@pytest.mark.parametrize("max_len", [8, 128, 512])
def test_fast_serialisation_equals_tf_train_example_bytes(max_len):
    examples = random_examples(300, max_len)
    records = ExampleSerializer(max_len, CLS, SEP).serialize(examples)
    assert len(records) == len(examples)
    for ex, record in zip(examples, records):
        expected = make_tf_example(example_features(ex, max_len, CLS, SEP))
        assert record == expected.SerializeToString(deterministic=True)
        assert tf.train.Example.FromString(record) == expected


def test_parse_with_official_feature_spec_round_trip():
    max_len = 16
    examples = random_examples(50, max_len, seed=3, top_id=2 ** 31)  # int32 after parsing
    records = ExampleSerializer(max_len, CLS, SEP).serialize(examples)
    spec = {name: tf.io.FixedLenFeature([max_len], tf.int64) for name in FEATURE_NAMES}
    for ex, record in zip(examples, records):
        parsed = tf.io.parse_single_example(record, spec)
        assert sorted(parsed) == sorted(FEATURE_NAMES)
        expected = example_features(ex, max_len, CLS, SEP)
        for name in FEATURE_NAMES:
            assert parsed[name].dtype == tf.int64
            assert parsed[name].numpy().tolist() == expected[name]
    # parse_example: int32, scalar and batched.
    single = parse_example(records[0], max_len)
    assert {k: v.dtype for k, v in single.items()} == {k: tf.int32 for k in FEATURE_NAMES}
    assert single["input_ids"].shape == (max_len,)
    batch = parse_example(tf.constant(records), max_len)
    assert batch["segment_ids"].shape == (len(records), max_len)
    np.testing.assert_array_equal(
        batch["input_mask"].numpy(),
        [example_features(ex, max_len, CLS, SEP)["input_mask"] for ex in examples])


def test_tfrecord_file_round_trip(tmp_path):
    max_len = 32
    examples = random_examples(20, max_len, seed=5, top_id=2 ** 31)
    path = str(tmp_path / shard_name("pretrain_data.tfrecord", 0, 1))
    with tf.io.TFRecordWriter(path) as writer:
        for record in ExampleSerializer(max_len, CLS, SEP).serialize(examples):
            writer.write(record)
    dataset = tf.data.TFRecordDataset(path).batch(7).map(lambda s: parse_example(s, max_len))
    ids = np.concatenate([b["input_ids"].numpy() for b in dataset])
    assert ids.tolist() == [example_features(ex, max_len, CLS, SEP)["input_ids"] for ex in examples]


def test_serializer_rejects_over_long_examples_and_ids_out_of_range():
    with pytest.raises(ValueError, match="exceeds max_seq_length 8"):
        ExampleSerializer(8, CLS, SEP).serialize([PackedExample([1] * 5, [2], 0)])
    with pytest.raises(ValueError, match="token ids must be in"):
        ExampleSerializer(8, CLS, SEP).serialize([PackedExample([2 ** 32], [], 0)])
    with pytest.raises(ValueError, match="token ids must be in"):
        ExampleSerializer(8, CLS, SEP).serialize([PackedExample([-1], [], 0)])


def test_shard_name_is_official():
    assert shard_name("pretrain_data.tfrecord", 3, 1000) == "pretrain_data.tfrecord-3-of-1000"


def _manifest(tmp_path, **overrides):
    shard = tmp_path / "pretrain_data.tfrecord-0-of-1"
    shard.write_bytes(b"x" * 10)
    manifest = {"format_version": 1, "max_seq_length": 128,
                "vocab": {"path": "v.txt", "sha256": "ab" * 32, "size": 100},
                "splits": {"train": {"shards": [{"file": shard.name, "examples": 1, "bytes": 10}]},
                           "eval": {"shards": []}}}
    manifest.update(overrides)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_read_and_check_manifest(tmp_path):
    _manifest(tmp_path)
    manifest = read_manifest(str(tmp_path))
    assert read_manifest(str(tmp_path / "manifest.json")) == manifest
    check_manifest(manifest, max_seq_length=128, vocab_sha256="ab" * 32, vocab_size=100)
    with pytest.raises(ManifestError, match="max_seq_length 128, but max_seq_length is 512"):
        check_manifest(manifest, max_seq_length=512)
    with pytest.raises(ManifestError, match="differs from the given vocab"):
        check_manifest(manifest, vocab_sha256="cd" * 32)
    with pytest.raises(ManifestError, match="more than vocab_size 50"):
        check_manifest(manifest, vocab_size=50)
    assert shard_paths(manifest, str(tmp_path)) == [str(tmp_path / "pretrain_data.tfrecord-0-of-1")]
    assert shard_paths(manifest, str(tmp_path), "eval") == []
    (tmp_path / "pretrain_data.tfrecord-0-of-1").write_bytes(b"x" * 11)
    with pytest.raises(ManifestError, match="has 11 bytes, the manifest says 10"):
        shard_paths(manifest, str(tmp_path))
    os.remove(tmp_path / "pretrain_data.tfrecord-0-of-1")
    with pytest.raises(ManifestError, match="missing"):
        shard_paths(manifest, str(tmp_path))


def test_read_manifest_errors(tmp_path):
    with pytest.raises(ManifestError, match="no dataset manifest"):
        read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="cannot read dataset manifest"):
        read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1}))
    with pytest.raises(ManifestError, match="lacks key"):
        read_manifest(str(tmp_path))
    _manifest(tmp_path, format_version=99)
    with pytest.raises(ManifestError, match="format_version 99"):
        read_manifest(str(tmp_path))
