"""Sequence tagging fine-tuning (official `finetune/tagging/`): chunking (`chunk`, CoNLL-2000),
and electra-tf's `ner` (BIO / BIOES entities, seqeval's F1) and `pos` (token accuracy) on any
CoNLL-style files.

Modules: `conll` (the reader), `conll_task` (what the three tasks share: files, features),
`spans` (official span extraction and BIOES encoding), `entities` (seqeval's entity rules),
`features` (first-WordPiece alignment, the official truncation), `head` (dense over the gathered
first sub-tokens, summed cross-entropy), `metrics` (span F1, entity F1, accuracy), `chunk`,
`ner`, `pos` (the tasks), `serving` (the exported raw-text signature).
"""

from electra_tf.finetuning.tagging.chunk import ChunkingTask
from electra_tf.finetuning.tagging.ner import NerTask
from electra_tf.finetuning.tagging.pos import PosTask

TASK_NAMES = ("chunk",)
# electra-tf's tasks of this family (not in the official registry).
ADDED_TASK_NAMES = ("ner", "pos")


def build_task(name: str, config, pretrained, tokenizer, text_encoder):
    """The tagging task of name `name` (chunk, ner or pos)."""
    del tokenizer, text_encoder  # tagging builds its own Tokenizer (casing: `tagging_cased`)
    if name == "ner":
        return NerTask(name, config, pretrained)
    if name == "pos":
        return PosTask(name, config, pretrained)
    return ChunkingTask(name, config, pretrained)
