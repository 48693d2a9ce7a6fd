"""`tf.train.Example`s of the three pretraining features decoded without TensorFlow.

`decode_examples` is a small protobuf decoder for `tf.train.Example`: the message structure is
found per record in Python (a few byte comparisons for the layout TensorFlow and
`tfrecord_io.ExampleSerializer` write, a general walk otherwise), the int64 values (packed or
not) of a whole window are decoded at once with numpy, and cast to int32 as the TF parse does
(keeping the low 32 bits). Features other than the three are ignored; a missing one, another
type, or another length makes the record bad, as in `tfrecord_io.parse_example` (its reason
is kept, and `parse_error` is the DataError text naming it); a key given twice uses its first
value (as TensorFlow's example parser).

Speed (one core of an AMD EPYC, ELECTRA records of 128 tokens, ~550 bytes): ~17 us per record.
Protobuf's own parser (upb, on `Example` classes made from the descriptor) was measured 2-5x
slower per record, the whole reader 0.4-0.6x as fast: copying 384 int64s per record out of its
repeated fields costs more than this window-at-once decoding (docs/benchmarks.md, "The
TensorFlow-free reader's parts"; `benchmarks/reader_parts.py` keeps that candidate).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from electra_tf.data.records.tfrecord_io import FEATURE_NAMES  # the serializer's own framing
from electra_tf.data.records.tfrecord_io import feature_entry


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
        self.length = max_seq_length
        self.heads = ((feature_entry("input_mask", max_seq_length), 1),
                      (feature_entry("segment_ids", max_seq_length), 2))

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
