"""CRC32C (Castagnoli) of TFRecord data, and TFRecord's mask of it, without TensorFlow.

A TFRecord file stores the masked CRC32C of each record's length and of its data; the
TensorFlow-free reader (`record_framing`, `record_reader.BatchReader`) checks both for every
record read, as TensorFlow's reader does, and the builder's shard writer
(`record_framing.RecordWriter`) computes them. The CRC is the `google-crc32c` package's (a
dependency: C with the CPU's CRC32 instructions). It replaced a hand-written numpy
slicing-by-8 over records (issue 48): ~0.2 us per 550-byte record against ~10 us, and the
whole reader 1.7x faster (docs/benchmarks.md, "The TensorFlow-free reader's parts").

Where the package has no compiled extension (no wheel for the platform) it falls back to pure
Python, ~1 ms per record: the reader then warns once (`crc32c_batch`).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import logging
from typing import Sequence

import google_crc32c
import numpy as np

logger = logging.getLogger(__name__)

_MASK_DELTA = 0xA282EAD8
_VALUE = google_crc32c.value
_warned_slow = False


def crc32c(data: bytes) -> int:
    """CRC32C of `data` (bytes)."""
    return _VALUE(data)


def crc32c_batch(records: Sequence[bytes]) -> np.ndarray:
    """uint32 [n]: the CRC32C of each record."""
    global _warned_slow
    if not _warned_slow and google_crc32c.implementation != "c":
        _warned_slow = True
        logger.warning("google-crc32c has no compiled extension on this platform: checking "
                       "TFRecord CRCs in pure Python costs ~1 ms per record (install a "
                       "google-crc32c wheel for this platform)")
    return np.fromiter(map(_VALUE, records), np.uint32, len(records))


def masked_crc(crc):
    """TFRecord's mask of a CRC (ints or uint32 arrays)."""
    if isinstance(crc, np.ndarray):
        crc = crc.astype(np.uint32)
        with np.errstate(over="ignore"):
            return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF
