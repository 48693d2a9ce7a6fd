"""Sequence tagging fine-tuning (official `finetune/tagging/`): chunking (`chunk`, CoNLL-2000).

Modules: `conll` (the reader), `spans` (official span extraction and BIOES encoding),
`features` (first-WordPiece alignment, the official truncation), `head` (dense over the
gathered first sub-tokens, summed cross-entropy), `metrics` (span F1), `chunk` (the task),
`serving` (the exported raw-text signature).
"""

TASK_NAMES = ("chunk",)


def build_task(name: str, config, pretrained, tokenizer, text_encoder):
    """The `ChunkingTask` of the official name `name`."""
    del tokenizer, text_encoder  # tagging builds its own Tokenizer (casing: `tagging_cased`)
    from electra_tf.finetuning.tagging.chunk import ChunkingTask
    return ChunkingTask(name, config, pretrained)
