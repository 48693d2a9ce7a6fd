"""TFRecord files read and written without TensorFlow: the framing, records, positions, damage.

The framing is read with plain file I/O (local or mounted files): a uint64 length, the masked
CRC32C of the length, the data, the masked CRC32C of the data. `FileReader` reads the records of
one file in order from any byte offset (a restored reader seeks there) and checks each length's
CRC when the record is read (a bad length must not be trusted); the data CRCs are checked by the
caller in bulk, over all records read for a window (or batch), before any of it is used
(`first_bad_crc`, with `record_crc.crc32c_batch`: google-crc32c). Damage is treated as TensorFlow's
reader treats it: a bad CRC, or a file that ends inside a record's length+data, is a `DataError`
naming the file, the record index and its byte offset (`damage_message`); a file that ends inside
the 12-byte header of a record ends cleanly there.

GZIP shards are not read: the builder writes uncompressed shards and the TF pipeline reads
them uncompressed (a compressed file fails its first CRC, as it does there).

`RecordWriter` writes the same framing, byte for byte what `tf.io.TFRecordWriter` writes: the
local builder writes its shards with it, with or without TensorFlow.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import struct
from typing import Dict, Iterator, NamedTuple, Optional, Sequence

import numpy as np

from electra_tf.data.records.record_crc import crc32c, crc32c_batch, masked_crc
from electra_tf.errors import DataError

READ_BUFFER = 1 << 18  # bytes of read buffer per open file (as TFRecordDataset's 256 KiB)


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
WRITE_BUFFER = 1 << 20  # bytes buffered per file being written
_length_crc_cache: Dict[bytes, int] = {}


def _length_ok(header: bytes, stored: int) -> bool:
    length_bytes = header[:8]
    expected = _length_crc_cache.get(length_bytes)
    if expected is None:
        expected = masked_crc(crc32c(length_bytes))
        if len(_length_crc_cache) < 1 << 16:
            _length_crc_cache[length_bytes] = expected
    return expected == stored


class FileReader:
    """Sequential records of one TFRecord file from a byte offset (length CRC checked here,
    the data CRC by the caller, in bulk).

    Args:
        path: str. The TFRecord file (local or mounted).
        file_index: int. Its index in the caller's file list (kept in each `Record`).
        index: int. The index of the record at `offset` in the file.
        offset: int. The byte offset of that record's header.
    """

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
    reader = FileReader(path, 0)
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


class RecordWriter:
    """Writes a TFRecord file, uncompressed (what `tf.io.TFRecordWriter(path)` writes).

    Args:
        path: str. A local file, created or truncated.
    """

    def __init__(self, path: str):
        self._file = open(path, "wb", buffering=WRITE_BUFFER)

    def write(self, data: bytes) -> None:
        """Appends one record: length, its masked CRC32C, the data, the data's masked CRC32C."""
        length = _LENGTH.pack(len(data))
        self._file.write(b"".join((length, _FOOTER.pack(masked_crc(crc32c(length))), data,
                                   _FOOTER.pack(masked_crc(crc32c(data))))))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
