"""Extractive question answering (official `finetune/qa/`): SQuAD 1.1 (`squadv1`), SQuAD 2.0
(`squad`) and the MRQA 2019 tasks (`newsqa`, `naturalqs`, `triviaqa`, `searchqa`).

Modules: `data` (the SQuAD JSON and MRQA JSON Lines readers, whitespace words and character
offsets), `features` (WordPiece alignment, answer refinement, `doc_stride` windows, max-context),
`head` (start/end logits, joint beam prediction, the answerable classifier, the loss),
`decoding` (n-best decoding, `get_final_text`), `evaluation` (the official SQuAD 1.1 / 2.0 and
MRQA evaluation), `task` (the `FinetuningTask`), `serving` (the exported question + context
signature, decoding in-graph).
"""

from electra_tf.finetuning.qa.data import MRQA_TASKS, SQUAD_TASKS

TASK_NAMES = SQUAD_TASKS + MRQA_TASKS


def build_task(name: str, config, pretrained, tokenizer, text_encoder):
    """The `QATask` of the official name `name`."""
    del pretrained, text_encoder  # QA windows its contexts with the run's Tokenizer
    # lazy: the registry only names the tasks; the QA modules load when a QA task runs
    from electra_tf.finetuning.qa.task import QATask
    return QATask(name, config, tokenizer)
