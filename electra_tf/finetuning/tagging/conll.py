"""The CoNLL-style reader (official `TaggingTask._get_labeled_sentences`), for every tagging task.

One word per line, fields separated by whitespace (spaces or tabs, any number; a trailing "\r"
of CRLF files and trailing whitespace are ignored; a UTF-8 byte-order mark is dropped); the word
is the first field and the tag the field `label_column` (0-based, negative counts from the end;
default -1, the last: so in CoNLL-2000's "word POS chunk" the POS column is ignored, as
officially, and CoNLL-2003's "word POS chunk NER" gives the NER tags); a line whose first field
is "-DOCSTART-" is skipped; a blank line (or a run of them) ends the sentence.

Differences from the official reader, which accepts anything and crashes later:
- every word line of a file must have the same number of fields (at least 2), and the label
  column must exist: an error names the file and line;
- each tag is checked by the task's `check_tag` (chunk: "O" or PREFIX-TYPE; ner: the scheme's
  tags); a bad one is an error naming the file and line;
- bytes that are not UTF-8 are an error naming the line.

QUIRK Q9 (mirrored): a last sentence with no blank line after it is dropped by the official
reader. electra-tf drops it too by default (so scores compare), logs a warning naming the file
and line, and keeps it with `flush_last_sentence: true`.
"""

from __future__ import annotations

import logging
from typing import Callable, List, NamedTuple, Optional, Tuple

from electra_tf.finetuning.tagging.spans import TagError, split_tag
from electra_tf.finetuning.task_files import DataFileError, decoded_lines

logger = logging.getLogger("electra_tf")

DOCSTART = "-DOCSTART-"
# Official `debug`: the reader returns once it holds more than 100 sentences.
DEBUG_MAX_SENTENCES = 101


class Sentence(NamedTuple):
    """One tagged sentence.

    Attributes:
        words: tuple of str.
        tags: tuple of str, the file's tags.
        source: str. "file:line" of its first word.
        lines: tuple of int, the line number of each word (for errors about one tag).
    """

    words: Tuple[str, ...]
    tags: Tuple[str, ...]
    source: str
    lines: Tuple[int, ...] = ()

    @property
    def path(self) -> str:
        return self.source.rsplit(":", 1)[0]


def check_chunk_tag(tag: str) -> None:
    """The chunk task's tags: "O" or PREFIX-TYPE with one "-" (official span rules)."""
    split_tag(tag)


def _line_layout(path: str, number: int, line: str, fields: List[str],
                 label_column: int) -> Tuple[int, int]:
    """Fixes the file's field count and tag column from its first word line.

    Args:
        path: str, for the error message.
        number: the 1-based line number, for the error message.
        line: the raw line, quoted in the error message.
        fields: the line's whitespace-separated fields.
        label_column: the configured tag field (negative counts from the end).

    Returns:
        (width, column): the field count every word line must have and the tag's 0-based field.

    Raises:
        DataFileError: fewer than 2 fields, or the label column is the word or out of range.
    """
    width = len(fields)
    if width < 2:
        raise DataFileError(f"{path}:{number}: a word line needs at least 2 fields "
                            f"(word ... tag), got 1: {line.strip()!r}")
    column = label_column + width if label_column < 0 else label_column
    if not 1 <= column < width:
        raise DataFileError(
            f"{path}:{number}: tagging_label_column {label_column} is "
            f"{'the word column' if column == 0 else 'not a column'} of this "
            f"{width}-field line (the tag is a field after the word; -1: the last)")
    return width, column


def _checked_tag(path: str, number: int, line: str, fields: List[str], width: int, column: int,
                 check_tag: Optional[Callable[[str], None]]) -> str:
    """Returns a word line's tag after checking its field count and the tag itself.

    Args:
        path: str, for the error message.
        number: the 1-based line number, for the error message.
        line: the raw line, quoted in the error message.
        fields: the line's whitespace-separated fields.
        width: the field count of the file's first word line.
        column: the tag's 0-based field.
        check_tag: raises TagError on a tag the task refuses (None: any tag).

    Returns:
        The tag field.

    Raises:
        DataFileError: a field count unlike the first word line's, or a refused tag.
    """
    if len(fields) != width:
        raise DataFileError(f"{path}:{number}: expected {width} fields like the file's first "
                            f"word line, got {len(fields)}: {line.strip()!r}")
    tag = fields[column]
    if check_tag is not None:
        try:
            check_tag(tag)
        except TagError as e:
            raise DataFileError(f"{path}:{number}: {e}") from None
    return tag


def read_conll(path: str, max_sentences: Optional[int] = None,
               flush_last_sentence: bool = False, label_column: int = -1,
               check_tag: Optional[Callable[[str], None]] = check_chunk_tag) -> List[Sentence]:
    """Reads a CoNLL-style file (see module docstring).

    Args:
        path: str.
        max_sentences: stop after this many sentences (official debug: 101).
        flush_last_sentence: keep a last sentence that has no blank line after it.
        label_column: int. The tag's field, 0-based; negative counts from the end (-1: last).
        check_tag: raises TagError on a tag the task refuses (None: any tag).

    Raises:
        DataFileError: unreadable file, inconsistent field counts, no such label column,
            malformed tag (naming file and line).
    """
    sentences: List[Sentence] = []
    words, tags, numbers = [], [], []
    first_line = None
    width = column = None
    lines = decoded_lines(path)
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        fields = line.strip().split()
        if not fields:
            if words:
                sentences.append(Sentence(tuple(words), tuple(tags), f"{path}:{first_line}",
                                          tuple(numbers)))
                words, tags, numbers = [], [], []
                if max_sentences is not None and len(sentences) >= max_sentences:
                    return sentences
            continue
        if fields[0] == DOCSTART:
            continue
        if width is None:
            width, column = _line_layout(path, number, line, fields, label_column)
        tag = _checked_tag(path, number, line, fields, width, column, check_tag)
        if not words:
            first_line = number
        words.append(fields[0])
        tags.append(tag)
        numbers.append(number)
    if words:
        if flush_last_sentence:
            sentences.append(Sentence(tuple(words), tuple(tags), f"{path}:{first_line}",
                                      tuple(numbers)))
        else:
            logger.warning("%s:%d: the last sentence (%d words) has no blank line after it and "
                           "is dropped, as the official reader does (set flush_last_sentence "
                           "to keep it)", path, first_line, len(words))
    if not sentences:
        raise DataFileError(f"{path}: no sentences (blank lines separate sentences)")
    return sentences
