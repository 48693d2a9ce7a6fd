"""Task names -> task families (official `finetune/task_builder.get_task`).

| name | family | files in `raw_data_dir/<name>/` | official metrics |
|---|---|---|---|
| cola, sst, mrpc, qqp, mnli, qnli, rte (+ wnli) | classification | GLUE TSVs | mcc / accuracy, loss |
| sts | regression | train/dev/test.tsv (STS-B) | pearson, spearman, mse, loss |
| squad | QA, SQuAD 2.0 | train/dev(/test).json | the 13 SQuAD 2.0 keys |
| squadv1 | QA, SQuAD 1.1 | train/dev.json | exact_match, f1 |
| newsqa, naturalqs, triviaqa, searchqa | QA, MRQA 2019 | train/dev.jsonl | exact_match, f1 |
| chunk | tagging | train/dev(/test).txt (CoNLL-2000) | precision, recall, f1, loss |
| ner, pos (electra-tf) | tagging | train/dev(/test).txt or .conll (any CoNLL-style) | ner: precision, recall, f1 (seqeval's), loss; pos: accuracy, loss |

The official registry refuses any other name; electra-tf also accepts any other name as a
generic classification task whose files are `train`/`dev`/`test` `.tsv`/`.csv` with a header
(`classification/data.py`), and refuses it if that directory does not exist.

A family is one folder whose package names its official tasks (`TASK_NAMES`), any electra-tf
tasks of its own (`ADDED_TASK_NAMES`, optional) and builds one (`build_task(name, config,
pretrained, tokenizer, text_encoder)`), plus its line in `FAMILIES`.
"""

from __future__ import annotations

import os
from typing import List

from electra_tf.finetuning import classification, qa, regression, tagging
from electra_tf.finetuning.classification.data import GLUE_TASKS, canonical_task_name
from electra_tf.finetuning.qa.data import MRQA_TASKS
from electra_tf.finetuning.task import (CLASSIFICATION, QUESTION_ANSWERING, REGRESSION, TAGGING,
                                        FinetuningTask)
from electra_tf.finetuning.task_files import DataFileError

FAMILIES = {
    CLASSIFICATION: classification,
    REGRESSION: regression,
    QUESTION_ANSWERING: qa,
    TAGGING: tagging,
}
OFFICIAL_TASKS = {name: family for family, package in FAMILIES.items()
                  for name in package.TASK_NAMES}
# Official tasks plus electra-tf's own named tasks (ner, pos).
NAMED_TASKS = {**OFFICIAL_TASKS, **{name: family for family, package in FAMILIES.items()
                                    for name in getattr(package, "ADDED_TASK_NAMES", ())}}


def task_family(name: str) -> str:
    """The family of a task name (any name that is not a named task is a classification task)."""
    return NAMED_TASKS.get(canonical_task_name(name), CLASSIFICATION)


def build_task(name: str, config, pretrained, tokenizer, text_encoder) -> FinetuningTask:
    """Reads and featurises one task of the run.

    Args:
        name: str. As given in `task_names`.
        config: FinetuningConfig.
        pretrained: finetuning.pretrained.Pretrained (vocab and tokenization settings).
        tokenizer: data.tokenization.Tokenizer of the run.
        text_encoder: encoding.TextEncoder of the run.

    Raises:
        DataFileError: missing or malformed files (naming the file and record).
    """
    family = task_family(name)
    if family == CLASSIFICATION:  # the generic family: the name as given is its directory's
        _check_generic(name, config.raw_data_dir)
    else:
        name = canonical_task_name(name)
    return FAMILIES[family].build_task(name, config, pretrained, tokenizer, text_encoder)


def _check_generic(name: str, raw_data_dir: str) -> None:
    """A clearer error for a name that is neither official nor a directory of task files."""
    if canonical_task_name(name) in GLUE_TASKS:
        return
    directory = os.path.join(raw_data_dir, name)
    if os.path.isdir(directory):
        if any(f.endswith(".jsonl") for f in os.listdir(directory)):
            raise DataFileError(f"task {name!r}: {directory} holds MRQA-style .jsonl files; the "
                                f"MRQA tasks are {', '.join(MRQA_TASKS)} (rename the directory)")
        return
    raise DataFileError(
        f"Unknown task {name!r}: not a named task ({', '.join(sorted(NAMED_TASKS))}) "
        f"and no directory {directory} with a generic classification task's train/dev/test "
        ".tsv or .csv files")


def official_task_names() -> List[str]:
    return sorted(OFFICIAL_TASKS)
