"""What a corpus file's bytes are, whatever its name: compressed, an archive, text or binary.

A file named `x.txt` may hold gzip data, and `openwebtext.tar.xz` holds xz-compressed tar
archives inside a tar archive; read by their names, both became "text" of undecodable bytes that
the tokenizer turned into [UNK] pieces. So every corpus stream is recognised by its content:

* magic bytes at its start: gzip (1F 8B), bzip2 (`BZh` + level + block or end marker), xz
  (FD 37 7A 58 5A 00) are decompressed (`peel`); a tar archive has `ustar` at byte 257; zip,
  7z, rar, zstd, lz4 and UTF-16 byte-order marks are recognised but not read (`UNREAD`: the
  reader says how to convert them);
* the **not-text rule** (`not_text_share`): if more than `MAX_NOT_TEXT_SHARE` (30%) of the first
  `HEAD_BYTES` (64 KiB) of a stream's content, after decompression, are invalid UTF-8, NUL or
  other control bytes (all but tab, line feed, vertical tab, form feed, carriage return), the
  stream is binary, not text. Text in a legacy 8-bit encoding (Latin-1 accents: a few percent)
  stays far below it; random, compressed or image bytes are above 50%.

`sniff` reads the head once and hands back a stream that replays it, so nothing is read twice
and forward-only streams (archive members, Beam's filesystems) work.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
from typing import BinaryIO, List, NamedTuple, Optional, Tuple

from electra_tf.data.text.corpus import ReadStats, decode_utf8

HEAD_BYTES = 64 << 10  # how much of a stream the magic bytes and the not-text rule look at
MAX_NOT_TEXT_SHARE = 0.30  # more than this share of the head not being text: binary
MAX_COMPRESSION_LAYERS = 3  # x.gz.xz...: more layers than this are not peeled
_READ_PIECE = 16 << 10
_TAR_MAGIC_OFFSET = 257  # POSIX ustar and GNU tar headers: b"ustar" here

GZIP, BZIP2, XZ, TAR = "gzip", "bzip2", "xz", "tar"
COMPRESSIONS = (GZIP, BZIP2, XZ)
_BZIP2_MAGIC = re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)")  # a block or the end of stream
# Recognised, not read: kind -> (magic at offset 0, how the user gets text out of it).
UNREAD = {
    "zip": ((b"PK\x03\x04", b"PK\x05\x06"), "a zip archive: extract it (unzip) into the corpus "
                                            "dir"),
    "7z": ((b"7z\xbc\xaf\x27\x1c",), "a 7z archive: extract it (7z x) into the corpus dir"),
    "rar": ((b"Rar!\x1a\x07",), "a rar archive: extract it (unrar x) into the corpus dir"),
    "zstd": ((b"\x28\xb5\x2f\xfd",), "zstd-compressed: decompress it (zstd -d), or recompress "
                                     "it with gzip, bzip2 or xz"),
    "lz4": ((b"\x04\x22\x4d\x18",), "lz4-compressed: decompress it (lz4 -d), or recompress it "
                                    "with gzip, bzip2 or xz"),
    "utf-16": ((b"\xff\xfe", b"\xfe\xff"), "UTF-16 text (it starts with a UTF-16 byte-order "
                                           "mark): convert it to UTF-8 (iconv -f UTF-16 -t "
                                           "UTF-8)"),
}
# Bytes that are not text: NUL and the C0 controls other than \t \n \v \f \r.
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x20)])


def detect(head: bytes) -> Optional[str]:
    """The kind of data `head` (a stream's first bytes) starts: one of `COMPRESSIONS`, `TAR`, a
    key of `UNREAD`, or None (no magic bytes: text or unrecognised binary data)."""
    if head.startswith(b"\x1f\x8b"):
        return GZIP
    if head.startswith(b"\xfd7zXZ\x00"):
        return XZ
    if _BZIP2_MAGIC.match(head):
        return BZIP2
    if head[_TAR_MAGIC_OFFSET:_TAR_MAGIC_OFFSET + 5] == b"ustar":
        return TAR
    for kind, (magics, _) in UNREAD.items():
        if head.startswith(magics):
            return kind
    return None


def not_text_share(head: bytes) -> float:
    """The share of `head`'s bytes that are not text: invalid UTF-8, NUL and control bytes.

    A UTF-8 sequence cut by the end of `head` is not counted (the head is a prefix).
    """
    if not head:
        return 0.0
    cut = len(head)
    for back in range(1, min(4, len(head)) + 1):  # a lead byte of a sequence the cut split?
        byte = head[-back]
        if byte < 0x80:
            break
        if byte >= 0xC0:
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if needed > back:
                cut = len(head) - back
            break
    sample = head[:cut]
    stats = ReadStats()
    decode_utf8(sample, stats)
    control = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    return (stats.undecodable_bytes + control) / max(len(sample), 1)


def is_binary(head: bytes) -> bool:
    """The not-text rule (module docstring)."""
    return not_text_share(head) > MAX_NOT_TEXT_SHARE


def describe_binary(head: bytes) -> str:
    """Why a stream was judged binary, for the problem record."""
    return (f"{100 * not_text_share(head):.0f}% of its first {len(head)} bytes are not UTF-8 "
            f"text (invalid UTF-8, NUL or control bytes; the limit is "
            f"{100 * MAX_NOT_TEXT_SHARE:.0f}%): binary data, not read")


class _Replay(io.RawIOBase):
    """A stream's head (already read), then the rest of the stream; an error met while reading
    the head is raised once the head is used up (what was read before it is kept)."""

    def __init__(self, head: bytes, rest: BinaryIO, error: Optional[BaseException]):
        super().__init__()
        self.head, self.rest, self.error = memoryview(head), rest, error
        self.read_rest = getattr(rest, "read1", None) or rest.read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        data = self.read_rest(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _read_head(stream: BinaryIO, size: int) -> Tuple[bytes, Optional[BaseException]]:
    """Up to `size` bytes from `stream`, in small pieces; (bytes, the error that stopped it)."""
    read = getattr(stream, "read1", None) or stream.read
    parts: List[bytes] = []
    total = 0
    while total < size:
        try:
            data = read(min(_READ_PIECE, size - total))
        except Exception as e:  # noqa: BLE001 -- handed on: raised when the head is used up
            return b"".join(parts), e
        if not data:
            break
        parts.append(data)
        total += len(data)
    return b"".join(parts), None


class Sniffed(NamedTuple):
    """A stream with what its head says: `kind` (`detect`), `head` (its first bytes), `stream`
    (a binary stream replaying the head, then the rest)."""

    kind: Optional[str]
    head: bytes
    stream: BinaryIO


def sniff(stream: BinaryIO, head_bytes: int = HEAD_BYTES) -> Sniffed:
    """Reads the head of `stream` and recognises it (see `Sniffed`); `stream` is not closed."""
    head, error = _read_head(stream, head_bytes)
    replay = io.BufferedReader(_Replay(head, stream, error), buffer_size=_READ_PIECE)
    return Sniffed(detect(head), head, replay)


def decompressor(kind: str, stream: BinaryIO) -> BinaryIO:
    """A decompressing reader of `stream` for one of `COMPRESSIONS`."""
    if kind == GZIP:
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if kind == BZIP2:
        return bz2.BZ2File(stream, "rb")
    return lzma.LZMAFile(stream, "rb")


def peel(stream: BinaryIO) -> Tuple[Sniffed, List[str]]:
    """Decompresses `stream` while its content is gzip, bzip2 or xz (at most
    `MAX_COMPRESSION_LAYERS` layers).

    Returns:
        (the innermost content sniffed, the compressions peeled, outermost first). Readers of
        the returned stream hold references to the decompressors; nothing needs closing but
        `stream` itself (decompressors of an open file release nothing more when closed).
    """
    sniffed = sniff(stream)
    layers: List[str] = []
    while sniffed.kind in COMPRESSIONS and len(layers) < MAX_COMPRESSION_LAYERS:
        layers.append(sniffed.kind)
        sniffed = sniff(decompressor(sniffed.kind, sniffed.stream))
    return sniffed, layers
