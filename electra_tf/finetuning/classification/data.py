"""Classification tasks: GLUE by name (official file layouts) and generic TSV/CSV files.

A task's files live in `raw_data_dir/<task>/` (official layout `DATA_DIR/finetuning_data/<task>`;
GLUE's own directory spellings such as `SST-2` and `CoLA` are found too).

**GLUE** (official `finetune/classification/classification_tasks.py`): columns are read by
position, as the official `_load_glue`, from the GLUE distribution's TSVs (tab-separated, no
quoting). Test files have no labels (predictions only). The official names are used: `cola`,
`sst` (SST-2; `sst2`/`sst-2` are accepted), `mrpc`, `qqp`, `mnli`, `qnli`, `rte`, plus `wnli`.

| task | files (dev / test) | text_a, text_b, label columns (test) | labels |
|---|---|---|---|
| cola | dev.tsv / test.tsv | 3, -, 1 (1, -) ; train/dev have no header | 0 1 |
| sst | dev.tsv / test.tsv | 0, -, 1 (1, -) | 0 1 |
| mrpc | dev.tsv / test.tsv | 3, 4, 0 (3, 4) ; unordered | 0 1 |
| qqp | dev.tsv / test.tsv | 3, 4, 5 (1, 2) ; unordered | 0 1 |
| mnli | dev_matched.tsv / test_matched.tsv | 8, 9, last (8, 9) | contradiction entailment neutral |
| qnli, rte | dev.tsv / test.tsv | 1, 2, last (1, 2) | entailment not_entailment |
| wnli | dev.tsv / test.tsv | 1, 2, last (1, 2) | 0 1 |

"Unordered" pair tasks are also trained on the swapped pair when `double_unordered` (official).
Unlike the official reader, which logs and skips a line it cannot parse, a malformed line is an
error naming the file and line.

**Generic tasks** (any other name): `train`, `dev` and `test` files, each `.tsv` (tab-separated,
no quoting, GLUE style) or `.csv` (comma-separated, RFC 4180 quoting), with a header naming the
columns `text`, optional `text_b` (sentence pairs) and `label`; other columns are ignored. The
test file may lack `label` (predictions only). The labels are the sorted distinct labels of the
training file; a dev/test label outside them is an error.

Every error names the file and line: a missing column, a wrong field count, an empty line, an
empty text, a label unknown at dev/test time, undecodable UTF-8.
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from electra_tf.finetuning.task_files import DataFileError, read_rows, split_files, task_directory

TEXT_COLUMN = "text"
TEXT_B_COLUMN = "text_b"
LABEL_COLUMN = "label"
SPLIT_NAMES = ("train", "dev", "test")
GENERIC_EXTENSIONS = (".tsv", ".csv")


class Example(NamedTuple):
    """One classification example.

    Attributes:
        guid: str. "<task>-<split>-<n>".
        text_a: str.
        text_b: str or None (single-sentence task).
        label: str or None (unlabelled test data).
        source: str. "file:line", for error messages.
    """

    guid: str
    text_a: str
    text_b: Optional[str]
    label: Optional[str]
    source: str


class GlueLayout(NamedTuple):
    """Column positions of one GLUE task (official `_load_glue` arguments)."""

    text_a: int
    text_b: Optional[int]
    label: int
    skip_header: bool
    test_text_a: int
    test_text_b: Optional[int]
    labels: Tuple[str, ...]
    dev_file: str = "dev.tsv"
    test_file: str = "test.tsv"
    unordered: bool = False
    dir_names: Tuple[str, ...] = ()


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
GLUE_TASKS: Dict[str, GlueLayout] = {
    # CoLA train/dev: source, label, original label, sentence; no header. Test: index, sentence.
    "cola": GlueLayout(3, None, 1, False, 1, None, _BINARY, dir_names=("CoLA",)),
    "sst": GlueLayout(0, None, 1, True, 1, None, _BINARY, dir_names=("SST-2", "sst-2", "sst2")),
    "mrpc": GlueLayout(3, 4, 0, True, 3, 4, _BINARY, unordered=True, dir_names=("MRPC",)),
    "qqp": GlueLayout(3, 4, 5, True, 1, 2, _BINARY, unordered=True, dir_names=("QQP",)),
    "mnli": GlueLayout(8, 9, -1, True, 8, 9, ("contradiction", "entailment", "neutral"),
                       dev_file="dev_matched.tsv", test_file="test_matched.tsv", dir_names=("MNLI",)),
    "qnli": GlueLayout(1, 2, -1, True, 1, 2, _NLI2, dir_names=("QNLI",)),
    "rte": GlueLayout(1, 2, -1, True, 1, 2, _NLI2, dir_names=("RTE",)),
    "wnli": GlueLayout(1, 2, -1, True, 1, 2, _BINARY, dir_names=("WNLI",)),
}
TASK_ALIASES = {"sst2": "sst", "sst-2": "sst", "mnli-m": "mnli"}
# Named tasks of the other families (registry.py routes them to their own readers).
NOT_CLASSIFICATION_TASKS = ("sts", "chunk", "ner", "pos", "squad", "squadv1", "newsqa", "naturalqs",
                            "triviaqa", "searchqa")


class Task(NamedTuple):
    """A classification task bound to its data directory.

    Attributes:
        name: str. As given in task_names (lowercase for GLUE).
        directory: str. Where its files are.
        glue: GlueLayout or None (generic TSV/CSV task).
        labels: tuple[str, ...]. Label names in id order.
        is_pair: bool. Sentence-pair task.
    """

    name: str
    directory: str
    glue: Optional[GlueLayout]
    labels: Tuple[str, ...]
    is_pair: bool

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def label_id(self, example: Example) -> int:
        try:
            return self.labels.index(example.label)
        except ValueError:
            raise DataFileError(f"{example.source}: label {example.label!r} is not one of the "
                                f"training labels {list(self.labels)} of task {self.name!r}") from None


def canonical_task_name(name: str) -> str:
    lower = name.lower()
    return TASK_ALIASES.get(lower, lower)


def split_file(task_dir: str, split: str, glue: Optional[GlueLayout]) -> Optional[str]:
    """The file of `split` in a task directory, or None if there is none."""
    if glue is not None:
        name = {"train": "train.tsv", "dev": glue.dev_file, "test": glue.test_file}[split]
        path = os.path.join(task_dir, name)
        return path if os.path.isfile(path) else None
    found = split_files(task_dir, split, GENERIC_EXTENSIONS)
    if len(found) > 1:
        raise DataFileError(f"{task_dir}: both {split}.tsv and {split}.csv exist; keep one")
    return found[0] if found else None


# ------------------------------------------------------------------------------------------------
# Generic files: header text, [text_b], label
# ------------------------------------------------------------------------------------------------
class GenericColumns(NamedTuple):
    text: int
    text_b: Optional[int]
    label: Optional[int]
    width: int


def _generic_columns(path: str, header: List[str], need_label: bool) -> GenericColumns:
    names = [h.strip() for h in header]
    index = {}
    for i, name in enumerate(names):
        if name in index:
            raise DataFileError(f"{path}:1: column {name!r} appears twice in the header")
        index[name] = i
    required = [TEXT_COLUMN] + ([LABEL_COLUMN] if need_label else [])
    for name in required:
        if name not in index:
            raise DataFileError(f"{path}:1: missing column {name!r} (the header has "
                                f"{', '.join(repr(n) for n in names)}; expected {TEXT_COLUMN!r}, "
                                f"optional {TEXT_B_COLUMN!r}, {LABEL_COLUMN!r})")
    return GenericColumns(index[TEXT_COLUMN], index.get(TEXT_B_COLUMN), index.get(LABEL_COLUMN),
                          len(names))


def read_generic(path: str, task_name: str, split: str,
                 max_lines: Optional[int] = None) -> Tuple[List[Example], bool, bool]:
    """Reads a generic task file.

    Returns:
        (examples, has_text_b, has_label).
    """
    rows = read_rows(path, max_lines)
    columns = _generic_columns(path, rows[0][1], need_label=(split != "test"))
    examples = []
    for n, (line, fields) in enumerate(rows[1:]):
        source = f"{path}:{line}"
        if len(fields) != columns.width:
            raise DataFileError(f"{source}: expected {columns.width} fields (as the header), got "
                                f"{len(fields)}")
        text = fields[columns.text].strip()
        if not text:
            raise DataFileError(f"{source}: empty {TEXT_COLUMN!r}")
        text_b = None
        if columns.text_b is not None:
            text_b = fields[columns.text_b].strip()
            if not text_b:
                raise DataFileError(f"{source}: empty {TEXT_B_COLUMN!r}")
        label = None
        if columns.label is not None:
            label = fields[columns.label].strip()
            if not label:
                raise DataFileError(f"{source}: empty {LABEL_COLUMN!r}")
        examples.append(Example(f"{task_name}-{split}-{n}", text, text_b, label, source))
    if not examples:
        raise DataFileError(f"{path}: has a header but no examples")
    return examples, columns.text_b is not None, columns.label is not None


# ------------------------------------------------------------------------------------------------
# GLUE files: columns by position
# ------------------------------------------------------------------------------------------------
def read_glue(path: str, task_name: str, layout: GlueLayout, split: str,
              max_lines: Optional[int] = None) -> List[Example]:
    """Reads a GLUE TSV as the official `_load_glue` (columns by position)."""
    rows = read_rows(path, max_lines)
    test = split == "test"
    skip = layout.skip_header or test  # official: CoLA's test file has a header, train/dev none
    a_col = layout.test_text_a if test else layout.text_a
    b_col = layout.test_text_b if test else layout.text_b
    needed = max(c for c in (a_col, b_col, None if test else layout.label)
                 if c is not None and c >= 0) + 1
    examples = []
    for n, (line, fields) in enumerate(rows[1:] if skip else rows):
        source = f"{path}:{line}"
        if len(fields) < needed:
            raise DataFileError(f"{source}: expected at least {needed} tab-separated fields for "
                                f"GLUE task {task_name!r} ({split}), got {len(fields)}")
        label = None if test else fields[layout.label].strip()
        examples.append(Example(f"{task_name}-{split}-{n}", fields[a_col].strip(),
                                None if b_col is None else fields[b_col].strip(), label, source))
    if not examples:
        raise DataFileError(f"{path}: no examples")
    return examples


# ------------------------------------------------------------------------------------------------
# Tasks
# ------------------------------------------------------------------------------------------------
class TaskData(NamedTuple):
    """A task and its examples per split (None when the split's file is absent).

    Attributes:
        task: Task.
        train, dev, test: list[Example] or None.
        labelled: {split: bool}, whether the split carries labels.
    """

    task: Task
    train: Optional[List[Example]]
    dev: Optional[List[Example]]
    test: Optional[List[Example]]
    labelled: Dict[str, bool]


def load_task(name: str, raw_data_dir: str, splits: Sequence[str] = SPLIT_NAMES,
              double_unordered: bool = True, max_lines: Optional[int] = None) -> TaskData:
    """Finds and reads a task's files.

    Args:
        name: task name (GLUE name or a generic task's directory name).
        raw_data_dir: the directory holding one sub-directory per task.
        splits: the splits to read; "train" is always read (it defines the labels).
        double_unordered: add swapped pairs to the training set of unordered GLUE tasks.
        max_lines: read only the first this many lines of each file (official `debug`: 100).

    Raises:
        DataFileError: not a classification task, missing train file, malformed data, labels.
    """
    canonical = canonical_task_name(name)
    if canonical in NOT_CLASSIFICATION_TASKS:
        raise DataFileError(f"task {name!r} is not a classification task (see "
                            "electra_tf/finetuning/registry.py)")
    glue = GLUE_TASKS.get(canonical)
    task_name = canonical if glue else name
    directory = task_directory(raw_data_dir, task_name, glue.dir_names if glue else ())
    train_path = split_file(directory, "train", glue)
    if train_path is None:
        expected = "train.tsv" if glue else "train.tsv or train.csv"
        raise DataFileError(f"task {name!r}: no {expected} in {directory}")
    if glue is not None:
        task, data, labelled = _read_glue_splits(task_name, directory, glue, train_path, splits,
                                                 max_lines)
    else:
        task, data, labelled = _read_generic_splits(task_name, directory, train_path, splits,
                                                    max_lines)
    for split, examples in data.items():
        if examples and labelled.get(split):
            for example in examples:
                task.label_id(example)  # raises on an unknown label, naming file:line
    if glue is not None and glue.unordered and double_unordered and data["train"]:
        data["train"] = data["train"] + [
            e._replace(guid=e.guid + "-swapped", text_a=e.text_b, text_b=e.text_a)
            for e in data["train"]]
    return TaskData(task, data["train"], data["dev"], data["test"], labelled)


def _read_glue_splits(task_name: str, directory: str, glue: GlueLayout, train_path: str,
                      splits: Sequence[str], max_lines: Optional[int]):
    """`load_task` for a GLUE task: (Task, {split: examples or None}, {split: labelled})."""
    data = {"train": None, "dev": None, "test": None}
    labelled = {}
    for split in SPLIT_NAMES:
        path = train_path if split == "train" else split_file(directory, split, glue)
        if path is None or (split != "train" and split not in splits):
            continue
        data[split] = read_glue(path, task_name, glue, split, max_lines)
        labelled[split] = split != "test"
    return Task(task_name, directory, glue, glue.labels, glue.text_b is not None), data, labelled


def _read_generic_splits(task_name: str, directory: str, train_path: str,
                         splits: Sequence[str], max_lines: Optional[int]):
    """`load_task` for a generic TSV/CSV task: the labels are train's sorted distinct labels;
    dev and test must have train's columns. Returns as `_read_glue_splits`."""
    data = {"train": None, "dev": None, "test": None}
    train, is_pair, _ = read_generic(train_path, task_name, "train", max_lines)
    data["train"] = train
    labelled = {"train": True}
    labels = tuple(sorted({e.label for e in train}))
    if len(labels) < 2:
        raise DataFileError(f"{train_path}: needs at least 2 distinct labels, found {list(labels)}")
    for split in ("dev", "test"):
        path = split_file(directory, split, None)
        if path is None or split not in splits:
            continue
        examples, has_b, has_label = read_generic(path, task_name, split, max_lines)
        if has_b != is_pair:
            raise DataFileError(f"{path}:1: {'has' if has_b else 'lacks'} column "
                                f"{TEXT_B_COLUMN!r} but {train_path} "
                                f"{'does not' if has_b else 'does'}")
        data[split] = examples
        labelled[split] = has_label
    return Task(task_name, directory, None, labels, is_pair), data, labelled
