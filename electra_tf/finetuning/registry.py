"""Task names -> task families (official `finetune/task_builder.get_task`).

| name | family | files in `raw_data_dir/<name>/` | official metrics |
|---|---|---|---|
| cola, sst, mrpc, qqp, mnli, qnli, rte (+ wnli) | classification | GLUE TSVs | mcc / accuracy, loss |
| sts | regression | train/dev/test.tsv (STS-B) | pearson, spearman, mse, loss |
| squad | QA, SQuAD 2.0 | train/dev(/test).json | the 13 SQuAD 2.0 keys |
| squadv1 | QA, SQuAD 1.1 | train/dev.json | exact_match, f1 |
| newsqa, naturalqs, triviaqa, searchqa | QA, MRQA 2019 | train/dev.jsonl | exact_match, f1 |
| chunk | tagging | train/dev(/test).txt (CoNLL-2000) | precision, recall, f1, loss |

The official registry refuses any other name; electra-tf also accepts any other name as a
generic classification task whose files are `train`/`dev`/`test` `.tsv`/`.csv` with a header
(`tasks.py`), and refuses it if that directory does not exist.
"""

from __future__ import annotations

import os
from typing import List

from electra_tf.finetuning.task import (CLASSIFICATION, QUESTION_ANSWERING, REGRESSION, TAGGING,
                                        FinetuningTask)
from electra_tf.finetuning.tasks import GLUE_TASKS, DataFileError, canonical_task_name

SQUAD_TASKS = ("squad", "squadv1")
MRQA_TASKS = ("newsqa", "naturalqs", "triviaqa", "searchqa")
OFFICIAL_TASKS = {
    **{name: CLASSIFICATION for name in ("cola", "mrpc", "mnli", "sst", "rte", "qnli", "qqp")},
    "sts": REGRESSION,
    **{name: QUESTION_ANSWERING for name in SQUAD_TASKS + MRQA_TASKS},
    "chunk": TAGGING,
}


def task_family(name: str) -> str:
    """The family of a task name (any name that is not official is a classification task)."""
    return OFFICIAL_TASKS.get(canonical_task_name(name), CLASSIFICATION)


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
    canonical = canonical_task_name(name)
    if family == REGRESSION:
        from electra_tf.finetuning.regression.sts import STSTask
        return STSTask(canonical, config, text_encoder)
    if family == QUESTION_ANSWERING:
        from electra_tf.finetuning.qa.task import QATask
        return QATask(canonical, config, tokenizer)
    if family == TAGGING:
        from electra_tf.finetuning.tagging.chunk import ChunkingTask
        return ChunkingTask(canonical, config, pretrained)
    _check_generic(name, config.raw_data_dir)
    from electra_tf.finetuning.classification import ClassificationTask
    return ClassificationTask(name, config, text_encoder)


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
        f"Unknown task {name!r}: not an official task ({', '.join(sorted(OFFICIAL_TASKS))}) "
        f"and no directory {directory} with a generic classification task's train/dev/test "
        ".tsv or .csv files")


def official_task_names() -> List[str]:
    return sorted(OFFICIAL_TASKS)
