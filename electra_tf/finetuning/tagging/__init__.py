"""Sequence tagging fine-tuning (official `finetune/tagging/`): chunking (`chunk`, CoNLL-2000).

Modules: `conll` (the reader), `spans` (official span extraction and BIOES encoding),
`features` (first-WordPiece alignment, the official truncation), `head` (dense over the
gathered first sub-tokens, summed cross-entropy), `metrics` (span F1), `chunk` (the task),
`serving` (the exported raw-text signature).
"""
