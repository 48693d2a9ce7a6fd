"""A fine-tuning task's files, as every family reads them: its directory under `raw_data_dir`,
their UTF-8 lines, and TSV / CSV rows with line numbers; `DataFileError` names file and line.

The families' own readers (GLUE and generic classification, STS, SQuAD / MRQA, CoNLL) build on
these, so a missing directory, a byte-order mark or undecodable UTF-8 is handled, and reported,
the same way for every task.
"""

from __future__ import annotations

import csv
import io
import os
from typing import List, Optional, Sequence, Tuple

from electra_tf.errors import ElectraError

# Official `debug`: the GLUE/STS readers see only the first 100 physical lines of each file.
DEBUG_MAX_LINES = 100


class DataFileError(ElectraError, ValueError):
    """A task data file is missing or malformed; the message names file and line."""


def task_directory(raw_data_dir: str, name: str, dir_names: Sequence[str] = ()) -> str:
    """The directory of task `name` in `raw_data_dir`: `name`, its lowercase, or one of
    `dir_names` (the spellings of a distribution, e.g. GLUE's `SST-2`).

    Raises:
        DataFileError: none of them is a directory.
    """
    for candidate in [name, name.lower()] + list(dir_names):
        path = os.path.join(raw_data_dir, candidate)
        if os.path.isdir(path):
            return path
    raise DataFileError(f"task {name!r}: no data directory {os.path.join(raw_data_dir, name)} "
                        f"(set raw_data_dir, or put the task's files there)")


def split_files(directory: str, split: str, extensions: Sequence[str]) -> List[str]:
    """The files `directory/<split><ext>` that exist, in `extensions`' order (a task whose split
    may come in several formats refuses more than one, in its own words)."""
    return [os.path.join(directory, split + ext) for ext in extensions
            if os.path.isfile(os.path.join(directory, split + ext))]


def decoded_lines(path: str) -> List[str]:
    """The file's text split at "\\n", a leading UTF-8 byte-order mark dropped.

    Raises:
        DataFileError: not valid UTF-8 (names file:line and the byte).
    """
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte-order mark (spreadsheet exports)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise DataFileError(f"{path}:{line}: not valid UTF-8 (byte {data[e.start]:#04x})") from None
    return text.split("\n")


def read_rows(path: str, max_lines: Optional[int] = None) -> List[Tuple[int, List[str]]]:
    """All records of a .tsv (tab-separated, no quoting) or .csv (RFC 4180) file.

    Args:
        path: str.
        max_lines: read only the first this many physical lines (official `debug`: 100).

    Returns:
        [(line number, fields)], the header included. A final newline ends the last record;
        any other empty line is an error.

    Raises:
        DataFileError: unreadable, empty, not UTF-8, or an empty line (names file:line).
    """
    if not os.path.isfile(path):
        raise DataFileError(f"{path}: no such file")
    lines = decoded_lines(path)
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    if not lines:
        raise DataFileError(f"{path}: the file is empty")
    rows = []
    if path.endswith(".csv"):
        reader = csv.reader(io.StringIO("\n".join(lines) + "\n"), strict=True)
        try:
            for fields in reader:
                if not fields or all(not f.strip() for f in fields) and len(fields) == 1:
                    raise DataFileError(f"{path}:{reader.line_num}: empty line")
                rows.append((reader.line_num, fields))
        except csv.Error as e:
            raise DataFileError(f"{path}:{reader.line_num}: {e}") from None
        return rows
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line.strip():
            raise DataFileError(f"{path}:{number}: empty line")
        rows.append((number, line.split("\t")))
    return rows
