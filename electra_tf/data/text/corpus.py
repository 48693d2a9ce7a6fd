"""Streaming, bounded-memory reading of a plain-text corpus directory.

Input convention (official builder, section 1.1 of `official_electra.md`): one sentence per line,
a blank line ends a document, the end of a file ends a document. Lines are split on "\\n" only
(as `tf.io.gfile.GFile` iteration does) and stripped, so CRLF line ends and surrounding
whitespace vanish.

Robustness (none of this exists in the official builder):
* Files are read in binary chunks of `READ_CHUNK_BYTES`; at most one chunk plus one partial line
  is held, so a 2 GB file is never read whole.
* A line longer than `MAX_LINE_BYTES` is cut into pieces of at most that many bytes (at a space
  if one is near the cut, else at a UTF-8 character boundary); each piece becomes its own line.
  Such lines are counted (`lines_split`). Far more text than any example can hold is in one
  piece (1 MiB is ~200k tokens), so this changes nothing for real corpora.
* Invalid UTF-8 is decoded with U+FFFD replacement and the replaced bytes are counted; NUL
  bytes, CRLF line ends and a leading byte-order mark (dropped) are counted too.
* Hidden entries (names starting with ".") are skipped; files are listed recursively in sorted
  order of their relative POSIX paths.
* What reading met is counted in `ReadStats`; problems that name a place (invalid UTF-8, a
  damaged stream, a skipped JSON line or archive member) are also recorded per (file, kind) with
  the first place they occurred, for the manifest.

The input formats built on this (compressed streams, OpenWebText archives, JSON Lines) are in
`formats`.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import os
import stat
from typing import BinaryIO, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

from electra_tf.errors import ElectraError, shown_path

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES = 1 << 20  # binary read size; also the unit of tokenisation batches
MAX_LINE_BYTES = 1 << 20  # longer lines are split into pieces of at most this many bytes
_READ_PIECE_BYTES = 1 << 16  # a chunk is read in pieces of this size (see `_read_chunks`)
_SPLIT_AT_SPACE_WINDOW = 4096  # look this far back from the cut for a space to split at
# The UTF-8 byte order mark some editors write first: dropped (and counted) at the start of a
# file by every reader of corpus text, the JSON readers of `formats` too.
BOM = codecs.BOM_UTF8
_ERROR_HANDLER = "electra_tf.count_replace"


class CorpusError(ElectraError, ValueError):
    """The corpus directory is missing or empty, or a file in it cannot be read."""


class CorpusFile(NamedTuple):
    """One input file: `relpath` (POSIX, relative to the corpus dir), `path`, `size` in bytes."""

    relpath: str
    path: str
    size: int


@dataclasses.dataclass
class ReadStats:
    """Counters of what reading met; summed over files and jobs for the manifest."""

    bytes_read: int = 0
    lines: int = 0  # lines after splitting over-long ones, blank lines included
    blank_lines: int = 0
    undecodable_bytes: int = 0  # bytes of invalid UTF-8, each run replaced by U+FFFD
    nul_bytes: int = 0
    crlf_line_ends: int = 0
    bom_files: int = 0  # files that started with a UTF-8 byte-order mark (dropped)
    lines_split: int = 0  # lines longer than MAX_LINE_BYTES (each cut into pieces)
    skipped_documents: int = 0  # JSON lines or archive members that could not be used
    skipped_files: int = 0  # files not read at all: binary, or a format that is not read
    damaged_files: int = 0  # files whose compressed stream or archive broke off (rest unread)
    # "file\0kind" -> {"file", "problem", "count", "first", "detail"} (see `note`).
    problems: Dict[str, dict] = dataclasses.field(default_factory=dict)

    def add(self, other: "ReadStats") -> None:
        for field in dataclasses.fields(self):
            if field.name != "problems":
                setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))
        for key, entry in other.problems.items():
            if key in self.problems:
                self.problems[key]["count"] += entry["count"]
            else:
                self.problems[key] = dict(entry)

    def note(self, file: str, kind: str, where: str, detail: str = "", count: int = 1) -> None:
        """Records `count` occurrences of a problem of `kind` in `file`; the first keeps its place.

        Args:
            file: the file's path relative to the corpus dir (recorded escaped, `shown_path`).
            kind: one of the `PROBLEM_*` names.
            where: the place of the first occurrence ("line 12", "member a/b.txt", ...).
            detail: what was wrong there, one line.
            count: occurrences (bytes for invalid UTF-8).
        """
        file = shown_path(file)
        key = f"{file}\0{kind}"
        if key in self.problems:
            self.problems[key]["count"] += count
        else:
            self.problems[key] = {"file": file, "problem": kind, "count": count,
                                  "first": shown_path(where), "detail": detail}


# Problem kinds recorded by `ReadStats.note` (and listed in the manifest).
PROBLEM_INVALID_UTF8 = "invalid_utf8"  # count = bytes replaced by U+FFFD
PROBLEM_DAMAGED_STREAM = "damaged_stream"  # truncated / corrupt compressed stream or archive
PROBLEM_BAD_MEMBER = "bad_archive_member"  # unreadable archive data skipped between members
PROBLEM_INVALID_JSON = "invalid_json"
PROBLEM_MISSING_FIELD = "missing_text_field"  # no string under the configured text field
PROBLEM_LONG_LINE = "line_too_long"  # a JSON line over the size limit, skipped
PROBLEM_NOT_TEXT = "not_text"  # a file or member of binary data (formats' not-text rule)
PROBLEM_UNSUPPORTED_FORMAT = "unsupported_format"  # zip, zstd, UTF-16, ...: how to convert it
# Problems that skip a whole file: the build warns about them on their own line.
WHOLE_FILE_PROBLEMS = (PROBLEM_NOT_TEXT, PROBLEM_UNSUPPORTED_FORMAT)


def format_problem(entry: dict) -> str:
    """One line naming the file, the place and the problem (for logs and errors)."""
    what = f"{entry['problem']} at {entry['first']}"
    if entry.get("detail"):
        what += f" ({entry['detail']})"
    if entry["count"] > 1:
        what += f", {entry['count']} in this file"
    return f"{entry['file']}: {what}"


# Replacement decoding that also counts the bytes it replaced. Registered once per process; the
# counter is read around each decode call (decoding is single-threaded here).
_replaced = [0]


def _count_replace(error: UnicodeDecodeError):
    _replaced[0] += error.end - error.start
    return "\ufffd", error.end


try:
    codecs.lookup_error(_ERROR_HANDLER)
except LookupError:
    codecs.register_error(_ERROR_HANDLER, _count_replace)


def decode_utf8(data: bytes, stats: ReadStats) -> str:
    """Decodes UTF-8, replacing invalid bytes with U+FFFD and counting them in `stats`."""
    return decode_utf8_located(data, stats)[0]


def decode_utf8_located(data: bytes, stats: ReadStats) -> Tuple[str, int]:
    """`decode_utf8`, also returning the byte offset of the first invalid byte (-1 if none)."""
    try:
        return data.decode("utf-8"), -1
    except UnicodeDecodeError as e:
        before = _replaced[0]
        text = data.decode("utf-8", _ERROR_HANDLER)
        stats.undecodable_bytes += _replaced[0] - before
        return text, e.start


def list_corpus_files(corpus_dir: str) -> List[CorpusFile]:
    """Lists the corpus files, checking each is a readable regular file.

    Returns:
        `CorpusFile`s sorted by relative path.

    Raises:
        CorpusError: the directory is missing, holds no files, or a file is unreadable, not a
            regular file, or a dangling link; the message names the path.
    """
    if not os.path.isdir(corpus_dir):
        what = "is not a directory" if os.path.exists(corpus_dir) else "does not exist"
        raise CorpusError(f"corpus dir {shown_path(corpus_dir)} {what}")
    files = []
    for root, dirs, names in os.walk(corpus_dir, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(root, name)
            try:
                info = os.stat(path)
            except OSError as e:
                raise CorpusError(f"cannot read corpus file {shown_path(path)}: {e.strerror}") from e
            if not stat.S_ISREG(info.st_mode):
                raise CorpusError(f"corpus entry {shown_path(path)} is not a regular file")
            try:
                with open(path, "rb") as f:
                    f.read(1)
            except OSError as e:
                raise CorpusError(f"cannot read corpus file {shown_path(path)}: {e.strerror}") from e
            relpath = os.path.relpath(path, corpus_dir).replace(os.sep, "/")
            files.append(CorpusFile(relpath, path, info.st_size))
    if not files:
        raise CorpusError(f"corpus dir {shown_path(corpus_dir)} contains no files")
    files.sort(key=lambda f: f.relpath)
    return files


def _cut_point(data: bytes, limit: int) -> int:
    """Where to cut `data` (longer than `limit`) so the head holds at most `limit` bytes."""
    space = data.rfind(b" ", max(1, limit - _SPLIT_AT_SPACE_WINDOW), limit + 1)
    if space > 0:
        return space
    cut = limit
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # never cut inside a UTF-8 sequence
        cut -= 1
    return cut if cut > 0 else limit


def _split_long(raw_lines: List[bytes], limit: int, stats: ReadStats,
                first_counted: bool) -> List[bytes]:
    out = []
    for i, raw in enumerate(raw_lines):
        if len(raw) <= limit:
            out.append(raw)
            continue
        if not (i == 0 and first_counted):
            stats.lines_split += 1
        while len(raw) > limit:
            cut = _cut_point(raw, limit)
            out.append(raw[:cut])
            raw = raw[cut:]
        out.append(raw)
    return out


def split_long_line(line: str, limit: int, stats: ReadStats) -> List[str]:
    """`line` cut into pieces of at most `limit` UTF-8 bytes, as `iter_line_batches` cuts a
    file's long lines (at a space near the cut, else at a character boundary); a line that was
    cut is counted in `stats.lines_split`. Lone surrogates (from JSON escapes) survive."""
    raw = line.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return [line]
    return [piece.decode("utf-8", "surrogatepass")
            for piece in _split_long([raw], limit, stats, first_counted=False)]


def iter_line_batches(source: Union[str, BinaryIO], stats: ReadStats,
                      chunk_bytes: Optional[int] = None, max_line_bytes: Optional[int] = None,
                      name: Optional[str] = None, place: str = "") -> Iterator[List[str]]:
    """Streams a file as batches of stripped lines ("" marks a blank line).

    Memory is bounded by about `chunk_bytes + max_line_bytes` of input at a time. A piece of a
    split line that is only whitespace reads as a blank line.

    Args:
        source: str (a file path) or a binary stream (e.g. a decompressing reader; not closed).
        stats: ReadStats. Updated in place as the file is read; invalid UTF-8 is also recorded
            with `stats.note` under `name`, with the line of its first occurrence.
        chunk_bytes: int. Binary read size (default `READ_CHUNK_BYTES`).
        max_line_bytes: int. Longer lines are split into pieces (default `MAX_LINE_BYTES`).
        name: str. The file's name in problem records (default: the path).
        place: str. Prefix of the line in problem records (e.g. "member a.txt, ").

    Yields:
        list[str]: the stripped lines of one chunk, in order.

    Raises:
        OSError (and whatever the stream raises, e.g. EOFError for a truncated compressed
        stream): the source cannot be read. Lines before the failure have been yielded.
    """
    if isinstance(source, str):
        with open(source, "rb") as f:
            yield from iter_line_batches(f, stats, chunk_bytes, max_line_bytes, name or source,
                                         place)
        return
    name = name or getattr(source, "name", "<stream>")
    chunk_bytes = chunk_bytes or READ_CHUNK_BYTES
    max_line_bytes = max_line_bytes or MAX_LINE_BYTES
    decoded = _LineDecoder(stats, name, place)
    try:
        yield from _iter_lines(source, stats, decoded, chunk_bytes, max_line_bytes)
    finally:  # also when the stream fails: what was replaced so far is recorded
        decoded.finish()


def _iter_lines(source: BinaryIO, stats: ReadStats, decoded: "_LineDecoder", chunk_bytes: int,
                max_line_bytes: int) -> Iterator[List[str]]:
    pending = b""  # the unfinished last line of the previous chunk
    pending_split = False  # pending continues a line already counted in lines_split
    first = True
    for chunk in _read_chunks(source, chunk_bytes):
        if first and chunk.startswith(BOM):
            stats.bom_files += 1
            stats.bytes_read += len(BOM)
            chunk = chunk[len(BOM):]
        first = False
        stats.bytes_read += len(chunk)
        stats.nul_bytes += chunk.count(b"\x00")
        # A CRLF can straddle chunks: the \r ends `pending` and the \n starts `chunk`.
        stats.crlf_line_ends += chunk.count(b"\r\n") + (
            pending.endswith(b"\r") and chunk.startswith(b"\n"))
        data = pending + chunk if pending else chunk
        cut = data.rfind(b"\n")
        pieces: List[bytes] = []
        if cut >= 0:
            complete, pending = data[:cut], data[cut + 1:]
            raw_lines = complete.split(b"\n")
            if max(map(len, raw_lines)) > max_line_bytes:
                pieces = _split_long(raw_lines, max_line_bytes, stats, pending_split)
            else:
                pieces = [complete]  # fast path: decode the chunk's lines in one call
            pending_split = False
        else:
            pending = data
        while len(pending) > max_line_bytes:
            # No newline in sight: emit the line's head now so memory stays bounded.
            if not pending_split:
                stats.lines_split += 1
                pending_split = True
            head = _cut_point(pending, max_line_bytes)
            pieces.append(pending[:head])
            pending = pending[head:]
        if pieces:
            yield decoded(pieces)
    if pending:
        yield decoded([pending])


def _read_chunks(source: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    """Chunks of about `chunk_bytes`, read in small pieces (`read1`) so that a read error (e.g.
    a truncated compressed stream) is raised only after the data before it was handed on."""
    read = getattr(source, "read1", None) or source.read
    piece = min(chunk_bytes, _READ_PIECE_BYTES)
    parts: List[bytes] = []
    size = 0
    while True:
        try:
            data = read(piece)
        except Exception:
            if parts:
                yield b"".join(parts)
            raise
        if not data:
            break
        parts.append(data)
        size += len(data)
        if size >= chunk_bytes:
            yield b"".join(parts)
            parts, size = [], 0
    if parts:
        yield b"".join(parts)


class _LineDecoder:
    """Decodes batches of raw lines of one file, counting lines and locating invalid UTF-8."""

    def __init__(self, stats: ReadStats, name: str, place: str):
        self.stats = stats
        self.name = name
        self.place = place
        self.line = 0  # lines decoded so far in this file
        self.first_bad_line = 0  # 1-based line of the first invalid byte, 0 if none yet
        self.undecodable_before = stats.undecodable_bytes

    def __call__(self, pieces: List[bytes]) -> List[str]:
        data = pieces[0] if len(pieces) == 1 else b"\n".join(pieces)
        text, bad = decode_utf8_located(data, self.stats)
        if bad >= 0 and not self.first_bad_line:
            self.first_bad_line = self.line + data.count(b"\n", 0, bad) + 1
        lines = [line.strip() for line in text.split("\n")]
        self.line += len(lines)
        self.stats.lines += len(lines)
        self.stats.blank_lines += lines.count("")
        return lines

    def finish(self) -> None:
        replaced = self.stats.undecodable_bytes - self.undecodable_before
        self.undecodable_before = self.stats.undecodable_bytes
        if replaced:
            where = f"{self.place}line {self.first_bad_line}"
            self.stats.note(self.name, PROBLEM_INVALID_UTF8, where,
                            "bytes that are not UTF-8, replaced by U+FFFD (dropped by the "
                            "tokenizer, as BERT does)", count=replaced)


def warn_long_lines(counts: dict, long_lines: List[dict], max_seq_length: int) -> None:
    """Warns when lines far longer than an example lost most of their text (the builder's
    closing lines; `counts`: the manifest's, `long_lines`: inputs.jsonl entries with
    `lines_split`).

    A line is one sentence to the packer: whatever does not fit in one example of
    max_seq_length tokens is dropped. Lines over MAX_LINE_BYTES are split into pieces
    of that size first (each piece then fills at most one example); the warning names the
    files and how much of their text was dropped.
    """
    dropped, tokens = counts["truncated_tokens"], max(counts["tokenized_tokens"], 1)
    if long_lines:
        first = long_lines[0]
        lost = sum(e["truncated_tokens"] for e in long_lines)
        total = max(sum(e["tokens"] for e in long_lines), 1)
        logger.warning(
            "%d line(s) longer than %d bytes in %d file(s) were split into pieces of that size, "
            "but an example holds at most %d tokens: %d of those files' %d tokens (%.1f%%) were "
            "dropped; first: %s (%d line(s)); put one sentence or paragraph per line",
            counts["lines_split"], MAX_LINE_BYTES, len(long_lines),
            max_seq_length, lost, total, 100 * lost / total, first["file"],
            first["lines_split"])
    elif dropped > tokens // 2:
        logger.warning(
            "%d of the %d tokens read (%.1f%%) were dropped: lines longer than an example (%d "
            "tokens) are truncated; put one sentence or paragraph per line", dropped, tokens,
            100 * dropped / tokens, max_seq_length)
