"""Pretraining batches from TFRecord shards without TensorFlow (the JAX and PyTorch trainers).

`BatchReader` yields the batches `pipeline.make_dataset` yields, bit for bit and in the same
order, for the same files, seed, batch size, input pipeline and `record_plan`: the file order of
each epoch and the record shuffle are `electra_tf.data.order`'s hash permutations, computed here
with numpy; the interleave (`MAX_INTERLEAVE_CYCLE` files, one record from each in turn, a
finished file's slot taken by the next file of the stream, across epochs when repeating), the
file or record sharding per input pipeline, the record windows and the dropped remainder are
tf.data's, re-implemented (tests/data/test_record_reader.py compares the two).

Nothing here imports TensorFlow (the module works with `sys.modules["tensorflow"] = None`).

**Reading.** The TFRecord framing is read with plain file I/O (local or mounted files): a
uint64 length, the masked CRC32C of the length, the data, the masked CRC32C of the data. Both
CRCs are checked for every record read, as TensorFlow's reader does: the length's when the
record is read (a bad length must not be trusted), the data's vectorised with numpy over all
records read for a window (or batch) before any of it is used (`crc32c_batch`: slicing-by-8
with 16-bit tables, one numpy lane per record; no CRC32C package is installed here, and the
pure-Python CRC32C tensorboard ships is ~8x slower; `google_crc32c` or `crc32c` is used
instead when installed). Damage is treated as the TensorFlow path treats it:

- a bad CRC, or a file that ends inside a record's length+data, stops the reader with a
  `DataError` naming the file, the record index and its byte offset, raised where tf.data would
  raise its DataLossError (before any batch of the window that reads it). As TensorFlow's
  reader, a file that ends inside the 12-byte header of a record ends cleanly there.
- a record that does not parse as an example of the three int64 features of length
  `max_seq_length` raises a `DataError` naming it at the batch that holds it (where the TF
  pipeline's parse fails).
- under `skip_bad_records` the trainer passes `record_plan` (`integrity.validate_dataset`):
  only the planned files are read, their first `take` records minus the `skip` indices, so
  the damage is never reached.

GZIP shards are not read: the builder writes uncompressed shards and the TF pipeline reads
them uncompressed (a compressed file fails its first CRC, as it does there).

**Decoding.** `decode_examples` is a small protobuf decoder for `tf.train.Example`: the
message structure is found per record in Python (a few byte comparisons for the layout
TensorFlow and `tfrecord_io.ExampleSerializer` write, a general walk otherwise), the int64
values (packed or not) of a whole window are decoded at once with numpy, and cast to int32 as
the TF parse does (keeping the low 32 bits). Features other than the three are ignored; a
missing one, another type, or another length is an error, as in `tfrecord_io.parse_example`;
a key given twice uses its first value (as TensorFlow's example parser).

**Speed** (one core of an AMD EPYC, ELECTRA records of 128 tokens, ~550 bytes): ~8 us per
record for the CRCs and ~17 us to decode; ~40,000 records/s in all (the TF pipeline, in C++
threads: ~200,000), far above what a training step consumes.

**Position.** `state()` is a small JSON-serialisable dict: the window (chunk) the next record
comes from, the records of it already yielded, and the interleave's position at the window's
start (epoch, next file of the epoch's order, cycle slot, and each open file's record index and
byte offset). `restore(state)` seeks every open file to its offset and re-reads at most that one
window (1,000 records in training; none in evaluation, whose windows are batches), so the next
batch is the one an uninterrupted reader yields.

**Memory** is bounded by one window of records (raw and decoded), the prefetched batches and a
read buffer per open file, whatever the shard sizes.

**Threads.** With `prefetch > 0` a background thread reads and decodes up to `prefetch` batches
ahead (numpy releases the GIL for the vectorised parts, file reads release it too); `state()`
describes the batches the caller has received, not those prefetched. `prefetch=0` reads in the
caller's thread.

grain (not a dependency) is not used: its data loaders shard and shuffle records by index
(random access, per-record global permutations) and could not reproduce the TF pipeline's
sequential interleave of files, which this reader must match record for record.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from electra_tf.data import order
from electra_tf.data.integrity import DataError, FileScan, list_files
from electra_tf.data.tfrecord_io import FEATURE_NAMES

STATE_VERSION = 1
READ_BUFFER = 1 << 18  # bytes of read buffer per open file (as TFRecordDataset's 256 KiB)

# ------------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), masked as TFRecord stores it
# ------------------------------------------------------------------------------------------------
_POLY = 0x82F63B78  # reflected Castagnoli polynomial
_MASK_DELTA = 0xA282EAD8


def _tables() -> np.ndarray:
    """uint32 [8, 256]: slicing-by-8 tables; row k is the CRC of byte i followed by k zeros."""
    table = np.zeros((8, 256), np.uint32)
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ (_POLY if crc & 1 else 0)
        table[0, i] = crc
    for k in range(1, 8):
        prev = table[k - 1]
        table[k] = (prev >> np.uint32(8)) ^ table[0][prev & np.uint32(0xFF)]
    return table


_TABLE = _tables()
_TABLE0 = [int(v) for v in _TABLE[0]]
# Pairs of slicing-by-8 tables merged into 16-bit tables (4 lookups per 8 bytes instead of 8):
# _T16[j][x] = T[7 - 2j][x & 0xFF] ^ T[6 - 2j][x >> 8].
_LOW16 = np.arange(1 << 16, dtype=np.uint32)
_T16 = [(_TABLE[7 - 2 * j][_LOW16 & np.uint32(0xFF)] ^ _TABLE[6 - 2 * j][_LOW16 >> np.uint32(8)])
        for j in range(4)]
del _LOW16


def _unshift_zero(state: int) -> int:
    """The CRC register that one zero byte takes to `state` (the inverse of that step)."""
    for _ in range(8):
        state = (((state ^ _POLY) << 1) | 1) if state & 0x80000000 else state << 1
        state &= 0xFFFFFFFF
    return state


# _PRE_INIT[k]: the register that k zero bytes take to the initial 0xFFFFFFFF, so a record
# right-aligned behind k zero bytes gets its own CRC (extended on demand).
_PRE_INIT = [0xFFFFFFFF]
_PRE_INIT_LOCK = threading.Lock()  # readers and scans run in several threads


def _pre_init(max_zeros: int) -> np.ndarray:
    with _PRE_INIT_LOCK:
        while len(_PRE_INIT) <= max_zeros:
            _PRE_INIT.append(_unshift_zero(_PRE_INIT[-1]))
        return np.asarray(_PRE_INIT[:max_zeros + 1], np.uint32)


def crc32c(data: bytes) -> int:
    """CRC32C of `data` (pure Python: for short inputs such as the 8-byte length field)."""
    crc = 0xFFFFFFFF
    table = _TABLE0
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_lanes(records: Sequence[bytes]) -> np.ndarray:
    """uint32 [n]: CRC32C of records of similar lengths, one numpy lane each (slicing-by-8).

    Each record is right-aligned in a zero-padded row whose register starts at `_pre_init`
    of its padding, so all rows step through the same 8-byte columns together.
    """
    lengths = np.fromiter((len(r) for r in records), np.int64, len(records))
    width = int(-(-int(lengths.max()) // 8) * 8) if len(records) else 0
    rows = np.zeros((len(records), width), np.uint8)
    flat = np.frombuffer(b"".join(records), np.uint8)
    if flat.size:
        starts = np.cumsum(lengths) - lengths
        shift = np.arange(len(records), dtype=np.int64) * width + width - lengths - starts
        rows.reshape(-1)[np.arange(flat.size, dtype=np.int64) + np.repeat(shift, lengths)] = flat
    crc = _pre_init(int(width - lengths.min()) if len(records) else 0)[width - lengths]
    words = np.ascontiguousarray(rows.view("<u4").T)  # [width / 4, n]
    t0, t1, t2, t3 = _T16
    m16, s16 = np.uint32(0xFFFF), np.uint32(16)
    for i in range(0, words.shape[0], 2):
        crc ^= words[i]
        high = words[i + 1]
        crc = t0[crc & m16] ^ t1[crc >> s16] ^ t2[high & m16] ^ t3[high >> s16]
    return crc ^ np.uint32(0xFFFFFFFF)


def _fast_crc32c():
    """A compiled CRC32C function from an installed package, or None."""
    try:
        import google_crc32c  # type: ignore

        if getattr(google_crc32c, "implementation", "c") == "c":
            return google_crc32c.value
    except ImportError:
        pass
    try:
        import crc32c as crc32c_package  # type: ignore

        return crc32c_package.crc32c
    except ImportError:
        return None


_FAST_CRC = _fast_crc32c()
_LANES = 256  # records per vectorised group


def crc32c_batch(records: Sequence[bytes], use_package: bool = True) -> np.ndarray:
    """uint32 [n]: the CRC32C of each record (vectorised over records; see module docstring).

    Args:
        records: byte strings.
        use_package: use an installed compiled CRC32C package when there is one.
    """
    if use_package and _FAST_CRC is not None:
        return np.fromiter((_FAST_CRC(r) for r in records), np.uint32, len(records))
    out = np.zeros(len(records), np.uint32)
    if not records:
        return out
    lengths = np.fromiter((len(r) for r in records), np.int64, len(records))
    by_length = np.argsort(lengths, kind="stable")
    # Groups of similar lengths (at most _LANES, the longest < 2x the shortest + 64 bytes)
    # bound the padding: memory stays ~ the records' own size.
    start = 0
    while start < len(by_length):
        limit = 2 * lengths[by_length[start]] + 64
        end = start + 1
        while end < len(by_length) and end - start < _LANES and lengths[by_length[end]] <= limit:
            end += 1
        group = by_length[start:end]
        out[group] = _crc32c_lanes([records[i] for i in group])
        start = end
    return out


def masked_crc(crc):
    """TFRecord's mask of a CRC (ints or uint32 arrays)."""
    if isinstance(crc, np.ndarray):
        crc = crc.astype(np.uint32)
        with np.errstate(over="ignore"):
            return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------
# TFRecord framing
# ------------------------------------------------------------------------------------------------
class Record(NamedTuple):
    """One record as read: its data, the stored masked CRC of the data, and where it is."""

    data: bytes
    stored_crc: int
    file_index: int
    index: int   # record index in its file
    offset: int  # byte offset of its header


_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_length_crc_cache: Dict[bytes, int] = {}


def _length_ok(header: bytes, stored: int) -> bool:
    length_bytes = header[:8]
    expected = _length_crc_cache.get(length_bytes)
    if expected is None:
        expected = masked_crc(crc32c(length_bytes))
        if len(_length_crc_cache) < 1 << 16:
            _length_crc_cache[length_bytes] = expected
    return expected == stored


class _FileReader:
    """Sequential records of one TFRecord file from a byte offset (length CRC checked here,
    the data CRC by the caller, in bulk)."""

    def __init__(self, path: str, file_index: int, index: int = 0, offset: int = 0):
        self.path = path
        self.file_index = file_index
        self.index = index
        self.offset = offset
        self._file = open(path, "rb", buffering=READ_BUFFER)
        if offset:
            self._file.seek(offset)

    def read(self) -> Optional[Record]:
        """The next record, or None at the end of the file (or inside a final partial header,
        as TensorFlow's reader)."""
        header = self._file.read(12)
        if len(header) < 12:
            return None
        length, stored = _HEADER.unpack(header)
        if not _length_ok(header, stored):
            raise DataError(self._damage("corrupted record (length CRC mismatch)"))
        body = self._file.read(length + 4)
        if len(body) < length + 4:
            raise DataError(self._damage(f"truncated record: the file ends inside its "
                                         f"{length}-byte data"))
        record = Record(body[:length], _FOOTER.unpack_from(body, length)[0], self.file_index,
                        self.index, self.offset)
        self.index += 1
        self.offset += 16 + length
        return record

    def _damage(self, what: str) -> str:
        return damage_message(self.path, self.index, self.offset, what)

    def close(self) -> None:
        self._file.close()


def damage_message(path: str, index: int, offset: int, what: str) -> str:
    """The DataError text for an unreadable record (names the file, record and offset)."""
    return (f"{path}: corrupted or truncated TFRecord file at record #{index} (byte {offset}: "
            f"{what}) after {index} good records; rebuild the dataset, or set skip_bad_records "
            "to train on the readable records")


def first_bad_crc(records: Sequence[Record]) -> Optional[int]:
    """Index in `records` of the first whose data does not match its stored CRC, or None."""
    if not records:
        return None
    crcs = masked_crc(crc32c_batch([r.data for r in records]))
    stored = np.fromiter((r.stored_crc for r in records), np.uint32, len(records))
    bad = np.flatnonzero(crcs != stored)
    return int(bad[0]) if bad.size else None


def iter_records(path: str) -> Iterator[bytes]:
    """Every record of a TFRecord file, CRCs checked (DataError on damage)."""
    reader = _FileReader(path, 0)
    try:
        while True:
            batch = []
            while len(batch) < 256:
                record = reader.read()
                if record is None:
                    break
                batch.append(record)
            bad = first_bad_crc(batch)
            if bad is not None:
                r = batch[bad]
                raise DataError(damage_message(path, r.index, r.offset,
                                               "corrupted record (data CRC mismatch)"))
            yield from (r.data for r in batch)
            if len(batch) < 256:
                return
    finally:
        reader.close()


# ------------------------------------------------------------------------------------------------
# tf.train.Example decoding
# ------------------------------------------------------------------------------------------------
class _Malformed(Exception):
    pass


def _varint(buf: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        try:
            byte = buf[pos]
        except IndexError:
            raise _Malformed("bad protobuf bytes: truncated varint") from None
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Malformed("bad protobuf bytes: varint too long")


def _skip(buf: bytes, pos: int, wire_type: int) -> int:
    if wire_type == 0:
        return _varint(buf, pos)[1]
    if wire_type == 1:
        pos += 8
    elif wire_type == 2:
        length, pos = _varint(buf, pos)
        pos += length
    elif wire_type == 5:
        pos += 4
    else:
        raise _Malformed(f"bad protobuf bytes: wire type {wire_type}")
    if pos > len(buf):
        raise _Malformed("bad protobuf bytes: truncated field")
    return pos


def _fields(buf: bytes, start: int, end: int) -> Iterator[Tuple[int, int, int, int]]:
    """(field number, wire type, payload start, payload end) of a message's fields; for
    varints (wire type 0) the payload is the varint's bytes."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        field, wire_type = tag >> 3, tag & 7
        if wire_type == 2:
            length, pos = _varint(buf, pos)
            payload_end = pos + length
        else:
            payload_end = _skip(buf, pos, wire_type)
        if payload_end > end:
            raise _Malformed("bad protobuf bytes: a field overruns its message")
        yield field, wire_type, pos, payload_end
        pos = payload_end


def _int64_ranges(buf: bytes, names: Dict[bytes, int]) -> List[Optional[List[Tuple[int, int]]]]:
    """For each wanted feature: the byte ranges of its int64 varints (packed runs or single
    values) in `buf`, or None when absent. Raises _Malformed for another type or bad bytes."""
    found: List[Optional[List[Tuple[int, int]]]] = [None] * len(names)
    for field, wire_type, start, end in _fields(buf, 0, len(buf)):
        if field != 1 or wire_type != 2:  # Example.features
            continue
        for f2, w2, entry_start, entry_end in _fields(buf, start, end):
            if f2 != 1 or w2 != 2:  # Features.feature (map entry)
                continue
            key = value = None
            for f3, w3, s3, e3 in _fields(buf, entry_start, entry_end):
                if f3 == 1 and w3 == 2:
                    key = buf[s3:e3]
                elif f3 == 2 and w3 == 2:
                    value = (s3, e3)
            slot = names.get(key)
            if slot is None or found[slot] is not None:
                continue  # another feature, or a repeated key (the first one is used)
            ranges: List[Tuple[int, int]] = []
            if value is not None:
                for f4, w4, s4, e4 in _fields(buf, value[0], value[1]):
                    if f4 in (1, 2):  # bytes_list, float_list
                        raise _Malformed(f"feature {key.decode(errors='replace')} is not int64")
                    if f4 == 3 and w4 == 2:  # int64_list
                        for f5, w5, s5, e5 in _fields(buf, s4, e4):
                            if f5 == 1 and w5 in (0, 2):  # value, unpacked or packed
                                ranges.append((s5, e5))
                            elif f5 == 1:
                                raise _Malformed("bad protobuf bytes: an int64 value of "
                                                 "another wire type")
            found[slot] = ranges
    return found


def _short_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    byte = buf[pos]
    return (byte, pos + 1) if byte < 0x80 else _varint(buf, pos)


class _Layout:
    """The usual bytes of an example of length L (TensorFlow's serialisation, whatever its map
    order, and `tfrecord_io.ExampleSerializer`'s): the three features once each, input_ids
    packed in one run, input_mask and segment_ids packed with one byte per value under constant
    framing. `ranges` finds the three value runs of such a record with a few comparisons, or
    None for any other layout (the general walk then decides); the values themselves are
    checked by the caller."""

    _IDS_KEY = b"\x0a\x09input_ids\x12"  # map key (tag, length, name), then the value's tag

    def __init__(self, max_seq_length: int):
        from electra_tf.data.tfrecord_io import _entry  # the serializer's own framing

        self.length = max_seq_length
        self.heads = ((_entry("input_mask", max_seq_length), 1),
                      (_entry("segment_ids", max_seq_length), 2))

    def ranges(self, rec: bytes) -> Optional[List[List[Tuple[int, int]]]]:
        found: List[Optional[List[Tuple[int, int]]]] = [None, None, None]
        try:
            n = len(rec)
            if rec[0] != 0x0A:
                return None
            size, p = _short_varint(rec, 1)  # Features
            if p + size != n:
                return None
            for _ in range(3):
                for head, k in self.heads:
                    if rec.startswith(head, p):
                        start = p + len(head)
                        p = start + self.length
                        found[k] = [(start, p)]
                        break
                else:  # the input_ids map entry
                    if rec[p] != 0x0A:
                        return None
                    size, p = _short_varint(rec, p + 1)
                    end = p + size
                    if not rec.startswith(self._IDS_KEY, p):
                        return None
                    size, p = _short_varint(rec, p + 12)  # Feature
                    if p + size != end or rec[p] != 0x1A:
                        return None
                    size, p = _short_varint(rec, p + 1)  # Int64List
                    if p + size != end or rec[p] != 0x0A:
                        return None
                    size, p = _short_varint(rec, p + 1)  # packed values
                    if p + size != end:
                        return None
                    found[0] = [(p, end)]
                    p = end
        except (IndexError, _Malformed):
            return None
        if p != n or None in found:
            return None
        return found


class Decoded(NamedTuple):
    """Examples decoded from records (`decode_examples`)."""

    features: np.ndarray       # int32 [n, 3, max_seq_length], rows of bad records zero
    bad: np.ndarray            # bool [n]
    reasons: Dict[int, str]    # record position -> why it is bad


def decode_examples(records: Sequence[bytes], max_seq_length: int) -> Decoded:
    """Decodes serialized `tf.train.Example`s of the three int64 features (see module doc).

    Args:
        records: serialized examples.
        max_seq_length: int. The length every feature must have.

    Returns:
        Decoded: int32 [n, 3, max_seq_length] in `FEATURE_NAMES` order, and which records are
        not such examples (missing or extra-typed features, other lengths, bad bytes).
    """
    n, length = len(records), max_seq_length
    num_features = len(FEATURE_NAMES)
    features = np.zeros((n, num_features, length), np.int32)
    bad = np.zeros(n, bool)
    reasons: Dict[int, str] = {}
    pieces, owners = _value_runs(records, max_seq_length, bad, reasons)
    counts = np.zeros(n * num_features, np.int64)
    values = np.zeros(0, np.uint64)
    if pieces:
        values = _decode_varints(pieces, owners, counts, bad, reasons)
    _check_counts(counts, length, bad, reasons)
    if values.size:
        # int64 -> int32 keeps the low 32 bits, as tf.cast does.
        values = values.view(np.int32) if values.dtype == np.uint32 else values.astype(np.int32)
        if bad.any():  # values are in (record, feature) order: keep the good records'
            values = values[np.repeat(np.repeat(~bad, num_features), counts)]
        features[~bad] = values.reshape(-1, num_features, length)
    return Decoded(features, bad, reasons)


def _value_runs(records: Sequence[bytes], max_seq_length: int, bad: np.ndarray,
                reasons: Dict[int, str]) -> Tuple[List[bytes], List[int]]:
    """The packed value runs of every record that looks like an example, in (record, feature)
    order, and their owners (record * num_features + feature). Records that are not such
    examples are marked in `bad` / `reasons` (in place) and give no run."""
    names = {name.encode(): i for i, name in enumerate(FEATURE_NAMES)}
    num_features = len(FEATURE_NAMES)
    pieces: List[bytes] = []
    owners: List[int] = []
    layout = _Layout(max_seq_length)
    for i, record in enumerate(records):
        found = layout.ranges(record)
        if found is None:
            try:
                found = _int64_ranges(record, names)
            except _Malformed as e:
                bad[i], reasons[i] = True, str(e)
                continue
            missing = [FEATURE_NAMES[k] for k, r in enumerate(found) if r is None]
            if missing:
                bad[i], reasons[i] = True, f"no feature {', '.join(missing)}"
                continue
        for k, ranges in enumerate(found):
            for start, end in ranges:
                if end > start:  # an empty packed run holds no value
                    pieces.append(record[start:end])
                    owners.append(i * num_features + k)
    return pieces, owners


def _decode_varints(pieces: List[bytes], owners: List[int], counts: np.ndarray, bad: np.ndarray,
                    reasons: Dict[int, str]) -> np.ndarray:
    """The varints of the value runs, all at once: their values (uint32 or uint64, in run
    order). Adds each run's value count to `counts[owner]`; marks records with a truncated or
    over-long varint in `bad` / `reasons` (all in place)."""
    num_features = len(FEATURE_NAMES)
    data = np.frombuffer(b"".join(pieces), np.uint8)
    owner = np.asarray(owners, np.int64)
    last = np.cumsum(np.fromiter((len(x) for x in pieces), np.int64, len(pieces))) - 1
    terminal = data < 0x80
    # A run must end with a varint's last byte; one that does not makes its record bad, and
    # is cut there so that the next run's varints stay aligned.
    for r in np.flatnonzero(~terminal[last]):
        i = int(owner[r]) // num_features
        bad[i], reasons[i] = True, "bad protobuf bytes: truncated varint"
    terminal[last] = True
    value_ends = np.flatnonzero(terminal)
    value_starts = np.empty_like(value_ends)
    value_starts[0] = 0
    value_starts[1:] = value_ends[:-1] + 1
    sizes = value_ends - value_starts + 1
    per_run = np.diff(np.searchsorted(value_ends, last, side="right"), prepend=0)
    np.add.at(counts, owner, per_run)
    longest = int(sizes.max())
    if longest > 10:
        value_owner = np.repeat(owner, per_run)
        for o in np.unique(value_owner[sizes > 10]):
            i = int(o) // num_features
            bad[i], reasons[i] = True, "bad protobuf bytes: varint too long"
    # Byte k of every varint at once, shifted by 7k: byte 0 of all, then bytes 1 .. of the
    # multi-byte ones (most values, all of input_mask and segment_ids, are one byte).
    wide = np.uint32 if longest <= 4 else np.uint64
    values = (data[value_starts] & 0x7F).astype(wide)
    multi = np.flatnonzero(sizes > 1)
    if multi.size:
        starts, multi_sizes = value_starts[multi], sizes[multi]
        acc = values[multi]
        for k in range(1, min(longest, 10)):
            byte = data[starts + np.minimum(k, multi_sizes - 1)] & 0x7F
            acc |= np.where(multi_sizes > k, byte, 0).astype(wide) << wide(7 * k)
        values[multi] = acc
    return values


def _check_counts(counts: np.ndarray, length: int, bad: np.ndarray,
                  reasons: Dict[int, str]) -> None:
    """Marks (in place) each record with a feature of other than `length` values."""
    num_features = len(FEATURE_NAMES)
    n = len(bad)
    wrong = (counts.reshape(n, num_features) != length) & ~bad[:, None]
    for i, k in zip(*np.nonzero(wrong)):
        i = int(i)
        if not bad[i]:
            bad[i] = True
            reasons[i] = (f"feature {FEATURE_NAMES[k]} has {counts[i * num_features + k]} "
                          f"values, not {length}")


def parse_error(path: str, index: int, max_seq_length: int) -> str:
    """The DataError text for a record that is not an example (as `integrity.verify_records`)."""
    return (f"{path}: record #{index} is not an example with the features "
            f"{', '.join(FEATURE_NAMES)} of length {max_seq_length}")


# ------------------------------------------------------------------------------------------------
# Whole-file scans (integrity without TensorFlow)
# ------------------------------------------------------------------------------------------------
def scan_file(path: str, max_seq_length: int, stop_at_first: bool = False,
              batch: int = 1024) -> FileScan:
    """`integrity.scan_file` without TensorFlow: the same FileScan for the same file (only the
    error text differs: it is this reader's), reading `batch` records at a time."""
    reader = _FileReader(path, 0)
    readable, bad_indices = 0, []
    try:
        while True:
            records: List[Record] = []
            error = None
            try:
                while len(records) < batch:
                    record = reader.read()
                    if record is None:
                        break
                    records.append(record)
            except DataError as e:
                error = str(e)
            bad_crc = first_bad_crc(records)
            if bad_crc is not None:
                r = records[bad_crc]
                error = damage_message(path, r.index, r.offset,
                                       "corrupted record (data CRC mismatch)")
                records = records[:bad_crc]
            if records:
                bad = np.flatnonzero(decode_examples([r.data for r in records],
                                                     max_seq_length).bad)
                if stop_at_first and bad.size:
                    return FileScan(path, readable + len(records), (readable + int(bad[0]),),
                                    error)
                bad_indices += (readable + bad).tolist()
                readable += len(records)
            if error is not None or len(records) < batch:
                return FileScan(path, readable, tuple(bad_indices), error)
    finally:
        reader.close()


# ------------------------------------------------------------------------------------------------
# The pipeline
# ------------------------------------------------------------------------------------------------
class _Interleave:
    """tf.data's deterministic interleave of the file stream (see module docstring), with a
    position that is a few integers (`snapshot` / `restore`)."""

    def __init__(self, files: List[str], plan: Optional[dict], cycle: int, is_training: bool,
                 seed: int, repeat: bool):
        self.files = files
        self.takes = [plan[f]["take"] for f in files] if plan is not None else None
        self.skips = [frozenset(plan[f]["skip"]) for f in files] if plan is not None else None
        self.cycle = cycle
        self.is_training = is_training
        self.seed = seed
        self.repeat = repeat
        self.slots: List[Optional[_FileReader]] = [None] * cycle
        self.epoch = self.next_file = self.cycle_index = self.emitted = 0
        self.started = False
        self._order: Optional[np.ndarray] = None
        self._order_epoch = -1
        self._opened_since_record = 0

    # -- the file stream ------------------------------------------------------------------------
    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            n = len(self.files)
            self._order = (order.file_order(self.seed, self.epoch, n) if self.is_training
                           else np.arange(n))
            self._order_epoch = self.epoch
        return self._order

    def _open_next(self) -> Optional[_FileReader]:
        if self.next_file == len(self.files):
            if not self.repeat:
                return None
            self.epoch += 1
            self.next_file = 0
        file_index = int(self._epoch_order()[self.next_file])
        self.next_file += 1
        self._opened_since_record += 1
        if self._opened_since_record > len(self.files) + self.cycle + 1:
            raise DataError(f"no record in any of the {len(self.files)} file(s) "
                            f"{self.files[0]}...: they are empty")
        return _FileReader(self.files[file_index], file_index)

    def _start(self) -> None:
        for k in range(self.cycle):
            self.slots[k] = self._open_next()
            if self.slots[k] is None:
                break
        self.started = True

    # -- records --------------------------------------------------------------------------------
    def _read_slot(self, reader: _FileReader, read: List[Record]) -> Optional[Record]:
        """The slot's next record (planned files: within `take`, not skipped), or None."""
        take = self.takes[reader.file_index] if self.takes is not None else None
        skip = self.skips[reader.file_index] if self.skips is not None else ()
        while True:
            if take is not None and reader.index >= take:
                return None
            record = reader.read()
            if record is None:
                return None
            read.append(record)
            if record.index not in skip:
                return record

    def next_record(self, read: List[Record]) -> Optional[Record]:
        """The next record of the interleave, or None at its end. Every record read (skipped
        ones too) is appended to `read`, for the CRC check."""
        if not self.started:
            self._start()
        cycle = self.cycle
        while True:
            for i in range(cycle):
                k = (self.cycle_index + i) % cycle
                if self.slots[k] is not None:
                    self.cycle_index = k
                    break
            else:
                return None
            reader = self.slots[self.cycle_index]
            record = self._read_slot(reader, read)
            if record is not None:
                self.cycle_index = (self.cycle_index + 1) % cycle
                self.emitted += 1
                self._opened_since_record = 0
                return record
            reader.close()
            self.slots[self.cycle_index] = self._open_next()
            self.cycle_index = (self.cycle_index + 1) % cycle

    # -- position -------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"started": self.started, "epoch": self.epoch, "next_file": self.next_file,
                "cycle_index": self.cycle_index, "emitted": self.emitted,
                "slots": [None if s is None else [s.file_index, s.index, s.offset]
                          for s in self.slots]}

    def restore(self, snapshot: dict) -> None:
        self.close()
        self.started = bool(snapshot["started"])
        self.epoch = int(snapshot["epoch"])
        self.next_file = int(snapshot["next_file"])
        self.cycle_index = int(snapshot["cycle_index"])
        self.emitted = int(snapshot["emitted"])
        if len(snapshot["slots"]) != self.cycle:
            raise ValueError(f"state has {len(snapshot['slots'])} interleave slots, this "
                             f"reader {self.cycle}")
        self._opened_since_record = 0
        self.slots = [None if s is None else
                      _FileReader(self.files[int(s[0])], int(s[0]), int(s[1]), int(s[2]))
                      for s in snapshot["slots"]]

    def close(self) -> None:
        for reader in self.slots:
            if reader is not None:
                reader.close()
        self.slots = [None] * self.cycle


class _Chunk(NamedTuple):
    """One window of the post-shuffle stream, decoded and in emission order."""

    index: int
    features: np.ndarray   # int32 [m, 3, L]
    bad: np.ndarray        # bool [m]
    errors: Dict[int, str]  # position -> DataError text
    before: dict           # interleave snapshot at its start
    after: dict            # ... and after it


class _Settings(NamedTuple):
    """What a reader reads, and in which order (`BatchReader`'s arguments, resolved)."""

    files: List[str]          # this pipeline's files
    shard_records: bool       # keep every num_input_pipelines-th record instead
    cycle: int                # files interleaved at once
    batch_size: int
    max_seq_length: int
    is_training: bool
    seed: int
    num_input_pipelines: int
    input_pipeline_id: int
    repeat: bool
    record_plan: Optional[dict]
    chunk_size: int           # records per window (training) or per batch (evaluation)


class _Stream:
    """The reader's pipeline, run by one thread: chunks (windows) -> batches, with the state
    after every batch."""

    def __init__(self, settings: _Settings):
        self.r = settings
        self.interleave = _Interleave(settings.files, settings.record_plan, settings.cycle,
                                      settings.is_training, settings.seed, settings.repeat)
        self.next_chunk_index = 0
        self.current: Optional[_Chunk] = None
        self.position = 0  # records of `current` already in batches
        self.ended = False

    def state(self) -> dict:
        c = self.current
        if c is None:
            return {"chunk": self.next_chunk_index, "offset": 0,
                    "interleave": self.interleave.snapshot()}
        if self.position == len(c.features):
            return {"chunk": c.index + 1, "offset": 0, "interleave": c.after}
        return {"chunk": c.index, "offset": self.position, "interleave": c.before}

    def restore(self, state: dict) -> None:
        self.interleave.restore(state["interleave"])
        self.next_chunk_index = int(state["chunk"])
        self.current, self.position, self.ended = None, 0, False
        offset = int(state["offset"])
        if offset:
            chunk = self._read_chunk()
            if chunk is None or offset > len(chunk.features):
                raise ValueError(f"state offset {offset} is past its window")
            self.current, self.position = chunk, offset

    def _read_chunk(self) -> Optional[_Chunk]:
        r = self.r
        before = self.interleave.snapshot()
        read: List[Record] = []
        owned: List[Record] = []
        size = r.chunk_size
        error: Optional[DataError] = None
        try:
            while len(owned) < size:
                record = self.interleave.next_record(read)
                if record is None:
                    break
                if r.shard_records and (self.interleave.emitted - 1) % r.num_input_pipelines \
                        != r.input_pipeline_id:
                    continue
                owned.append(record)
        except DataError as e:
            error = e
        bad_crc = first_bad_crc(read)
        if bad_crc is not None:  # the first damage in read order wins
            rec = read[bad_crc]
            raise DataError(damage_message(r.files[rec.file_index], rec.index, rec.offset,
                                           "corrupted record (data CRC mismatch)"))
        if error is not None:
            raise error
        if not owned:
            return None
        decoded = decode_examples([rec.data for rec in owned], r.max_seq_length)
        features, bad = decoded.features, decoded.bad
        errors = {i: parse_error(r.files[owned[i].file_index], owned[i].index, r.max_seq_length)
                  + f" ({decoded.reasons[i]})" for i in np.flatnonzero(bad).tolist()}
        index = self.next_chunk_index
        if r.is_training:
            perm = order.record_order(r.seed, index, len(owned))
            features, bad = features[perm], bad[perm]
            inverse = np.empty_like(perm)
            inverse[perm] = np.arange(len(perm))
            errors = {int(inverse[i]): text for i, text in errors.items()}
        self.next_chunk_index += 1
        return _Chunk(index, features, bad, errors, before, self.interleave.snapshot())

    def next_batch(self) -> Optional[Tuple[Dict[str, np.ndarray], dict]]:
        """The next batch and the state after it, or None at the end of the data."""
        if self.ended:
            return None
        size = self.r.batch_size
        pieces, need = [], size
        # Remember where the batch starts: a short end leaves the position unchanged.
        start_current, start_position = self.current, self.position
        while need:
            if self.current is None or self.position == len(self.current.features):
                chunk = self._read_chunk()
                if chunk is None:
                    self.ended = True
                    self.current, self.position = start_current, start_position
                    return None
                self.current, self.position = chunk, 0
            c = self.current
            take = min(need, len(c.features) - self.position)
            rows = slice(self.position, self.position + take)
            bad = np.flatnonzero(c.bad[rows])
            if bad.size:
                raise DataError(c.errors[self.position + int(bad[0])])
            pieces.append(c.features[rows])
            self.position += take
            need -= take
        batch = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return ({name: np.ascontiguousarray(batch[:, k]) for k, name in enumerate(FEATURE_NAMES)},
                self.state())

    def close(self) -> None:
        self.interleave.close()


_END = object()


def _produce(stream: _Stream):
    """The next (batch, state), `_END`, or the exception to hand to the consumer in order."""
    try:
        item = stream.next_batch()
    except Exception as e:  # noqa: BLE001 (re-raised by the consumer)
        return e
    return _END if item is None else item


def _prefetch(stream: _Stream, out: queue.Queue, stop: threading.Event) -> None:
    """The prefetch thread: batches into `out` until the end, an error, or `stop`."""
    while not stop.is_set():
        item = _produce(stream)
        out.put(item)
        if item is _END or isinstance(item, BaseException):
            return


class BatchReader:
    """The TF pipeline's batches without TensorFlow (see module docstring).

    Args:
        patterns: str. Comma-separated file globs (local files).
        batch_size: int. Batch size of THIS pipeline.
        max_seq_length: int. Feature length the shards were written with.
        is_training: bool. Shuffle files (per epoch) and records (`order`).
        seed: int. Seeds the shuffles.
        num_input_pipelines: int. Input pipelines (workers) reading the data.
        input_pipeline_id: int. This pipeline, in [0, num_input_pipelines).
        repeat: bool. Cycle through the data forever.
        record_plan: optional {path: {"take": n, "skip": [indices]}} from
            `integrity.validate_dataset(..., skip_bad_records=True)`.
        prefetch: int. Batches a background thread prepares ahead (0: no thread).

    Iterating yields {"input_ids", "input_mask", "segment_ids"}: np.int32 [batch_size,
    max_seq_length], the remainder dropped. Raises DataError on damaged data (module docstring).
    """

    def __init__(self, patterns: str, *, batch_size: int, max_seq_length: int, is_training: bool,
                 seed: int = 0, num_input_pipelines: int = 1, input_pipeline_id: int = 0,
                 repeat: bool = True, record_plan: Optional[dict] = None, prefetch: int = 2):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        all_files = list_files(patterns)
        remote = [f for f in all_files if "://" in f]
        if remote:
            raise DataError(f"{remote[0]}: BatchReader reads local files only (mount the bucket, "
                            "e.g. with gcsfuse, or copy the shards)")
        if record_plan is not None:
            all_files = [f for f in all_files if f in record_plan]
            if not all_files:
                raise DataError(f"record_plan names none of the files of {patterns!r}")
        files, shard_records = order.pipeline_files(all_files, num_input_pipelines,
                                                    input_pipeline_id)
        self.settings = _Settings(
            files, shard_records, order.interleave_cycle(len(all_files)), batch_size,
            max_seq_length, is_training, seed, num_input_pipelines, input_pipeline_id, repeat,
            record_plan,
            # Training: windows of the record shuffle; evaluation: each batch is a window.
            order.RECORD_SHUFFLE_WINDOW if is_training else batch_size)
        self.files = files
        self.prefetch = max(0, int(prefetch))
        self.key = self._key()
        self._stream = _Stream(self.settings)
        self._state = self._stream.state()
        self._thread: Optional[threading.Thread] = None
        self._queue: Optional[queue.Queue] = None
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._closed = False

    def _key(self) -> str:
        """What a position belongs to: the files read and every setting of the order."""
        key = self.settings._asdict()
        key["files"] = [os.path.basename(f) for f in self.files]
        if self.settings.record_plan is not None:
            key["record_plan"] = {os.path.basename(f): self.settings.record_plan[f]
                                  for f in self.files}
        key["order"] = STATE_VERSION
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()

    # --- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> "BatchReader":
        return self

    def __next__(self) -> Dict[str, np.ndarray]:
        if self._closed:
            raise ValueError("BatchReader is closed")
        if self._error is not None:
            raise self._error
        if self.prefetch == 0:
            item = self._produce()
        else:
            if self._thread is None:
                self._start_thread()
            item = self._queue.get()
        if item is _END:
            if self.prefetch:
                self._queue.put(_END)  # later calls end too
            raise StopIteration
        if isinstance(item, BaseException):
            self._error = item
            raise item
        batch, self._state = item
        return batch

    def _produce(self):
        return _produce(self._stream)

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        # The thread holds the stream, not the reader: an unclosed reader can still be
        # collected, and its __del__ stops the thread.
        self._thread = threading.Thread(target=_prefetch, name="BatchReader", daemon=True,
                                        args=(self._stream, self._queue, self._stop))
        self._thread.start()

    def _stop_thread(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:  # unblock a put on the full queue
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.01)
        self._thread = self._queue = None

    # --- position ---------------------------------------------------------------------------------
    def state(self) -> dict:
        """The position after the last batch returned (JSON-serialisable)."""
        return json.loads(json.dumps({"version": STATE_VERSION, "key": self.key,
                                      "position": self._state}))

    def restore(self, state: dict) -> None:
        """Continues from `state` (from `state()` of a reader with the same files and
        settings): the next batch is the one that followed it.

        Raises:
            ValueError: a state of another version, or of another reader (files, settings).
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"reader state version {state.get('version')} is not "
                             f"{STATE_VERSION}")
        if state.get("key") != self.key:
            raise ValueError("the reader state belongs to another reader (other files, batch "
                             "size, seed, input pipeline or record plan)")
        self._stop_thread()
        self._error = None
        self._stream.restore(state["position"])
        self._state = self._stream.state()

    # --- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the prefetch thread and closes the files."""
        if self._closed:
            return
        self._stop_thread()
        self._stream.close()
        self._closed = True

    def __enter__(self) -> "BatchReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
