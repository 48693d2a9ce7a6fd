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

Any file whose name ends in `.gz`, `.bz2` or `.xz` is decompressed as a stream (the archive
formats of `openwebtext` are detected by content). Memory per file is bounded: a chunk of lines
(`READ_CHUNK_BYTES`), one JSON line (at most `MAX_JSON_LINE_BYTES`).

Bad input is a counted skip, recorded with `ReadStats.note` (file, place, problem), never a crash;
what was read before it is kept:
* a truncated or corrupt compressed stream or archive ends that file ("damaged_stream", naming the
  last line or member read): nothing after the damage can be located in a gzip/bzip2/xz stream;
* unreadable archive data between members (e.g. a corrupt member header) is skipped up to the
  next valid member ("bad_archive_member", naming the member after it);
* a JSON line that is not JSON, lacks the text field (or it is not a string), or is longer than
  `MAX_JSON_LINE_BYTES` is skipped ("invalid_json", "missing_text_field", "line_too_long");
* invalid UTF-8 is replaced by U+FFFD and counted ("invalid_utf8"; the tokenizer drops it, as
  BERT's decoding with errors="ignore" does).
The builder turns any of these into an error instead with `--bad-input error`.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import lzma
import tarfile
import zlib
from typing import BinaryIO, Iterable, Iterator, List

from electra_tf.data.corpus import (_BOM, PROBLEM_BAD_MEMBER, PROBLEM_DAMAGED_STREAM,
                                    PROBLEM_INVALID_JSON, PROBLEM_INVALID_UTF8, PROBLEM_LONG_LINE,
                                    PROBLEM_MISSING_FIELD, READ_CHUNK_BYTES, CorpusFile,
                                    ReadStats, decode_utf8_located, iter_line_batches)

INPUT_FORMATS = ("text", "openwebtext", "jsonl")
DEFAULT_JSONL_TEXT_FIELD = "text"
MAX_JSON_LINE_BYTES = 64 << 20  # one JSON document; longer lines are skipped and counted
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")
# Default shard counts and shuffle buckets are planned from the text size, estimated for
# compressed files as this many times their size on disk (English text: gzip ~3x, xz ~4x).
COMPRESSION_RATIO_ESTIMATE = 3
_TAR_BLOCK = tarfile.BLOCKSIZE


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
    return path.lower().endswith(COMPRESSED_SUFFIXES)


def estimated_text_bytes(corpus_file: CorpusFile) -> int:
    """The file's text size: its size, times `COMPRESSION_RATIO_ESTIMATE` if compressed."""
    if is_compressed(corpus_file.path):
        return corpus_file.size * COMPRESSION_RATIO_ESTIMATE
    return corpus_file.size


def open_binary(path: str) -> BinaryIO:
    """The file as a binary stream, decompressed by its suffix (.gz, .bz2, .xz)."""
    lower = path.lower()
    if lower.endswith(".gz"):
        return gzip.open(path, "rb")
    if lower.endswith(".bz2"):
        return bz2.open(path, "rb")
    if lower.endswith(".xz"):
        return lzma.open(path, "rb")
    return open(path, "rb")


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


def describe_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}"[:200] if text else type(error).__name__


def iter_document_lines(corpus_file: CorpusFile, settings: InputSettings,
                        stats: ReadStats) -> Iterator[List[str]]:
    """Streams one corpus file as batches of lines, `""` ending a document.

    Args:
        corpus_file: CorpusFile.
        settings: InputSettings.
        stats: ReadStats, updated in place (counts and problem records).

    Yields:
        list[str]: stripped lines; "" marks a document end (the file's end also ends one).

    Raises:
        OSError: the file cannot be read for a reason that is not its content (e.g. EIO).
    """
    readers = {"text": _text_lines, "openwebtext": _openwebtext_lines, "jsonl": _jsonl_lines}
    if settings.input_format not in readers:
        raise ValueError(f"unknown input format {settings.input_format!r}; "
                         f"expected one of {', '.join(INPUT_FORMATS)}")
    yield from readers[settings.input_format](corpus_file, settings, stats)


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


def _text_lines(corpus_file: CorpusFile, settings: InputSettings,
                stats: ReadStats) -> Iterator[List[str]]:
    lines_before = stats.lines
    try:
        with open_binary(corpus_file.path) as stream:
            for lines in iter_line_batches(stream, stats, name=corpus_file.relpath):
                yield lines if settings.blanks_separate_docs else [x for x in lines if x]
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:
        if not is_damaged_stream_error(e):
            raise
        _damaged(stats, corpus_file, f"after line {stats.lines - lines_before}", e)


def _openwebtext_lines(corpus_file: CorpusFile, settings: InputSettings,
                       stats: ReadStats) -> Iterator[List[str]]:
    batch: List[str] = []
    batch_bytes = 0
    last = None  # name of the last member read
    next_offset = 0  # where the header after `last` should start
    found = 0
    try:
        # "r|*": a forward-only stream (bounded memory), compression detected from the content;
        # ignore_zeros: skip unreadable header blocks up to the next valid member.
        with tarfile.open(corpus_file.path, mode="r|*", ignore_zeros=True) as tar:
            for member in tar:
                found += 1
                if member.offset > next_offset:
                    stats.skipped_documents += 1
                    stats.note(corpus_file.relpath, PROBLEM_BAD_MEMBER, f"member {member.name}",
                               f"{member.offset - next_offset} bytes of unreadable archive data "
                               f"before it skipped (a corrupt member)")
                blocks = -(-member.size // _TAR_BLOCK) if member.isfile() else 0
                next_offset = member.offset_data + blocks * _TAR_BLOCK
                tar.members = []  # TarFile keeps every member it read: bound the memory
                last = member.name
                if not member.isfile():
                    continue
                stream = tar.extractfile(member)
                for lines in iter_line_batches(stream, stats, name=corpus_file.relpath,
                                               place=f"member {member.name}, "):
                    nonblank = [x for x in lines if x]
                    batch += nonblank
                    batch_bytes += sum(map(len, nonblank))
                batch.append("")  # one member, one document
                if batch_bytes >= READ_CHUNK_BYTES:
                    yield batch
                    batch, batch_bytes = [], 0
    except (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError) as e:
        if not is_damaged_stream_error(e):
            raise
        _damaged(stats, corpus_file, f"after member {last}" if last else "before any member", e)
        found = found or -1  # the error is the report
    if found == 0:
        stats.damaged_files += 1
        stats.note(corpus_file.relpath, PROBLEM_DAMAGED_STREAM, "the start",
                   "no archive member found: not a tar archive (--input-format openwebtext "
                   "reads tar archives of text files)")
    if batch:
        yield batch


def _jsonl_lines(corpus_file: CorpusFile, settings: InputSettings,
                 stats: ReadStats) -> Iterator[List[str]]:
    field = settings.jsonl_text_field
    batch: List[str] = []
    batch_bytes = 0
    line = 0
    try:
        with open_binary(corpus_file.path) as stream:
            while True:
                raw = stream.readline(MAX_JSON_LINE_BYTES + 1)
                if not raw:
                    break
                line += 1
                stats.lines += 1
                stats.bytes_read += len(raw)
                if len(raw) > MAX_JSON_LINE_BYTES and not raw.endswith(b"\n"):
                    while raw and not raw.endswith(b"\n"):  # skip the rest of the line
                        raw = stream.readline(READ_CHUNK_BYTES)
                        stats.bytes_read += len(raw)
                    stats.skipped_documents += 1
                    stats.note(corpus_file.relpath, PROBLEM_LONG_LINE, f"line {line}",
                               f"a JSON line over {MAX_JSON_LINE_BYTES >> 20} MiB, skipped")
                    continue
                if line == 1 and raw.startswith(_BOM):
                    stats.bom_files += 1
                    raw = raw[len(_BOM):]
                raw = raw.strip()
                if not raw:
                    stats.blank_lines += 1
                    continue
                sentences = _jsonl_document(raw, field, corpus_file.relpath, line, stats)
                if sentences:
                    batch += sentences
                    batch.append("")
                    batch_bytes += len(raw)
                    if batch_bytes >= READ_CHUNK_BYTES:
                        yield batch
                        batch, batch_bytes = [], 0
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:
        if not is_damaged_stream_error(e):
            raise
        _damaged(stats, corpus_file, f"after line {line}", e)
    if batch:
        yield batch


def _jsonl_document(raw: bytes, field: str, relpath: str, line: int,
                    stats: ReadStats) -> List[str]:
    """The non-blank lines of one JSON line's text field; [] (counted) if it has none."""
    undecodable = stats.undecodable_bytes
    text, _ = decode_utf8_located(raw, stats)
    if stats.undecodable_bytes > undecodable:
        stats.note(relpath, PROBLEM_INVALID_UTF8, f"line {line}",
                   "bytes that are not UTF-8, replaced by U+FFFD (dropped by the tokenizer, as "
                   "BERT does)", count=stats.undecodable_bytes - undecodable)
    try:
        record = json.loads(text)
    except ValueError as e:
        stats.skipped_documents += 1
        stats.note(relpath, PROBLEM_INVALID_JSON, f"line {line}", describe_error(e))
        return []
    value = record.get(field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        stats.skipped_documents += 1
        what = ("not a JSON object" if not isinstance(record, dict) else
                f"no field {field!r}" if field not in record else
                f"field {field!r} is {type(value).__name__}, not a string")
        stats.note(relpath, PROBLEM_MISSING_FIELD, f"line {line}",
                   f"{what} (--jsonl-text-field {field})")
        return []
    return [s for s in (part.strip() for part in value.split("\n")) if s]
