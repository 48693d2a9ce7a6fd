"""Input formats: how a corpus file becomes document lines (plain text, OpenWebText, JSON Lines).

Every reader yields batches of stripped, non-blank lines in which `""` ends a document, so the
packer (`packing.iter_examples`) sees one format. A line is a "sentence" for packing (official
convention: one sentence per line; OpenWebText and JSON Lines give paragraphs).

* `text` (default): one sentence per line; a blank line ends a document when
  `blanks_separate_docs` (else blank lines are dropped and each file is one document).
* `openwebtext`: the layout the official `build_openwebtext_pretraining_dataset.py` reads: each
  corpus file is a tar archive (compressed or not: `.xz` in OpenWebText) of text files, one
  document per member; blank lines inside a member are not document breaks. Members are read as a
  stream in archive order (the official script extracts an archive to disk and shuffles its
  members, unseeded; here the order does not matter, since the builder shuffles examples
  globally). Non-regular members (directories, links) are skipped.
* `jsonl`: JSON Lines, one document per line, its text under `jsonl_text_field` (a top-level
  key); the text's own lines are its sentences, blank ones dropped.

Every file is recognised by its content, whatever its name (`content`): gzip, bzip2 and xz
streams are decompressed; a tar archive is read by `openwebtext` (an archive inside an archive
too, one level: OpenWebText as downloaded, `openwebtext.tar.xz`, holds the xz-compressed tar
archives `urlsf_subset*.xz`); formats that are not read (zip, 7z, rar, zstd, lz4, UTF-16, a tar
archive given as `text` or `jsonl`) and binary data (the not-text rule: more than 30% of the
first 64 KiB invalid UTF-8, NUL or control bytes) are skipped whole, each naming the file (or
member) and saying how to read it. Memory per file is bounded: a chunk of lines
(`READ_CHUNK_BYTES`); a line of a document's text is split at `MAX_LINE_BYTES` as in plain
text (counted in `lines_split`), so tokenising never sees more than that at once; parsing and
cutting one JSON line (at most `MAX_JSON_LINE_BYTES` long) holds a few copies of it (measured:
+0.26 GB peak for a 57 MB line, which cost +1.3 GB when tokenised whole).

Bad input is a counted skip, recorded with `ReadStats.note` (file, place, problem), never a crash;
what was read before it is kept:
* a truncated or corrupt compressed stream or archive ends that file ("damaged_stream", naming the
  last line or member read): nothing after the damage can be located in a gzip/bzip2/xz stream
  (a damaged archive inside an archive ends that member only);
* unreadable archive data between members (e.g. a corrupt member header) is skipped up to the
  next valid member ("bad_archive_member", naming the member after it);
* a file or archive member in a format that is not read, or binary, is skipped whole
  ("unsupported_format", "not_text"; `skipped_files` or `skipped_documents`);
* a JSON line that is not JSON (or nests deeper than `MAX_JSON_DEPTH`), lacks the text field (or
  it is not a string), or is longer than `MAX_JSON_LINE_BYTES` is skipped ("invalid_json",
  "missing_text_field", "line_too_long");
* invalid UTF-8 is replaced by U+FFFD and counted ("invalid_utf8"; the tokenizer drops it, as
  BERT's decoding with errors="ignore" does).
The builder turns any of these into an error instead with `--bad-input error`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import re
import tarfile
import zlib
from typing import BinaryIO, Callable, Iterable, Iterator, List, Optional

import numpy as np

from electra_tf.data.text import content
from electra_tf.data.text.corpus import (BOM, MAX_LINE_BYTES, PROBLEM_BAD_MEMBER,
                                    PROBLEM_DAMAGED_STREAM, PROBLEM_INVALID_JSON,
                                    PROBLEM_INVALID_UTF8, PROBLEM_LONG_LINE,
                                    PROBLEM_MISSING_FIELD, PROBLEM_NOT_TEXT,
                                    PROBLEM_UNSUPPORTED_FORMAT, READ_CHUNK_BYTES, CorpusFile,
                                    ReadStats, decode_utf8_located, iter_line_batches,
                                    split_long_line)

INPUT_FORMATS = ("text", "openwebtext", "jsonl")
DEFAULT_JSONL_TEXT_FIELD = "text"
MAX_JSON_LINE_BYTES = 64 << 20  # one JSON document; longer lines are skipped and counted
# Deeper JSON is skipped: Python's parser recurses once per level and fails past ~1000 levels,
# at a depth that depends on the caller's stack (a Beam worker's is deeper than the local
# builder's), so a fixed limit far below it keeps every engine's output the same.
MAX_JSON_DEPTH = 256
# Archives inside archives read (OpenWebText as downloaded: a tar of xz-compressed tars).
MAX_ARCHIVE_DEPTH = 2
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")
# Default shard counts and shuffle buckets are planned from the text size, estimated for
# compressed files as this many times their size on disk (English text: gzip ~3x, xz ~4x).
COMPRESSION_RATIO_ESTIMATE = 3
_TAR_BLOCK = tarfile.BLOCKSIZE
# A JSON string (escapes included): brackets inside one do not nest.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_DEPTH_PIECE = 1 << 20
# (path) -> a binary stream of the file's raw bytes; None: the builtin open. A distributed build
# passes its filesystem's (e.g. Apache Beam's FileSystems, for gs:// or hdfs:// paths).
Opener = Optional[Callable[[str], BinaryIO]]


@dataclasses.dataclass(frozen=True)
class InputSettings:
    """How corpus files are read.

    Attributes:
        input_format: one of `INPUT_FORMATS`.
        blanks_separate_docs: `text` only: a blank line ends a document.
        jsonl_text_field: `jsonl` only: the top-level key holding a document's text.
    """

    input_format: str = "text"
    blanks_separate_docs: bool = True
    jsonl_text_field: str = DEFAULT_JSONL_TEXT_FIELD


def is_compressed(path: str) -> bool:
    """Whether the name says compressed (for size estimates only: reading goes by content)."""
    return path.lower().endswith(COMPRESSED_SUFFIXES)


def estimated_text_bytes(corpus_file: CorpusFile) -> int:
    """The file's text size: its size, times `COMPRESSION_RATIO_ESTIMATE` if compressed."""
    if is_compressed(corpus_file.path):
        return corpus_file.size * COMPRESSION_RATIO_ESTIMATE
    return corpus_file.size


def _open_raw(path: str) -> BinaryIO:
    return open(path, "rb")


def is_plain_text(path: str, opener: Opener = None) -> bool:
    """Whether the file's bytes are uncompressed text (no magic bytes, not binary: `content`)."""
    with (opener or _open_raw)(path) as raw:
        sniffed = content.sniff(raw)
    return sniffed.kind is None and not content.is_binary(sniffed.head)


def is_damaged_stream_error(error: BaseException) -> bool:
    """Whether an exception from reading a stream means damaged data (not an I/O failure).

    Truncated streams raise EOFError; corrupt ones zlib.error, lzma.LZMAError, tarfile errors,
    gzip.BadGzipFile, or (bz2) an OSError without an errno. An OSError with an errno is the
    system's (disk, permissions) and is not the input's fault.
    """
    if isinstance(error, (EOFError, zlib.error, lzma.LZMAError, tarfile.TarError,
                          gzip.BadGzipFile)):
        return True
    return isinstance(error, OSError) and error.errno is None


_STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError)


def describe_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}"[:200] if text else type(error).__name__


def iter_document_lines(corpus_file: CorpusFile, settings: InputSettings,
                        stats: ReadStats, opener: Opener = None) -> Iterator[List[str]]:
    """Streams one corpus file as batches of lines, `""` ending a document.

    Args:
        corpus_file: CorpusFile.
        settings: InputSettings.
        stats: ReadStats, updated in place (counts and problem records).
        opener: how to open `corpus_file.path` (default: the builtin open).

    Yields:
        list[str]: stripped lines; "" marks a document end (the file's end also ends one).

    Raises:
        OSError: the file cannot be read for a reason that is not its content (e.g. EIO).
    """
    readers = {"text": _text_lines, "openwebtext": _openwebtext_lines, "jsonl": _jsonl_lines}
    if settings.input_format not in readers:
        raise ValueError(f"unknown input format {settings.input_format!r}; "
                         f"expected one of {', '.join(INPUT_FORMATS)}")
    yield from readers[settings.input_format](corpus_file, settings, stats, opener)


def iter_documents(line_batches: Iterable[List[str]]) -> Iterator[List[str]]:
    """Groups reader output (line batches, "" ending a document) into documents (lists of lines)."""
    current: List[str] = []
    for lines in line_batches:
        for line in lines:
            if line:
                current.append(line)
            elif current:
                yield current
                current = []
    if current:
        yield current


def _damaged(stats: ReadStats, corpus_file: CorpusFile, where: str, error: BaseException) -> None:
    stats.damaged_files += 1
    stats.note(corpus_file.relpath, PROBLEM_DAMAGED_STREAM, where,
               f"{describe_error(error)}; the rest of the file is unreadable")


def _unreadable(sniffed: content.Sniffed, archives: str) -> Optional[tuple]:
    """(problem kind, detail) when sniffed content is not text this reader reads, else None.

    Args:
        sniffed: the content after its compression layers (`content.peel`).
        archives: what to say about a tar archive (how to read it), or "" when the caller
            reads tar archives itself.
    """
    kind = sniffed.kind
    if kind == content.TAR and archives:
        return PROBLEM_UNSUPPORTED_FORMAT, f"a tar archive: {archives}"
    if kind in content.UNREAD:
        return PROBLEM_UNSUPPORTED_FORMAT, content.UNREAD[kind][1]
    if kind in content.COMPRESSIONS:
        return (PROBLEM_UNSUPPORTED_FORMAT, f"compressed more than "
                                            f"{content.MAX_COMPRESSION_LAYERS} times over")
    if kind is None and content.is_binary(sniffed.head):
        return PROBLEM_NOT_TEXT, content.describe_binary(sniffed.head)
    return None


def _text_content(raw: BinaryIO, corpus_file: CorpusFile, stats: ReadStats,
                  archives: str) -> Optional[BinaryIO]:
    """The file's text as a stream (decompressed), or None (skipped whole: noted, counted)."""
    sniffed, _ = content.peel(raw)
    problem = _unreadable(sniffed, archives)
    if problem is None:
        return sniffed.stream
    stats.skipped_files += 1
    stats.note(corpus_file.relpath, problem[0], "the start", f"{problem[1]}; the file is skipped")
    return None


def _text_lines(corpus_file: CorpusFile, settings: InputSettings, stats: ReadStats,
                opener: Opener) -> Iterator[List[str]]:
    lines_before = stats.lines
    try:
        with (opener or _open_raw)(corpus_file.path) as raw:
            stream = _text_content(raw, corpus_file, stats, "--input-format openwebtext reads "
                                                             "tar archives of text files")
            if stream is None:
                return
            for lines in iter_line_batches(stream, stats, name=corpus_file.relpath):
                yield lines if settings.blanks_separate_docs else [x for x in lines if x]
    except _STREAM_ERRORS as e:
        if not is_damaged_stream_error(e):
            raise
        _damaged(stats, corpus_file, f"after line {stats.lines - lines_before}", e)


class _Batcher:
    """Collects lines into batches of about READ_CHUNK_BYTES (documents may span batches)."""

    def __init__(self):
        self.lines: List[str] = []
        self.size = 0

    def add(self, lines: List[str], size: int) -> Optional[List[str]]:
        """Adds lines of about `size` bytes; returns a full batch to yield, or None."""
        self.lines += lines
        self.size += size
        if self.size < READ_CHUNK_BYTES:
            return None
        return self.take()

    def take(self) -> List[str]:
        batch, self.lines, self.size = self.lines, [], 0
        return batch


def _openwebtext_lines(corpus_file: CorpusFile, settings: InputSettings, stats: ReadStats,
                       opener: Opener) -> Iterator[List[str]]:
    batches = _Batcher()
    last = [None]  # name of the last member read, for the damage's place
    try:
        with (opener or _open_raw)(corpus_file.path) as raw:
            sniffed, _ = content.peel(raw)
            if sniffed.kind != content.TAR:
                problem = _unreadable(sniffed, "")
                detail = ("not a tar archive: " + (problem[1] if problem else
                                                   "it reads as text, which --input-format text "
                                                   "or jsonl reads")
                          + " (--input-format openwebtext reads tar archives of text files, "
                            "compressed or not); the file is skipped")
                stats.skipped_files += 1
                stats.note(corpus_file.relpath, PROBLEM_UNSUPPORTED_FORMAT, "the start", detail)
                return
            for lines, size in _archive_documents(sniffed.stream, corpus_file, stats, "", 1,
                                                  last):
                batch = batches.add(lines, size)
                if batch is not None:
                    yield batch
    except _STREAM_ERRORS as e:
        if not is_damaged_stream_error(e):
            raise
        _damaged(stats, corpus_file, f"after member {last[0]}" if last[0] else
                 "before any member", e)
    if batches.lines:
        yield batches.take()


def _archive_documents(stream: BinaryIO, corpus_file: CorpusFile, stats: ReadStats,
                       prefix: str, depth: int, last: list) -> Iterator[tuple]:
    """The documents of a tar stream, one per member, as ([lines..., ""], bytes) pieces.

    A member that is itself an archive (compressed or not) is read as one (depth
    `MAX_ARCHIVE_DEPTH` at most); a damaged one ends that member only. `last[0]` is kept as the
    name of the last member read (a damage of `stream` itself ends the caller's file).
    """
    next_offset = 0  # where the header after the previous member should start
    # "r|": a forward-only stream (bounded memory); ignore_zeros: skip unreadable header
    # blocks up to the next valid member.
    with tarfile.open(fileobj=stream, mode="r|", ignore_zeros=True) as tar:
        for member in tar:
            name = prefix + member.name
            if member.offset > next_offset:
                stats.skipped_documents += 1
                stats.note(corpus_file.relpath, PROBLEM_BAD_MEMBER, f"member {name}",
                           f"{member.offset - next_offset} bytes of unreadable archive data "
                           f"before it skipped (a corrupt member)")
            blocks = -(-member.size // _TAR_BLOCK) if member.isfile() else 0
            next_offset = member.offset_data + blocks * _TAR_BLOCK
            tar.members = []  # TarFile keeps every member it read: bound the memory
            last[0] = name
            if member.isfile():
                yield from _member_documents(tar.extractfile(member), name, corpus_file, stats,
                                             depth)


def _member_documents(stream: BinaryIO, name: str, corpus_file: CorpusFile, stats: ReadStats,
                      depth: int) -> Iterator[tuple]:
    """One archive member: a document, an archive of documents, or a skipped member."""
    sniffed, _ = content.peel(stream)
    if sniffed.kind == content.TAR and depth < MAX_ARCHIVE_DEPTH:
        inner_last = [None]
        try:
            yield from _archive_documents(sniffed.stream, corpus_file, stats, name + "/",
                                          depth + 1, inner_last)
        except _STREAM_ERRORS as e:
            if not is_damaged_stream_error(e):
                raise
            stats.skipped_documents += 1
            where = f"member {inner_last[0]}" if inner_last[0] else f"member {name}"
            stats.note(corpus_file.relpath, PROBLEM_DAMAGED_STREAM, where,
                       f"{describe_error(e)}; the rest of the archive {name} is "
                       "unreadable")
        return
    problem = _unreadable(sniffed, f"an archive nested more than {MAX_ARCHIVE_DEPTH} deep "
                                   "is not read")
    if problem is not None:
        stats.skipped_documents += 1
        stats.note(corpus_file.relpath, problem[0], f"member {name}",
                   f"{problem[1]}; the member is skipped")
        return
    lines: List[str] = []
    size = 0
    for batch in iter_line_batches(sniffed.stream, stats, name=corpus_file.relpath,
                                   place=f"member {name}, "):
        nonblank = [x for x in batch if x]
        lines += nonblank
        size += sum(map(len, nonblank))
        if size >= READ_CHUNK_BYTES:  # a long member: hand it on in pieces (bounded memory)
            yield lines, size
            lines, size = [], 0
    yield lines + [""], size  # one member, one document


def _jsonl_lines(corpus_file: CorpusFile, settings: InputSettings, stats: ReadStats,
                 opener: Opener) -> Iterator[List[str]]:
    batches = _Batcher()
    line = 0
    try:
        with (opener or _open_raw)(corpus_file.path) as raw:
            stream = _text_content(raw, corpus_file, stats, "JSON Lines are text; "
                                                             "--input-format openwebtext reads "
                                                             "tar archives of text files")
            if stream is None:
                return
            while True:
                sentences = _next_jsonl_document(stream, corpus_file.relpath, line + 1,
                                                 settings.jsonl_text_field, stats)
                if sentences is None:
                    break
                line += 1
                if not sentences:
                    continue
                for piece in _pieces(sentences, stats):
                    batch = batches.add(piece, sum(map(len, piece)))
                    if batch is not None:
                        yield batch
                batch = batches.add([""], 0)
                if batch is not None:
                    yield batch
    except _STREAM_ERRORS as e:
        if not is_damaged_stream_error(e):
            raise
        _damaged(stats, corpus_file, f"after line {line}", e)
    if batches.lines:
        yield batches.take()


def _next_jsonl_document(stream: BinaryIO, relpath: str, line: int, field: str,
                         stats: ReadStats) -> Optional[List[str]]:
    """Reads JSON line number `line`: the non-blank lines of its text field, [] if it has none
    (a blank line, or a skipped one: counted), None at the end of the stream.

    One function holds the line's bytes, its text and its parsed value in turn, each dropped
    once the next exists: about two copies of the line at a time while parsing.
    """
    raw = stream.readline(MAX_JSON_LINE_BYTES + 1)
    if not raw:
        return None
    stats.lines += 1
    stats.bytes_read += len(raw)
    if len(raw) > MAX_JSON_LINE_BYTES and not raw.endswith(b"\n"):
        while raw and not raw.endswith(b"\n"):  # skip the rest of the line
            raw = stream.readline(READ_CHUNK_BYTES)
            stats.bytes_read += len(raw)
        stats.skipped_documents += 1
        stats.note(relpath, PROBLEM_LONG_LINE, f"line {line}",
                   f"a JSON line over {MAX_JSON_LINE_BYTES >> 20} MiB, skipped")
        return []
    if line == 1 and raw.startswith(BOM):
        stats.bom_files += 1
        raw = raw[len(BOM):]
    if not raw.strip():
        stats.blank_lines += 1
        return []
    if json_too_deep(raw):
        stats.skipped_documents += 1
        stats.note(relpath, PROBLEM_INVALID_JSON, f"line {line}",
                   f"arrays or objects nested more than {MAX_JSON_DEPTH} deep")
        return []
    undecodable = stats.undecodable_bytes
    text, _ = decode_utf8_located(raw, stats)
    del raw
    if stats.undecodable_bytes > undecodable:
        stats.note(relpath, PROBLEM_INVALID_UTF8, f"line {line}",
                   "bytes that are not UTF-8, replaced by U+FFFD (dropped by the tokenizer, as "
                   "BERT does)", count=stats.undecodable_bytes - undecodable)
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as e:
        # RecursionError: nesting the depth check let through (this parser's limit depends on
        # the stack in use); skipped all the same.
        stats.skipped_documents += 1
        stats.note(relpath, PROBLEM_INVALID_JSON, f"line {line}", describe_error(e))
        return []
    del text
    value = record.get(field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        stats.skipped_documents += 1
        what = ("not a JSON object" if not isinstance(record, dict) else
                f"no field {field!r}" if field not in record else
                f"field {field!r} is {type(value).__name__}, not a string")
        stats.note(relpath, PROBLEM_MISSING_FIELD, f"line {line}",
                   f"{what} (--jsonl-text-field {field})")
        return []
    del record
    return [s for s in (part.strip() for part in value.split("\n")) if s]


def _pieces(sentences: List[str], stats: ReadStats) -> Iterator[List[str]]:
    """A document's sentences in runs of about READ_CHUNK_BYTES, a sentence longer than
    MAX_LINE_BYTES cut into pieces as plain text's lines are (`corpus.split_long_line`)."""
    run: List[str] = []
    size = 0
    for sentence in sentences:
        # A str of n characters is at most 4n UTF-8 bytes: only long ones are measured.
        parts = ([sentence] if 4 * len(sentence) <= MAX_LINE_BYTES
                 else split_long_line(sentence, MAX_LINE_BYTES, stats))
        for part in parts:
            part = part.strip()  # a piece cut at a space starts with it; "" would end the doc
            if not part:
                continue
            run.append(part)
            size += len(part)
            if size >= READ_CHUNK_BYTES:
                yield run
                run, size = [], 0
    if run:
        yield run


def json_too_deep(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text `data` nests arrays and objects more than `limit` deep.

    Brackets inside strings do not count. Linear time; a line with few brackets is decided by
    counting them.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    structure = _JSON_STRING.sub(b"", data)
    depth = 0
    for start in range(0, len(structure), _DEPTH_PIECE):
        piece = np.frombuffer(structure, np.uint8, min(_DEPTH_PIECE, len(structure) - start),
                              start)
        steps = ((piece == ord("[")) | (piece == ord("{"))).astype(np.int32) - (
            (piece == ord("]")) | (piece == ord("}")))
        running = np.cumsum(steps) + depth
        if running.max() > limit:
            return True
        depth = int(running[-1])
    return False
