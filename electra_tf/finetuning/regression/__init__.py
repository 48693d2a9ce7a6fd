"""Regression fine-tuning (official `RegressionTask`; the GLUE task `sts`, STS-B).

Modules: `sts` (the reader and the task), `head` (dropout -> dense(1), squared error),
`metrics` (Pearson, Spearman, MSE as the official `RegressionScorer`).
"""

from electra_tf.finetuning.regression.sts import STSTask

TASK_NAMES = ("sts",)


def build_task(name: str, config, pretrained, tokenizer, text_encoder):
    """The `STSTask` of the official name `name`."""
    del pretrained, tokenizer  # STS encodes with the run's TextEncoder
    return STSTask(name, config, text_encoder)
