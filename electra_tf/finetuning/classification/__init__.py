"""Classification fine-tuning (official `finetune/classification/`): the GLUE tasks by name and
generic TSV/CSV tasks (any name that is no other family's).

Modules: `data` (GLUE layouts and the generic reader, examples and labels), `task` (the
`FinetuningTask`: pair features, accuracy / F1 / MCC, serving).
"""

from electra_tf.finetuning.classification.task import ClassificationTask

# Official GLUE names (wnli, and any generic task, are classification too: `registry`).
TASK_NAMES = ("cola", "mrpc", "mnli", "sst", "rte", "qnli", "qqp")


def build_task(name: str, config, pretrained, tokenizer, text_encoder):
    """The `ClassificationTask` of `name` (as given: a generic task's name is its directory's)."""
    del pretrained, tokenizer  # classification encodes with the run's TextEncoder
    return ClassificationTask(name, config, text_encoder)
