"""The builder's global shuffle: a seeded key per example and a bounded-memory external sort.

Every example gets a 64-bit key, a pure function of (seed, split, file relpath, index of the
example among the file's examples of that split) (`shuffle_key`). The output of a split is all
its examples in key order, cut into `num_shards` consecutive key ranges (`shard_of`): shard s
holds the keys in [s * 2^64 / n, (s + 1) * 2^64 / n). Since the keys are (pseudo)random, each
shard is a uniformly random subset of the split in uniformly random order, and so is every
stretch of any shard: a reader that takes shards in any order, and records in file order, sees a
random permutation of the corpus whatever the number of shards, including one.

The sort never holds a split in memory (an external "bucket" sort):
1. scatter: packing appends (key, record) entries to bucket files; a bucket is a key range
   (`BucketLayout`: a run of whole shards, or a part of one shard), each writer (process) has its
   own file per bucket;
2. gather: per unit of buckets that covers whole shards (`BucketLayout.units`), each bucket's
   files are read, sorted by key, and written to the shards in key order; a bucket larger than
   the memory budget is first scattered again into smaller key ranges (`iter_sorted_runs`).
Output bytes depend only on the examples, the seed and the shard count: not on the number of
processes, the bucket layout or the order in which files were packed (ties between equal keys,
which need ~2^32 examples to be likely, are broken by the record bytes).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import struct
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from electra_tf.data.build.packing import derive_seed
from electra_tf.data.records.record_framing import RecordWriter
from electra_tf.errors import ElectraError

MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (the golden ratio in 64 bits)
ENTRY = struct.Struct("<QI")  # bucket file entry header: key, record length; then the record
DEFAULT_MEMORY_BYTES = 128 << 20  # per process: the largest bucket sorted in memory
SCATTER_BUFFER_BYTES = 32 << 20  # per writer: bucket file write buffers, all buckets together
MIN_BUCKET_BUFFER = 64 << 10
MAX_BUCKETS = 2048  # per split; bounds the write buffers (a larger corpus gets larger buckets)
_rescatter_ids = itertools.count()


class ShuffleError(ElectraError, ValueError):
    """A bucket file is not what the scatter phase wrote (damaged temporary data)."""


def key_base(seed: int, split: str, relpath: str) -> int:
    """The per-(split, file) base of `shuffle_key` (one sha256 per file, not per example)."""
    return derive_seed(seed, "shuffle", split, relpath)


def shuffle_key_from_base(base: int, index: int) -> int:
    """SplitMix64 output number `index` of the stream seeded with `base`: a bijective mix."""
    z = (base + (index + 1) * _GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def shuffle_key(seed: int, split: str, relpath: str, index: int) -> int:
    """The example's 64-bit sort key (its place in the shuffled output), see the module doc."""
    return shuffle_key_from_base(key_base(seed, split, relpath), index)


def shard_of(key: int, num_shards: int) -> int:
    """The shard of a key: shard s holds keys in [s * 2^64 / n, (s + 1) * 2^64 / n)."""
    return (key * num_shards) >> 64


def shard_start(shard: int, num_shards: int) -> int:
    """The smallest key of shard `shard` (ceil(s * 2^64 / n))."""
    return -((-shard << 64) // num_shards)


@dataclasses.dataclass(frozen=True)
class BucketLayout:
    """How a split's key space is cut into buckets: runs of whole shards, or parts of one.

    Exactly one of `shards_per_bucket` and `buckets_per_shard` is above 1 (or both are 1).
    """

    num_shards: int
    shards_per_bucket: int = 1
    buckets_per_shard: int = 1

    @classmethod
    def plan(cls, num_shards: int, estimated_bytes: int, memory_bytes: int,
             max_buckets: int = MAX_BUCKETS) -> "BucketLayout":
        """Buckets of about half the memory budget (sizes vary; a larger one is re-scattered)."""
        target = max(1, memory_bytes // 2)
        per_shard = max(1.0, estimated_bytes / num_shards)
        if per_shard <= target:
            group = max(int(target // per_shard), math.ceil(num_shards / max_buckets))
            return cls(num_shards, shards_per_bucket=min(num_shards, group))
        parts = min(math.ceil(per_shard / target), max(1, max_buckets // num_shards))
        return cls(num_shards, buckets_per_shard=parts)

    @property
    def num_buckets(self) -> int:
        return math.ceil(self.num_shards / self.shards_per_bucket) * self.buckets_per_shard

    def bucket_of(self, key: int) -> int:
        scaled = key * self.num_shards
        shard = scaled >> 64
        if self.buckets_per_shard == 1:
            return shard // self.shards_per_bucket
        return shard * self.buckets_per_shard + (
            ((scaled & MASK64) * self.buckets_per_shard) >> 64)

    def units(self) -> List[Tuple[range, range]]:
        """(buckets, shards) pairs: each shard is written from exactly one unit's buckets."""
        if self.buckets_per_shard > 1:
            k = self.buckets_per_shard
            return [(range(s * k, (s + 1) * k), range(s, s + 1)) for s in range(self.num_shards)]
        g = self.shards_per_bucket
        return [(range(b, b + 1), range(b * g, min((b + 1) * g, self.num_shards)))
                for b in range(self.num_buckets)]


def bucket_path(directory: str, split: str, bucket: int, writer: int) -> str:
    return os.path.join(directory, f"{split}-{bucket:06d}-w{writer}")


class BucketWriter:
    """Appends (key, record) entries to one writer's bucket files of a split, buffered.

    Files are opened in append mode per flush, so any number of buckets costs no file handles.
    """

    def __init__(self, directory: str, split: str, layout: BucketLayout, writer: int,
                 buffer_bytes: int = SCATTER_BUFFER_BYTES):
        self.directory, self.split, self.layout, self.writer = directory, split, layout, writer
        self.buffers: Dict[int, bytearray] = {}
        self.flush_at = max(MIN_BUCKET_BUFFER, buffer_bytes // layout.num_buckets)

    def add(self, key: int, record: bytes) -> None:
        bucket = self.layout.bucket_of(key)
        buffer = self.buffers.get(bucket)
        if buffer is None:
            buffer = self.buffers[bucket] = bytearray()
        buffer += ENTRY.pack(key, len(record))
        buffer += record
        if len(buffer) >= self.flush_at:
            self._flush(bucket)

    def flush(self) -> None:
        for bucket in sorted(self.buffers):
            self._flush(bucket)

    def _flush(self, bucket: int) -> None:
        with open(bucket_path(self.directory, self.split, bucket, self.writer), "ab") as f:
            f.write(self.buffers.pop(bucket))


class SortedRun:
    """Entries of one bucket (or part of one) in memory, in key order.

    Attributes:
        data: bytearray holding the entries as read.
        keys: uint64 [n] keys, sorted.
        starts, lengths: int64 [n] where each record (in key order) lies in `data`.
    """

    def __init__(self, data: bytearray):
        keys, starts, lengths = [], [], []
        offset, size, unpack = 0, len(data), ENTRY.unpack_from
        while offset + ENTRY.size <= size:
            key, length = unpack(data, offset)
            keys.append(key)
            starts.append(offset + ENTRY.size)
            lengths.append(length)
            offset += ENTRY.size + length
        if offset != size:
            raise ShuffleError(f"a shuffle bucket is damaged ({size} bytes, entries end at "
                               f"{offset}): rerun the build")
        self.data = data
        self._view = memoryview(data)
        keys = np.array(keys, dtype=np.uint64)
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        starts, lengths = np.array(starts, np.int64)[order], np.array(lengths, np.int64)[order]
        self.starts, self.lengths = starts, lengths
        self._break_ties()

    def record(self, i: int) -> bytes:
        start = int(self.starts[i])
        return bytes(self._view[start:start + int(self.lengths[i])])

    def _break_ties(self) -> None:
        """Orders entries with equal keys by record bytes (their read order depends on jobs)."""
        equal = np.flatnonzero(self.keys[1:] == self.keys[:-1]).tolist()
        i = 0
        while i < len(equal):
            j = i
            while j + 1 < len(equal) and equal[j + 1] == equal[j] + 1:
                j += 1
            lo, hi = equal[i], equal[j] + 2  # entries lo..hi-1 share one key
            order = sorted(range(lo, hi), key=self.record)
            self.starts[lo:hi] = self.starts[order]
            self.lengths[lo:hi] = self.lengths[order]
            i = j + 1

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def _read_all(paths: Sequence[str], size: int) -> bytearray:
    data = bytearray(size)
    view, offset = memoryview(data), 0
    for path in paths:
        with open(path, "rb") as f:
            while True:
                n = f.readinto(view[offset:])
                if not n:
                    break
                offset += n
    if offset != size:
        raise ShuffleError(f"shuffle bucket files changed while read ({offset} of {size} bytes)")
    return data


def _iter_entries(paths: Sequence[str]) -> Iterator[Tuple[int, bytes]]:
    for path in paths:
        with open(path, "rb") as f:
            while True:
                head = f.read(ENTRY.size)
                if not head:
                    break
                if len(head) < ENTRY.size:
                    raise ShuffleError(f"shuffle bucket {path} is truncated: rerun the build")
                key, length = ENTRY.unpack(head)
                record = f.read(length)
                if len(record) < length:
                    raise ShuffleError(f"shuffle bucket {path} is truncated: rerun the build")
                yield key, record


def iter_sorted_runs(paths: Sequence[str], memory_bytes: int,
                     scratch_dir: str) -> Iterator[SortedRun]:
    """The entries of some bucket files in key order, as runs of at most `memory_bytes`.

    A set of files larger than the budget is scattered again by key range into about
    2 * size / budget files (two streaming passes: key range, then distribution), each sorted
    in turn; the budget therefore holds whatever the bucket layout's estimate was.
    """
    size = sum(os.path.getsize(p) for p in paths)
    if size == 0:
        return
    if size <= memory_bytes:
        yield SortedRun(_read_all(paths, size))
        return
    lo = hi = None
    for key, _ in _iter_entries(paths):
        lo = key if lo is None or key < lo else lo
        hi = key if hi is None or key > hi else hi
    if lo == hi:  # one key only (never in practice): nothing to split on
        yield SortedRun(_read_all(paths, size))
        return
    parts = max(2, math.ceil(2 * size / memory_bytes))
    prefix = os.path.join(scratch_dir, f"rescatter-{os.getpid()}-{next(_rescatter_ids)}")
    sub_paths = [f"{prefix}-{i}" for i in range(parts)]
    buffers = [bytearray() for _ in range(parts)]
    flush_at = max(MIN_BUCKET_BUFFER, SCATTER_BUFFER_BYTES // parts)
    span = hi - lo + 1
    for key, record in _iter_entries(paths):
        i = ((key - lo) * parts) // span
        buffers[i] += ENTRY.pack(key, len(record))
        buffers[i] += record
        if len(buffers[i]) >= flush_at:
            with open(sub_paths[i], "ab") as f:
                f.write(buffers[i])
            buffers[i] = bytearray()
    for path, buffer in zip(sub_paths, buffers):
        with open(path, "ab") as f:
            f.write(buffer)
    del buffers
    try:
        for path in sub_paths:
            yield from iter_sorted_runs([path], memory_bytes, scratch_dir)
            os.remove(path)
    finally:
        for path in sub_paths:
            if os.path.exists(path):
                os.remove(path)


def gather_unit(bucket_files: Sequence[Sequence[str]], shards: range, num_shards: int,
                shard_paths: Dict[int, str], memory_bytes: int, scratch_dir: str,
                report: Optional[Callable[[int], None]] = None) -> Dict[int, int]:
    """Writes the shards of one unit from its buckets' files, in key order.

    Args:
        bucket_files: per bucket of the unit, in bucket (= key) order, its files (one per
            writer that wrote to it).
        shards: the unit's shards (their key ranges are exactly the buckets').
        num_shards: the split's shard count.
        shard_paths: shard index -> path to write (a shard without examples is not created).
        memory_bytes: the sort budget (`iter_sorted_runs`).
        scratch_dir: where re-scatter files go.
        report: called with the number of records written since the last call.

    Returns:
        {shard: number of records} for every shard of the unit (0 for ones not created).
    """
    counts = dict.fromkeys(shards, 0)
    starts = np.array([shard_start(s, num_shards) for s in shards[1:]], dtype=np.uint64)
    writers: Dict[int, RecordWriter] = {}
    try:
        for paths in bucket_files:
            for run in iter_sorted_runs(paths, memory_bytes, scratch_dir):
                # run.keys is sorted: each shard's records are one slice of it.
                cuts = [0] + np.searchsorted(run.keys, starts, side="left").tolist() + [len(run)]
                for shard, lo, hi in zip(shards, cuts[:-1], cuts[1:]):
                    if hi <= lo:
                        continue
                    if shard not in writers:
                        for old in list(writers):  # shards are written one after another
                            writers.pop(old).close()
                        writers[shard] = RecordWriter(shard_paths[shard])
                    write = writers[shard].write
                    for i in range(lo, hi):
                        write(run.record(i))
                    counts[shard] += hi - lo
                    if report is not None:
                        report(hi - lo)
            for path in paths:
                os.remove(path)
    finally:
        for writer in writers.values():
            writer.close()
    return counts
