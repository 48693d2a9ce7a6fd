"""`tokenizer.json` for the Hugging Face export, written with the `tokenizers` library.

Fast tokenizers (`transformers`' `*TokenizerFast`, transformers.js, Text Embeddings Inference,
ONNX tooling) read this one file. It is BERT's tokenizer as electra-tf runs it
(`electra_tf.data.text.tokenization.Tokenizer`): BERT normalisation (control characters removed,
whitespace folded, CJK characters split, lowercasing and accent stripping as the training data
was built: accents are stripped only when lowercasing), BERT pre-tokenisation (whitespace and
punctuation), WordPiece with `##` continuations, `[UNK]` for a word longer than 200 characters (BERT's limit)
or without a piece, and `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` around the ids (segment ids
0, then 1). The ids equal the project's on the same text (tested on the default corpus).

One difference, the same as transformers' own BERT fast tokenizer: the special tokens are
"added tokens", so the literal text `[MASK]` becomes the [MASK] id, where BERT's (and
electra-tf's) tokenizer splits it into `[`, `mask`, `]`.
"""

from __future__ import annotations

from electra_tf import atomic
from electra_tf.convert.hf_spm_tokenizer import build_spm_tokenizer
from electra_tf.data.text.tokenization import MAX_INPUT_CHARS_PER_WORD, SUFFIX_INDICATOR
from electra_tf.vocab import WORDPIECE, Vocab

TOKENIZER_JSON_NAME = "tokenizer.json"


def build_tokenizer(vocab: Vocab, do_lower_case: bool, strip_accents: bool):
    """A `tokenizers.Tokenizer` equal in ids to electra-tf's tokenizer of `vocab` (a SentencePiece
    vocabulary's: `hf_spm_tokenizer`, which ignores `do_lower_case` / `strip_accents`)."""
    if vocab.kind != WORDPIECE:
        return build_spm_tokenizer(vocab)
    from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors)

    special = vocab.special
    tokens = vocab.tokens
    unk = tokens[special.unk_id]
    tokenizer = Tokenizer(models.WordPiece(
        vocab={token: index for index, token in enumerate(tokens)}, unk_token=unk,
        continuing_subword_prefix=SUFFIX_INDICATOR,
        max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True,
        strip_accents=bool(do_lower_case and strip_accents), lowercase=do_lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = tokens[special.cls_id], tokens[special.sep_id]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, special.cls_id), (sep, special.sep_id)])
    tokenizer.decoder = decoders.WordPiece(prefix=SUFFIX_INDICATOR)
    tokenizer.add_special_tokens([
        AddedToken(tokens[i], special=True, normalized=False)
        for i in (special.pad_id, special.unk_id, special.cls_id, special.sep_id, special.mask_id)])
    return tokenizer


def write_tokenizer_json(path: str, vocab: Vocab, do_lower_case: bool, strip_accents: bool) -> None:
    """Writes `tokenizer.json` (see the module docstring)."""
    tokenizer = build_tokenizer(vocab, do_lower_case, strip_accents)
    atomic.write_text(path, tokenizer.to_str(pretty=True))
