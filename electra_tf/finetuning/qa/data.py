"""SQuAD JSON and MRQA JSON Lines readers (official `QATask._add_examples`, `get_examples`).

**SQuAD** (`squad` = 2.0, `squadv1` = 1.1): `raw_data_dir/<task>/<split>.json` (with `debug`:
`<split>-debug.json`), `data` -> articles -> `paragraphs` -> {`context`, `qas`}; each qa has
`id`, `question`, `answers` [{`text`, `answer_start`}] and, for 2.0 training, `is_impossible`.

**MRQA** (`newsqa`, `naturalqs`, `triviaqa`, `searchqa`): `raw_data_dir/<task>/<split>.jsonl`,
one paragraph per line, lines with a "header" key skipped; qas have `qid`, `question`,
`answers` (strings, used by the evaluation) and `detected_answers` [{`text`, `char_spans`
[[start, end]]}]; training uses the first detected answer, its first span's start and its text
(the inclusive end is ignored; official). With `debug` only the first 11 lines are read.

Words (Exact, official): the context is split into maximal runs of non-whitespace, where
whitespace is exactly space, \\t, \\r, \\n and U+202F (not U+00A0, which stays inside a word);
`char_to_word_offset[c]` is the word holding character c, and for a whitespace character the word
before it (-1 before the first word).

Answers are read for the training split only (official): an answerable training question's
answer must start inside the context, end inside it, and the words it covers (joined by spaces,
lower-cased) must contain the answer text (whitespace-normalised, lower-cased); "Milk" matches
"milk". The official code logs and skips a question that fails the last two checks (and crashes
on an offset outside the context). electra-tf stops with an error naming the file and question
(a data bug should not pass unnoticed) unless `skip_bad_answers: true`, which skips such
questions as the official code does, counting them in the results (`skipped_questions`).
Malformed files (invalid JSON, missing keys, duplicate question ids, no answers on an answerable
training question) are errors naming the file and record.

Example ids (`eid`) number the accepted questions of a split from 0 (official).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from electra_tf.finetuning.task_files import DataFileError, decoded_lines

logger = logging.getLogger("electra_tf")

# The official names of the tasks each reader reads: SQuAD's JSON files, MRQA's JSON Lines.
SQUAD_TASKS = ("squad", "squadv1")
MRQA_TASKS = ("newsqa", "naturalqs", "triviaqa", "searchqa")
QA_WHITESPACE = frozenset(" \t\r\n\u202f")
# Official `debug`: the MRQA reader stops at line index 10 (header + 10 paragraphs).
DEBUG_MRQA_LINES = 11


class Paragraph(NamedTuple):
    """A context split into whitespace words.

    Attributes:
        context: str.
        words: list of str (official `doc_tokens`).
        char_to_word: list of int, one per character of the context.
        word_starts: list of int, the character offset of each word's first character.
    """

    context: str
    words: List[str]
    char_to_word: List[int]
    word_starts: List[int]


class QAExample(NamedTuple):
    """One question about a paragraph.

    Attributes:
        eid: int. Index among the split's accepted questions.
        qid: str. `id` (SQuAD) or `qid` (MRQA): the key of the prediction files.
        question: str.
        paragraph: Paragraph.
        start_word, end_word: int or None. Answer words (training, answerable only).
        answer_text: str or None. Training only ("" when unanswerable).
        is_impossible: bool. SQuAD 2.0 training only (False elsewhere, official).
        source: str. File and record, for error messages.
    """

    eid: int
    qid: str
    question: str
    paragraph: Paragraph
    start_word: Optional[int]
    end_word: Optional[int]
    answer_text: Optional[str]
    is_impossible: bool
    source: str


class QASplit(NamedTuple):
    """The questions of one split and what the evaluation needs.

    Attributes:
        examples: list of QAExample.
        gold: SQuAD: the file's `data` list; MRQA: {qid: [answer strings]}.
        skipped: list of str. Questions skipped under `skip_bad_answers` (reasons).
        path: str.
    """

    examples: List[QAExample]
    gold: Any
    skipped: List[str]
    path: str


def split_words(context: str) -> Paragraph:
    """Whitespace words of a context (module docstring)."""
    words: List[str] = []
    char_to_word: List[int] = []
    starts: List[int] = []
    previous_is_whitespace = True
    for i, char in enumerate(context):
        if char in QA_WHITESPACE:
            previous_is_whitespace = True
        else:
            if previous_is_whitespace:
                words.append(char)
                starts.append(i)
            else:
                words[-1] += char
            previous_is_whitespace = False
        char_to_word.append(len(words) - 1)
    return Paragraph(context, words, char_to_word, starts)


class BadAnswer(ValueError):
    """A training answer that does not fit its context (skipped with skip_bad_answers)."""


def locate_answer(paragraph: Paragraph, answer_start: Any, text: str) -> Tuple[int, int]:
    """(start_word, end_word) of an answer, checked as the official code checks it.

    Raises:
        BadAnswer: the offset is not an int inside the context, the answer runs past the
            context's end, or the covered words do not contain the text.
    """
    context = paragraph.context
    if isinstance(answer_start, bool) or not isinstance(answer_start, int):
        raise BadAnswer(f"answer_start {answer_start!r} is not an integer")
    if not 0 <= answer_start < len(context):
        raise BadAnswer(f"answer_start {answer_start} is outside the context "
                        f"({len(context)} characters)")
    end_char = answer_start + len(text) - 1
    if end_char >= len(context):
        raise BadAnswer(f"the answer {text!r} at character {answer_start} runs past the end "
                        f"of the context ({len(context)} characters)")
    # An offset on leading whitespace maps to word -1: start at the first word instead.
    start_word = max(paragraph.char_to_word[answer_start], 0)
    end_word = paragraph.char_to_word[end_char]
    actual = " ".join(paragraph.words[start_word:end_word + 1]).lower()
    cleaned = " ".join(text.split()).lower()
    if actual.find(cleaned) == -1:
        raise BadAnswer(f"the answer text {text!r} is not at character {answer_start} (the "
                        f"context there reads {context[answer_start:answer_start + len(text)]!r})")
    return start_word, end_word


def _need(container: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(container, dict) or key not in container:
        raise DataFileError(f"{where}: missing key {key!r}")
    value = container[key]
    if not isinstance(value, kind):
        raise DataFileError(f"{where}: {key!r} must be a {kind.__name__}, "
                            f"got {type(value).__name__}")
    return value


class _Builder:
    """Accumulates a split's examples (official `_add_examples`)."""

    def __init__(self, path: str, split: str, v2: bool, skip_bad_answers: bool):
        self.path = path
        self.train = split == "train"
        self.scored = split == "dev"  # the evaluation reads its gold answers
        self.v2 = v2
        self.skip_bad_answers = skip_bad_answers
        self.examples: List[QAExample] = []
        self.skipped: List[str] = []
        self.seen: Dict[str, str] = {}

    def add(self, paragraph_json: dict, where: str, mrqa: bool) -> None:
        context = _need(paragraph_json, "context", str, where)
        qas = _need(paragraph_json, "qas", list, where)
        paragraph = split_words(context)
        id_key = "qid" if mrqa else "id"
        for n, qa in enumerate(qas):
            qa_where = f"{where}, question {n}"
            qid = _need(qa, id_key, str, qa_where)
            source = f"{where}, question {qid!r}"
            if qid in self.seen:
                raise DataFileError(f"{source}: duplicate question id (first at {self.seen[qid]})")
            self.seen[qid] = source
            question = _need(qa, "question", str, source)
            start_word = end_word = answer_text = None
            is_impossible = False
            if self.train:
                if self.v2:
                    is_impossible = _need(qa, "is_impossible", bool, source)
                if is_impossible:
                    start_word = end_word = -1
                    answer_text = ""
                else:
                    try:
                        start_word, end_word, answer_text = self._answer(qa, paragraph, source,
                                                                         mrqa)
                    except BadAnswer as e:
                        if not self.skip_bad_answers:
                            raise DataFileError(
                                f"{source}: {e} (set skip_bad_answers to skip such questions "
                                "as the official code does)") from None
                        logger.warning("%s: skipped: %s", source, e)
                        self.skipped.append(f"{source}: {e}")
                        continue
            elif self.scored:
                answers = _need(qa, "answers", list, source)  # the evaluation's gold answers
                for n_answer, answer in enumerate(answers):
                    if mrqa:
                        if not isinstance(answer, str):
                            raise DataFileError(f"{source}: answer {n_answer} must be a string")
                    else:
                        _need(answer, "text", str, f"{source}, answer {n_answer}")
            self.examples.append(QAExample(len(self.examples), qid, question, paragraph,
                                           start_word, end_word, answer_text, is_impossible,
                                           source))

    def _answer(self, qa: dict, paragraph: Paragraph, source: str, mrqa: bool):
        if mrqa:
            answers = _need(qa, "detected_answers", list, source)
            if not answers:
                raise DataFileError(f"{source}: 'detected_answers' is empty")
            answer = answers[0]
            spans = _need(answer, "char_spans", list, source + ", detected answer 0")
            if not spans or not isinstance(spans[0], list) or not spans[0]:
                raise DataFileError(f"{source}: detected answer 0 has no char_spans [[start, end]]")
            offset = spans[0][0]
        else:
            answers = _need(qa, "answers", list, source)
            if not answers:
                raise DataFileError(f"{source}: an answerable training question has no answers"
                                    + (" (set is_impossible: true if it has none)" if self.v2
                                       else ""))
            answer = answers[0]
            offset = _need(answer, "answer_start", object, source + ", answer 0")
        text = _need(answer, "text", str, source + ", answer 0")
        start_word, end_word = locate_answer(paragraph, offset, text)
        return start_word, end_word, text


def _load_json(path: str) -> Any:
    text = "\n".join(decoded_lines(path))
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFileError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise DataFileError(f"{path}: JSON nested too deeply to be a SQuAD file") from None


def read_squad(path: str, split: str, v2: bool, skip_bad_answers: bool = False) -> QASplit:
    """Reads a SQuAD 1.1 / 2.0 file (module docstring)."""
    dataset = _load_json(path)
    data = _need(dataset, "data", list, path)
    builder = _Builder(path, split, v2, skip_bad_answers)
    for a, article in enumerate(data):
        paragraphs = _need(article, "paragraphs", list, f"{path}: article {a}")
        for p, paragraph in enumerate(paragraphs):
            builder.add(paragraph, f"{path}: article {a}, paragraph {p}", mrqa=False)
    _log(path, builder)
    return QASplit(builder.examples, data, builder.skipped, path)


def read_mrqa(path: str, split: str, skip_bad_answers: bool = False,
              max_lines: Optional[int] = None) -> QASplit:
    """Reads an MRQA JSON Lines file (module docstring); gold = {qid: answers} of every line."""
    builder = _Builder(path, split, False, skip_bad_answers)
    gold: Dict[str, List[str]] = {}
    lines = decoded_lines(path)
    for index, line in enumerate(lines):
        if max_lines is not None and index >= max_lines:
            break
        if not line.strip():
            continue
        where = f"{path}:{index + 1}"
        try:
            paragraph = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFileError(f"{where}: not valid JSON ({e.msg}, column {e.colno})") from None
        except RecursionError:
            raise DataFileError(f"{where}: JSON nested too deeply to be an MRQA line") from None
        if isinstance(paragraph, dict) and "header" in paragraph:
            continue
        builder.add(paragraph, where, mrqa=True)
        for qa in paragraph["qas"]:
            gold[qa["qid"]] = qa.get("answers", [])
    _log(path, builder)
    return QASplit(builder.examples, gold, builder.skipped, path)


def _log(path: str, builder: _Builder) -> None:
    logger.info("%s: %d questions, %d skipped", path, len(builder.examples), len(builder.skipped))
    if not builder.examples:
        raise DataFileError(f"{path}: no questions")
