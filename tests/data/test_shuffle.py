"""The builder's global shuffle: keys, bucket layouts and the bounded-memory external sort."""

import os
import random

import numpy as np
import pytest

from electra_tf.data.build import shuffle
from electra_tf.data.build.shuffle import BucketLayout, BucketWriter, SortedRun


def test_keys_are_pure_distinct_and_uniform():
    keys = [shuffle.shuffle_key(3, "train", "a/b.txt", i) for i in range(20000)]
    assert keys == [shuffle.shuffle_key(3, "train", "a/b.txt", i) for i in range(20000)]
    assert len(set(keys)) == len(keys)
    assert all(0 <= k < 1 << 64 for k in keys)
    assert shuffle.shuffle_key(4, "train", "a/b.txt", 0) != keys[0]
    assert shuffle.shuffle_key(3, "eval", "a/b.txt", 0) != keys[0]
    assert shuffle.shuffle_key(3, "train", "a/c.txt", 0) != keys[0]
    # Consecutive indices land anywhere: the shard of key i is independent of i.
    shards = np.array([shuffle.shard_of(k, 10) for k in keys])
    assert np.bincount(shards, minlength=10).min() > 1800  # 2000 expected each
    assert abs(np.corrcoef(np.arange(len(keys)), shards)[0, 1]) < 0.03


@pytest.mark.parametrize("num_shards", [1, 3, 7, 1000])
def test_shard_ranges_are_consecutive_and_exact(num_shards):
    starts = [shuffle.shard_start(s, num_shards) for s in range(num_shards)] + [1 << 64]
    assert starts[0] == 0 and starts == sorted(starts)
    for s in range(num_shards):
        assert shuffle.shard_of(starts[s], num_shards) == s
        assert shuffle.shard_of(starts[s + 1] - 1, num_shards) == s


@pytest.mark.parametrize("num_shards,estimated,memory,expected", [
    (4, 10 << 20, 128 << 20, (4, 4, 1)),          # a small corpus: one bucket of all shards
    (1000, 1 << 30, 64 << 20, (1000, 31, 1)),     # many shards: runs of 31 shards (~32 MiB)
    (4, 1 << 30, 64 << 20, (4, 1, 8)),            # few large shards: 8 parts each
    (1, 10 << 30, 1 << 20, (1, 1, 2048)),         # capped at MAX_BUCKETS
    (5000, 1 << 20, 128 << 20, (5000, 5000, 1)),
])
def test_bucket_layout_plan(num_shards, estimated, memory, expected):
    layout = BucketLayout.plan(num_shards, estimated, memory)
    assert (layout.num_shards, layout.shards_per_bucket, layout.buckets_per_shard) == expected
    assert layout.num_buckets <= shuffle.MAX_BUCKETS


@pytest.mark.parametrize("layout", [BucketLayout(7, shards_per_bucket=3),
                                    BucketLayout(3, buckets_per_shard=5), BucketLayout(1)])
def test_buckets_are_key_ranges_and_units_cover_each_shard_once(layout):
    rng = random.Random(0)
    keys = sorted(rng.getrandbits(64) for _ in range(5000))
    keys += [0, (1 << 64) - 1] + [shuffle.shard_start(s, layout.num_shards)
                                  for s in range(layout.num_shards)]
    keys.sort()
    buckets = [layout.bucket_of(k) for k in keys]
    assert buckets == sorted(buckets)  # ascending keys -> ascending buckets
    units = layout.units()
    assert sorted(s for _, shards in units for s in shards) == list(range(layout.num_shards))
    assert sorted(b for bs, _ in units for b in bs) == list(range(layout.num_buckets))
    unit_of_bucket = {b: i for i, (bs, _) in enumerate(units) for b in bs}
    for key, bucket in zip(keys, buckets):
        assert shuffle.shard_of(key, layout.num_shards) in units[unit_of_bucket[bucket]][1]


def _entries(count, seed=0):
    rng = random.Random(seed)
    return [(rng.getrandbits(64), rng.randbytes(rng.randint(1, 300))) for _ in range(count)]


def test_sorted_runs_within_a_tiny_budget_equal_an_in_memory_sort(tmp_path):
    entries = _entries(3000)
    layout = BucketLayout(1)
    writers = [BucketWriter(str(tmp_path), "train", layout, w, buffer_bytes=1 << 12)
               for w in range(2)]
    for i, (key, record) in enumerate(entries):
        writers[i % 2].add(key, record)
    for writer in writers:
        writer.flush()
    paths = [shuffle.bucket_path(str(tmp_path), "train", 0, w) for w in range(2)]
    total = sum(os.path.getsize(p) for p in paths)
    budget = total // 10  # forces a re-scatter into ~20 key ranges
    runs = list(shuffle.iter_sorted_runs(paths, budget, str(tmp_path)))
    assert len(runs) >= 10
    got = [(int(run.keys[i]), run.record(i)) for run in runs for i in range(len(run))]
    assert got == sorted(entries)
    assert max(len(run.data) for run in runs) <= budget
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths)


def test_equal_keys_are_ordered_by_record_bytes():
    records = [b"zz", b"a", b"mm", b"b"]
    data = bytearray()
    for key, record in [(5, records[0]), (1, b"first"), (5, records[1]), (5, records[2]),
                        (9, b"last"), (5, records[3])]:
        data += shuffle.ENTRY.pack(key, len(record)) + record
    run = SortedRun(data)
    assert [run.record(i) for i in range(len(run))] == [b"first", b"a", b"b", b"mm", b"zz",
                                                         b"last"]


def test_damaged_bucket_is_an_error_not_garbage():
    data = bytearray(shuffle.ENTRY.pack(1, 10) + b"short")
    with pytest.raises(shuffle.ShuffleError, match="damaged"):
        SortedRun(data)


def test_gather_writes_each_shard_in_key_order(tmp_path):
    import tensorflow as tf

    entries = _entries(2000, seed=1)
    layout = BucketLayout(5, buckets_per_shard=3)
    writer = BucketWriter(str(tmp_path), "train", layout, 0, buffer_bytes=1 << 12)
    for key, record in entries:
        writer.add(key, record)
    writer.flush()
    shard_paths = {s: str(tmp_path / f"shard-{s}") for s in range(5)}
    counts = {}
    for buckets, shards in layout.units():
        files = [[shuffle.bucket_path(str(tmp_path), "train", b, 0)] for b in buckets]
        counts.update(shuffle.gather_unit(files, shards, 5, shard_paths, 4096, str(tmp_path)))
    for s in range(5):
        expected = [r for k, r in sorted(entries) if shuffle.shard_of(k, 5) == s]
        got = [r.numpy() for r in tf.data.TFRecordDataset(shard_paths[s])]
        assert got == expected and counts[s] == len(expected)
    assert sorted(os.listdir(tmp_path)) == sorted(f"shard-{s}" for s in range(5))
