"""The CoNLL-2000-style reader (official `TaggingTask._get_labeled_sentences`).

One word per line, fields separated by whitespace; the word is the first field and the tag the
last (so in CoNLL-2000's "word POS chunk" the POS column is ignored); a line whose first field
is "-DOCSTART-" is skipped; a blank line ends the sentence.

Differences from the official reader, which accepts anything and crashes later:
- every word line of a file must have the same number of fields (at least 2), and every tag must
  be "O" or PREFIX-TYPE: an error names the file and line;
- bytes that are not UTF-8 are an error naming the line.

QUIRK Q9 (mirrored): a last sentence with no blank line after it is dropped by the official
reader. electra-tf drops it too by default (so scores compare), logs a warning naming the file
and line, and keeps it with `flush_last_sentence: true`.
"""

from __future__ import annotations

import logging
from typing import List, NamedTuple, Optional, Tuple

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
    """

    words: Tuple[str, ...]
    tags: Tuple[str, ...]
    source: str


def read_conll(path: str, max_sentences: Optional[int] = None,
               flush_last_sentence: bool = False) -> List[Sentence]:
    """Reads a CoNLL-style file (see module docstring).

    Args:
        path: str.
        max_sentences: stop after this many sentences (official debug: 101).
        flush_last_sentence: keep a last sentence that has no blank line after it.

    Raises:
        DataFileError: unreadable file, inconsistent field counts, malformed tag.
    """
    sentences: List[Sentence] = []
    words, tags = [], []
    first_line = None
    width = None
    lines = decoded_lines(path)
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        fields = line.strip().split()
        if not fields:
            if words:
                sentences.append(Sentence(tuple(words), tuple(tags), f"{path}:{first_line}"))
                words, tags = [], []
                if max_sentences is not None and len(sentences) >= max_sentences:
                    return sentences
            continue
        if fields[0] == DOCSTART:
            continue
        if width is None:
            width = len(fields)
            if width < 2:
                raise DataFileError(f"{path}:{number}: a word line needs at least 2 fields "
                                    f"(word ... tag), got 1: {line.strip()!r}")
        elif len(fields) != width:
            raise DataFileError(f"{path}:{number}: expected {width} fields like the file's first "
                                f"word line, got {len(fields)}: {line.strip()!r}")
        try:
            split_tag(fields[-1])
        except TagError as e:
            raise DataFileError(f"{path}:{number}: {e}") from None
        if not words:
            first_line = number
        words.append(fields[0])
        tags.append(fields[-1])
    if words:
        if flush_last_sentence:
            sentences.append(Sentence(tuple(words), tuple(tags), f"{path}:{first_line}"))
        else:
            logger.warning("%s:%d: the last sentence (%d words) has no blank line after it and "
                           "is dropped, as the official reader does (set flush_last_sentence "
                           "to keep it)", path, first_line, len(words))
    if not sentences:
        raise DataFileError(f"{path}: no sentences (blank lines separate sentences)")
    return sentences
