"""The TensorFlow-free reader (`record_reader.BatchReader`) against the TF pipeline.

The order both follow (`order`): the hash in numpy and TensorFlow bit for bit. The reader: the
TF pipeline's batches, bit for bit and in order (training and evaluation, more and fewer files
than the interleave cycle, across epochs and record windows, file and record sharding,
record plans), exact resume from a JSON state, damaged records treated as the TF path treats
them, the dataset checks without TensorFlow, and all of it in a child where TensorFlow cannot
be imported.
"""

import gc
import json
import os
import struct

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.build.example_builder import PackedExample
from electra_tf.data.records import (example_decoding, integrity, order, pipeline, record_crc,
                                     record_framing, record_reader, record_scan, tfrecord_io)
from electra_tf.errors import DataError
from tests import backends, pretraining_fixtures as fx

L = 8  # sequence length of the test records
WINDOW = order.RECORD_SHUFFLE_WINDOW


def _example(index):
    """Record `index`: input_ids[0] is the index; the rest are 1-3 byte varints; mask and
    segments vary, so every feature is compared."""
    rng = np.random.default_rng(index)
    n = int(rng.integers(3, L + 1))
    ids = [index] + rng.integers(5, 300_000, n - 1).tolist() + [0] * (L - n)
    first = int(rng.integers(1, n))
    return {"input_ids": ids, "input_mask": [1] * n + [0] * (L - n),
            "segment_ids": [0] * first + [1] * (n - first) + [0] * (L - n)}


def _write_shards(directory, sizes, deterministic=True):
    """Shards of `sizes` records, numbered globally; returns their glob and paths. Alternate
    shards use TensorFlow's default (map order not sorted) serialisation."""
    os.makedirs(directory, exist_ok=True)
    paths, base = [], 0
    for f, size in enumerate(sizes):
        name = tfrecord_io.shard_name(tfrecord_io.TRAIN_PREFIX, f, len(sizes))
        path = os.path.join(directory, name)
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(base, base + size):
                example = tfrecord_io.make_tf_example(_example(i))
                writer.write(example.SerializeToString(deterministic=deterministic or f % 2 == 0))
        paths.append(path)
        base += size
    return os.path.join(directory, tfrecord_io.TRAIN_PREFIX + "*"), paths


def _context(num, pipeline_id):
    if num == 1:
        return None
    return tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=pipeline_id,
                                      num_replicas_in_sync=num)


def _tf_batches(pattern, num_batches, *, num=1, pipeline_id=0, **kwargs):
    dataset = pipeline.make_dataset(pattern, input_context=_context(num, pipeline_id), **kwargs)
    return [{k: v.numpy() for k, v in batch.items()}
            for batch, _ in zip(dataset, range(num_batches))]


def _reader(pattern, *, num=1, pipeline_id=0, **kwargs):
    return record_reader.BatchReader(pattern, num_input_pipelines=num,
                                     input_pipeline_id=pipeline_id, **kwargs)


def _reader_batches(pattern, num_batches, prefetch=2, **kwargs):
    with _reader(pattern, prefetch=prefetch, **kwargs) as reader:
        return [batch for batch, _ in zip(reader, range(num_batches))]


def _assert_same(expected, actual):
    assert len(expected) == len(actual)
    for i, (a, b) in enumerate(zip(expected, actual)):
        assert sorted(a) == sorted(b) == sorted(tfrecord_io.FEATURE_NAMES)
        for name in a:
            assert b[name].dtype == np.int32 and b[name].shape == a[name].shape, (i, name)
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"batch {i}, {name}")


# ------------------------------------------------------------------------------------------------
# The order: one hash, two implementations
# ------------------------------------------------------------------------------------------------
def _murmur3_reference(seed, a, b):
    """MurmurHash3_x86_32 of the 8 bytes (a, b) little-endian, written from the algorithm."""
    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    h = seed & 0xFFFFFFFF
    for word in struct.unpack("<II", struct.pack("<II", a & 0xFFFFFFFF, b & 0xFFFFFFFF)):
        k = rotl((word * 0xCC9E2D51) & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 8
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ (h >> 16)


@pytest.mark.parametrize("seed", [0, 1, 7, 2**31 - 1, 2**32 - 1, 2**32 + 5, -3, 12345678901])
def test_hash_is_murmur3_and_numpy_equals_tensorflow_bitwise(seed):
    rng = np.random.default_rng(seed % 1000)
    a = np.concatenate([np.arange(300), rng.integers(-2**62, 2**62, 3000),
                        [2**32 - 1, 2**32, 2**31, -1]])
    b = np.concatenate([np.arange(300)[::-1], rng.integers(-2**62, 2**62, 3000), [0, 1, 2, 3]])
    expected = order.hash32(seed, a, b)
    assert expected.dtype == np.uint32
    np.testing.assert_array_equal(order.hash32_tf(seed, tf.constant(a), tf.constant(b)).numpy(),
                                  expected)
    # int32 tensors and Python ints too (the pipeline's counters and window sizes).
    small = a % 2**31
    np.testing.assert_array_equal(order.hash32_tf(seed, tf.constant(small, tf.int32), 5).numpy(),
                                  order.hash32(seed, small, 5))
    for i in range(0, len(a), 331):
        assert int(expected[i]) == _murmur3_reference(seed, int(a[i]), int(b[i]))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_permutations_numpy_equal_tensorflow(n):
    for seed, key in [(0, 0), (3, 1), (2**32 - 1, 2**20), (-8, 999)]:
        file_np = order.file_order(seed, key, n)
        assert sorted(file_np.tolist()) == list(range(n))
        np.testing.assert_array_equal(
            order.file_order_tf(seed, tf.constant(key, tf.int64), n).numpy(), file_np)
        np.testing.assert_array_equal(
            order.record_order_tf(seed, tf.constant(key, tf.int64), tf.constant(n)).numpy(),
            order.record_order(seed, key, n))
    if n > 2:  # keyed: other epochs, windows and seeds give other orders
        assert not np.array_equal(order.file_order(0, 0, n), order.file_order(0, 1, n))
        assert not np.array_equal(order.file_order(0, 0, n), order.record_order(0, 0, n))


def test_pipeline_files_shard_files_when_enough_else_records():
    files = [f"f{i}" for i in range(5)]
    assert order.pipeline_files(files, 2, 1) == (["f1", "f3"], False)
    assert order.pipeline_files(files[:1], 2, 1) == (["f0"], True)
    assert order.pipeline_files(files, 1, 0) == (files, False)
    with pytest.raises(ValueError):
        order.pipeline_files(files, 2, 2)


# ------------------------------------------------------------------------------------------------
# CRC32C and example decoding
# ------------------------------------------------------------------------------------------------
def test_crc32c_known_value_and_batch_equals_scalar():
    assert record_crc.crc32c(b"123456789") == 0xE3069283
    assert record_crc.crc32c(b"") == 0
    rng = np.random.default_rng(0)
    lengths = [0, 1, 7, 8, 9, 15, 16, 17] + rng.integers(0, 5000, 300).tolist() + [70_000]
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    expected = [record_crc.crc32c(r) for r in records]
    np.testing.assert_array_equal(record_crc.crc32c_batch(records), expected)
    assert record_crc.crc32c_batch([]).shape == (0,)


def test_reading_checks_the_crcs_tensorflow_wrote(tmp_path):
    _, (path,) = _write_shards(str(tmp_path), [50])
    assert list(record_framing.iter_records(path)) == [
        r.numpy() for r in tf.data.TFRecordDataset(path)]


def _unpacked_int64_example(features):
    """An Example whose int64 values are written one varint field each (not packed)."""
    def varint(v):
        return tfrecord_io._varint(v & (2**64 - 1))

    def message(field, payload):
        return bytes([field << 3 | 2]) + varint(len(payload)) + payload

    entries = b""
    for name, values in features.items():
        int64_list = b"".join(b"\x08" + varint(v) for v in values)
        feature = message(3, int64_list)
        entries += message(1, message(1, name.encode()) + message(2, feature))
    return message(1, entries)


def test_decode_equals_tensorflow_parse_and_flags_what_it_rejects():
    good = [_example(i) for i in range(20)]
    extreme = {"input_ids": [2**31 + 5, -1, -2**63, 2**63 - 1, 2**32 + 7, 0, 127, 128],
               "input_mask": [1] * L, "segment_ids": [0] * L}
    serializer = tfrecord_io.ExampleSerializer(L, cls_id=2, sep_id=3)
    records = ([tfrecord_io.make_tf_example(e).SerializeToString() for e in good]
               + [tfrecord_io.make_tf_example(e).SerializeToString(deterministic=True)
                  for e in good]
               + serializer.serialize([PackedExample([7, 300, 70000], [9, 1], 0)])
               + [tfrecord_io.make_tf_example(extreme).SerializeToString(),
                  _unpacked_int64_example(good[3])])
    with_extra = tfrecord_io.make_tf_example(good[4])
    with_extra.features.feature["other"].bytes_list.value.append(b"x")
    records.append(with_extra.SerializeToString())
    short = tfrecord_io.make_tf_example(good[5])
    del short.features.feature["segment_ids"].int64_list.value[-1]
    missing = tfrecord_io.make_tf_example(good[6])
    del missing.features.feature["input_mask"]
    floats = tfrecord_io.make_tf_example(good[7])
    floats.features.feature["input_ids"].float_list.value.extend([1.0] * L)
    bad = [short.SerializeToString(), missing.SerializeToString(), floats.SerializeToString(),
           b"\xff\xff\xff", b"", records[0][:-3], b"\x0a\x05\x0a\x03\x0a\x01"]
    decoded = example_decoding.decode_examples(records + bad, L)
    expected_bad = []
    for i, record in enumerate(records + bad):
        try:
            parsed = tfrecord_io.parse_example(tf.constant(record), L)
        # (TensorFlow's message quotes the record: bytes that are not UTF-8 fail to decode.)
        except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
            expected_bad.append(i)
            continue
        for k, name in enumerate(tfrecord_io.FEATURE_NAMES):
            np.testing.assert_array_equal(decoded.features[i, k], parsed[name].numpy(),
                                          err_msg=f"record {i}, {name}")
    assert np.flatnonzero(decoded.bad).tolist() == expected_bad
    assert expected_bad == list(range(len(records), len(records) + len(bad)))
    assert "segment_ids has 7 values" in decoded.reasons[len(records)]
    assert "no feature input_mask" in decoded.reasons[len(records) + 1]


# ------------------------------------------------------------------------------------------------
# The reader equals the TF pipeline
# ------------------------------------------------------------------------------------------------
# (file sizes, input pipelines): more files than the interleave cycle (one empty), fewer, whole
# record windows, file sharding, record sharding.
CASES = {
    "six_files": ([13, 7, 0, 22, 5, 9], 1),
    "two_files": ([30, 12], 1),
    "windows": ([1500, 700, 1300], 1),
    "file_sharding": ([40, 41, 39, 40, 17], 2),
    "record_sharding": ([60], 2),
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("record_reader")
    return {name: _write_shards(str(root / name), sizes, deterministic=name != "two_files")[0]
            for name, (sizes, _) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "eval"])
def test_reader_equals_the_tf_pipeline(shards, case, is_training):
    sizes, num = CASES[case]
    records = sum(sizes) // num
    for pipeline_id in range(num):
        for batch_size, repeat in [(4, True), (7, False)]:
            # Repeating: 2.5 epochs of this pipeline's records; one epoch: to the end.
            num_batches = (5 * records) // (2 * batch_size) + 2
            args = dict(batch_size=batch_size, max_seq_length=L, is_training=is_training,
                        seed=3, repeat=repeat, num=num, pipeline_id=pipeline_id)
            expected = _tf_batches(shards[case], num_batches, **args)
            if not repeat:
                assert len(expected) < num_batches  # the whole epoch, remainder dropped
            _assert_same(expected, _reader_batches(shards[case], num_batches, **args))


def test_other_seeds_give_other_orders_in_both(shards):
    args = dict(batch_size=5, max_seq_length=L, is_training=True)
    for seed in (0, 11):
        _assert_same(_tf_batches(shards["six_files"], 8, seed=seed, **args),
                     _reader_batches(shards["six_files"], 8, seed=seed, **args))
    a, b = (_reader_batches(shards["six_files"], 8, seed=s, **args) for s in (0, 11))
    assert any(not np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))


def test_record_plan_reads_only_planned_records_like_the_tf_pipeline(tmp_path):
    pattern, paths = _write_shards(str(tmp_path), [30, 25, 40, 12, 20])
    plan = {paths[0]: {"take": 30, "skip": []},
            paths[1]: {"take": 21, "skip": [0, 5, 6]},   # a cut file with skipped records
            paths[2]: {"take": 40, "skip": [39]},
            paths[4]: {"take": 3, "skip": [1]}}          # paths[3] is not read at all
    for is_training, num, pipeline_id in [(True, 1, 0), (False, 1, 0), (True, 2, 1)]:
        args = dict(batch_size=3, max_seq_length=L, is_training=is_training, seed=2,
                    num=num, pipeline_id=pipeline_id, record_plan=plan)
        expected = _tf_batches(pattern, 70, **args)
        _assert_same(expected, _reader_batches(pattern, 70, **args))
    ids = np.concatenate([b["input_ids"][:, 0] for b in _reader_batches(
        pattern, 1000, batch_size=1, max_seq_length=L, is_training=False, repeat=False,
        record_plan=plan)])
    planned = ([i for i in range(30)] + [30 + j for j in range(21) if j not in (0, 5, 6)]
               + [55 + j for j in range(39)] + [107, 109])
    assert sorted(ids.tolist()) == planned


# ------------------------------------------------------------------------------------------------
# Position: state() and restore()
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case,is_training", [("windows", True), ("six_files", True),
                                              ("six_files", False), ("record_sharding", True)])
def test_restore_continues_exactly_from_a_json_state(shards, case, is_training):
    sizes, num = CASES[case]
    args = dict(batch_size=6, max_seq_length=L, is_training=is_training, seed=4, num=num,
                pipeline_id=num - 1)
    per_epoch = sum(sizes) // num // 6
    total = 2 * per_epoch + 5
    reference = _reader_batches(shards[case], total, **args)
    _assert_same(_tf_batches(shards[case], total, **args), reference)
    # The start, inside the first window, on and past window and epoch boundaries.
    positions = sorted(k for k in {0, 1, 3, WINDOW // 6, WINDOW // 6 + 1, per_epoch,
                                   per_epoch + 1, total - 1} if k < total)
    states = {}
    with _reader(shards[case], prefetch=3, **args) as reader:
        for k in range(total):
            if k in positions:
                states[k] = json.loads(json.dumps(reader.state()))
            next(reader)
    for k in positions:
        with _reader(shards[case], prefetch=k % 3, **args) as restored:
            restored.restore(states[k])
            _assert_same(reference[k:], [next(restored) for _ in range(total - k)])


def test_restore_reads_at_most_one_window_again(shards, monkeypatch):
    args = dict(batch_size=8, max_seq_length=L, is_training=True, seed=1)
    with _reader(shards["windows"], prefetch=0, **args) as reader:
        for _ in range(400):  # 3,200 records: past three windows and the first epoch (3,500)
            next(reader)
        state = reader.state()
        expected = next(reader)
    reads = []
    real_read = record_framing.FileReader.read

    def counting_read(self):
        reads.append(1)
        return real_read(self)

    monkeypatch.setattr(record_framing.FileReader, "read", counting_read)
    with _reader(shards["windows"], prefetch=0, **args) as restored:
        restored.restore(state)
        _assert_same([expected], [next(restored)])
    assert len(reads) <= WINDOW + 8


def test_state_of_another_reader_is_refused(shards):
    args = dict(batch_size=4, max_seq_length=L, is_training=True)
    with _reader(shards["two_files"], seed=1, prefetch=0, **args) as reader:
        next(reader)
        state = reader.state()
    with _reader(shards["two_files"], seed=2, prefetch=0, **args) as other:
        with pytest.raises(ValueError, match="another reader"):
            other.restore(state)
        with pytest.raises(ValueError, match="version"):
            other.restore(dict(state, version=99))


def test_close_stops_the_prefetch_thread(shards):
    reader = _reader(shards["windows"], batch_size=4, max_seq_length=L, is_training=True,
                     prefetch=2)
    next(reader)
    thread = reader._thread
    assert thread is not None and thread.is_alive()
    reader.close()
    assert not thread.is_alive()
    with pytest.raises(ValueError, match="closed"):
        next(reader)
    # A reader dropped without close() stops its thread too (the thread holds no reference
    # to it).
    reader = _reader(shards["windows"], batch_size=4, max_seq_length=L, is_training=True,
                     prefetch=2)
    next(reader)
    thread = reader._thread
    del reader
    gc.collect()
    assert not thread.is_alive()


# ------------------------------------------------------------------------------------------------
# Damaged data: as the TF path
# ------------------------------------------------------------------------------------------------
def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def _record_offsets(path):
    offsets, pos = [], 0
    data = open(path, "rb").read()
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return offsets


def _batches_until_error(batches):
    """(batches read, the exception that stopped them)."""
    out = []
    try:
        for batch in batches:
            out.append({k: np.asarray(v) for k, v in batch.items()})
    except Exception as e:  # noqa: BLE001 (the point of the test)
        return out, e
    raise AssertionError("no error")


@pytest.mark.parametrize("damage", ["data", "length", "truncated"])
@pytest.mark.parametrize("is_training", [True, False], ids=["train", "eval"])
def test_damaged_record_stops_both_at_the_same_batch_naming_it(tmp_path, damage, is_training):
    pattern, paths = _write_shards(str(tmp_path), [300, 400, 350, 500, 450])
    shard = paths[2]
    offsets = _record_offsets(shard)
    if damage == "data":
        _flip(shard, offsets[123] + 14)
    elif damage == "length":
        _flip(shard, offsets[123] + 1)
    else:
        with open(shard, "r+b") as f:
            f.truncate(offsets[123] + 20)
    args = dict(batch_size=8, max_seq_length=L, is_training=is_training, seed=0)
    expected, tf_error = _batches_until_error(pipeline.make_dataset(pattern, **args))
    assert isinstance(tf_error, tf.errors.DataLossError)
    actual, error = _batches_until_error(_reader(pattern, prefetch=2, **args))
    _assert_same(expected, actual)
    assert isinstance(error, DataError)
    assert f"{shard}: corrupted or truncated TFRecord file at record #123 " \
           f"(byte {offsets[123]}" in str(error)
    # The trainer's error path names the same file.
    assert shard in integrity.find_bad_file(pattern, L)


def test_malformed_record_fails_at_the_batch_that_holds_it(tmp_path):
    pattern, paths = _write_shards(str(tmp_path), [300, 400, 350])
    shard = paths[1]
    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(shard)]
    del examples[77].features.feature["input_ids"].int64_list.value[-1]
    with tf.io.TFRecordWriter(shard) as writer:
        for example in examples:
            writer.write(example.SerializeToString())
    for is_training in (True, False):
        args = dict(batch_size=8, max_seq_length=L, is_training=is_training, seed=0)
        expected, tf_error = _batches_until_error(pipeline.make_dataset(pattern, **args))
        assert isinstance(tf_error, tf.errors.InvalidArgumentError)
        actual, error = _batches_until_error(_reader(pattern, **args))
        _assert_same(expected, actual)
        assert str(error).startswith(f"{shard}: record #77 is not an example with the features")


def test_scan_without_tensorflow_equals_the_tf_scan(tmp_path):
    _, paths = _write_shards(str(tmp_path), [60, 60, 60, 60, 60])
    offsets = _record_offsets(paths[0])
    _flip(paths[0], offsets[40] + 14)  # data CRC
    _flip(paths[1], offsets[7] + 3)    # length CRC
    with open(paths[2], "r+b") as f:
        f.truncate(offsets[50] + 30)     # inside a record
    with open(paths[3], "r+b") as f:
        f.truncate(offsets[50] + 5)      # inside a header: a clean end for both readers
    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(paths[4])]
    for i in (3, 17, 59):
        del examples[i].features.feature["segment_ids"]
    with tf.io.TFRecordWriter(paths[4]) as writer:
        for example in examples:
            writer.write(example.SerializeToString())
    for path in paths:
        for stop_at_first in (False, True):
            for batch in (16, 1024):
                monkey_batch = integrity.VERIFY_BATCH
                integrity.VERIFY_BATCH = batch
                try:
                    expected = integrity.scan_file(path, L, stop_at_first)
                finally:
                    integrity.VERIFY_BATCH = monkey_batch
                actual = record_scan.scan_file(path, L, stop_at_first, batch=batch)
                assert actual[:3] == expected[:3], (path, stop_at_first, batch)
                assert (actual.error is None) == (expected.error is None)


def test_skip_bad_records_plan_drives_the_reader_like_the_tf_pipeline(tmp_path):
    data_dir = str(tmp_path / "data")
    out = fx.write_dataset(data_dir, num_train_shards=3, examples_per_shard=40)
    pattern = os.path.join(out, tfrecord_io.TRAIN_PREFIX + "*")
    shard = os.path.join(out, tfrecord_io.shard_name(tfrecord_io.TRAIN_PREFIX, 1, 3))
    _flip(shard, _record_offsets(shard)[25] + 20)
    from electra_tf.vocab import load_vocab

    summary = integrity.validate_dataset(
        pattern, max_seq_length=fx.MAX_SEQ_LENGTH, vocab_size=fx.VOCAB_SIZE,
        vocab_sha256=load_vocab(os.path.join(data_dir, "vocab.txt")).sha256, skip_bad_records=True)
    assert summary["record_plan"][shard] == {"take": 25, "skip": []}
    args = dict(batch_size=8, max_seq_length=fx.MAX_SEQ_LENGTH, is_training=True, seed=9,
                record_plan=summary["record_plan"])
    _assert_same(_tf_batches(pattern, 40, **args), _reader_batches(pattern, 40, **args))


# ------------------------------------------------------------------------------------------------
# No TensorFlow at all
# ------------------------------------------------------------------------------------------------
_CHILD = """
import json
assert sys.modules.get("tensorflow") is None
from electra_tf.data.records import integrity, record_reader
from electra_tf.errors import DataError
args = json.loads(inp["args"].item())
summary = integrity.validate_dataset(args["pattern"], max_seq_length=args["L"],
                                     vocab_sha256=args["sha"], vocab_size=args["vocab_size"],
                                     skip_bad_records=True)
out["summary"] = json.dumps({k: summary[k] for k in ("num_examples", "skipped_records",
                                                    "record_plan", "problems")})
out["files"] = json.dumps(integrity.list_files(args["pattern"]))
for split, training in (("train", True), ("eval", False)):
    with record_reader.BatchReader(args["pattern"], batch_size=8, max_seq_length=args["L"],
                                   is_training=training, seed=5,
                                   record_plan=summary["record_plan"]) as reader:
        batches = [next(reader) for _ in range(20)]
        state = json.dumps(reader.state())
    for name in batches[0]:
        out[f"{split}_{name}"] = np.stack([b[name] for b in batches])
    out[f"{split}_state"] = state
try:
    integrity.verify_records(sorted(summary["record_plan"]), max_seq_length=args["L"])
except DataError as e:
    out["verify_error"] = str(e)
assert "tensorflow" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
"""


def test_reader_and_dataset_checks_run_without_tensorflow(tmp_path):
    data_dir = str(tmp_path / "data")
    out = fx.write_dataset(data_dir, num_train_shards=5, examples_per_shard=40)
    pattern = os.path.join(out, tfrecord_io.TRAIN_PREFIX + "*")
    shard = os.path.join(out, tfrecord_io.shard_name(tfrecord_io.TRAIN_PREFIX, 3, 5))
    _flip(shard, _record_offsets(shard)[31] + 20)
    from electra_tf.vocab import load_vocab

    validate = dict(max_seq_length=fx.MAX_SEQ_LENGTH, vocab_size=fx.VOCAB_SIZE,
                    vocab_sha256=load_vocab(os.path.join(data_dir, "vocab.txt")).sha256)
    summary = integrity.validate_dataset(pattern, skip_bad_records=True, **validate)
    args = {"pattern": pattern, "L": fx.MAX_SEQ_LENGTH, "sha": validate["vocab_sha256"],
            "vocab_size": fx.VOCAB_SIZE}
    child = backends.run_on_backend("jax", _CHILD, inputs={"args": np.asarray(json.dumps(args))},
                                    timeout=300)
    child_summary = json.loads(child["summary"].item())
    assert child_summary["record_plan"] == summary["record_plan"]
    assert child_summary["skipped_records"] == summary["skipped_records"] == 40 - 31
    assert child_summary["num_examples"] == summary["num_examples"]
    assert [p.split(":")[0] for p in child_summary["problems"]] == [shard]
    assert json.loads(child["files"].item()) == integrity.list_files(pattern)
    for split, training in (("train", True), ("eval", False)):
        expected = _tf_batches(pattern, 20, batch_size=8, max_seq_length=fx.MAX_SEQ_LENGTH,
                               is_training=training, seed=5, record_plan=summary["record_plan"])
        actual = [{name: child[f"{split}_{name}"][i] for name in tfrecord_io.FEATURE_NAMES}
                  for i in range(20)]
        _assert_same(expected, actual)
        with record_reader.BatchReader(pattern, batch_size=8, max_seq_length=fx.MAX_SEQ_LENGTH,
                                       is_training=training, seed=5,
                                       record_plan=summary["record_plan"]) as reader:
            reader.restore(json.loads(child[f"{split}_state"].item()))  # the child's position
            _assert_same(_tf_batches(pattern, 21, batch_size=8, max_seq_length=fx.MAX_SEQ_LENGTH,
                                     is_training=training, seed=5,
                                     record_plan=summary["record_plan"])[20:], [next(reader)])
    # A whole-file check of the damaged shard names it in both worlds.
    assert "verify_error" in child and shard in child["verify_error"].item()
