"""Whole-file record scans without TensorFlow: `integrity.scan_file` in a process without it.

The scan reads a file with `record_framing` (both CRCs checked) and decodes its records with
`example_decoding`, a batch at a time, and reports what `integrity.scan_file` reports for the
same file, as the `FileScan` both return. Nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from electra_tf.data.records.example_decoding import decode_examples
from electra_tf.data.records.record_framing import FileReader, Record, damage_message, first_bad_crc
from electra_tf.errors import DataError


class FileScan(NamedTuple):
    """What one read of a TFRecord file found (`integrity.scan_file`, or `scan_file` here).

    Attributes:
        path: str. The file.
        readable: int. Records read before the end of the file or the first unreadable one.
        bad_indices: tuple of int. Indices (< readable) of records that read but do not parse as
            examples of the expected features and length.
        error: str or None. Why reading stopped early (a corrupted or truncated record), or None
            when the whole file was read.
    """

    path: str
    readable: int
    bad_indices: Tuple[int, ...]
    error: Optional[str]

    @property
    def good(self) -> int:
        return self.readable - len(self.bad_indices)


def scan_file(path: str, max_seq_length: int, stop_at_first: bool = False,
              batch: int = 1024) -> FileScan:
    """`integrity.scan_file` without TensorFlow: the same FileScan for the same file (only the
    error text differs: it is this reader's), reading `batch` records at a time."""
    reader = FileReader(path, 0)
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
