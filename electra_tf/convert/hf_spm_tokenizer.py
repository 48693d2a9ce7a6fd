"""`tokenizer.json` of a SentencePiece vocabulary for the Hugging Face export.

The same ids as electra-tf's in-graph SentencePiece tokenizer (`data.spm_tokenization`, the
`sentencepiece` library's encoder) on the same text, tested against transformers'
`PreTrainedTokenizerFast` on multilingual text. The model file is read directly (a small
protobuf wire-format reader, so no generated protobuf code whose version must match the
runtime's), and rebuilt with the `tokenizers` library the way SentencePiece encodes:

- normaliser: the model's own precompiled character map (NFKC, case folding if trained so), then
  SentencePiece's whitespace handling (`remove_extra_whitespaces`: leading and trailing spaces
  dropped, runs of spaces collapsed to one);
- pre-tokeniser: `Metaspace` (spaces become "\u2581", one is prepended when the model has
  `add_dummy_prefix`), splitting before each "\u2581" (SentencePiece's pieces never hold one
  inside, with the default `split_by_whitespace`);
- model: Unigram with the model's scores, its unknown id and byte fallback; for a BPE model
  (`spm_train --model_type bpe`), BPE whose merges are every split of each normal piece into two
  pieces, ranked by the merged piece's score (SentencePiece merges the adjacent pair whose
  concatenation scores highest), runs of unknown
  characters fused into one unknown piece as SentencePiece does, and its byte fallback;
- `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` around the ids, as for WordPiece.

Control pieces ([CLS], [SEP], [MASK], and [PAD]) are special "added tokens", as transformers'
own SentencePiece conversions make them: the literal text "[MASK]" becomes the [MASK] id there,
where the in-graph tokenizer never produces a control piece from text (the same documented
difference as the WordPiece export's). Word and char models are not supported (one-line
error).
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple

from electra_tf.sentencepiece_vocab import WORD_START_MARKER, piece_kinds
from electra_tf.vocab import Vocab

UNIGRAM, BPE = 1, 2  # TrainerSpec.ModelType
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
NORMAL = 1  # SentencePiece.Type: the pieces a model segments text into (not control, unknown,
            # user-defined, unused or byte)


class SpmSettings(NamedTuple):
    """The parts of a SentencePiece ModelProto the tokenizer.json needs."""

    model_type: int
    byte_fallback: bool
    charsmap: bytes
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool
    escape_whitespaces: bool
    scores: List[float]
    types: List[int]  # SentencePiece.Type of each piece (NORMAL...)


def _fields(data: bytes) -> List[Tuple[int, int, object]]:
    """(field number, wire type, value) of a protobuf message, in order."""
    out, pos = [], 0

    def varint():
        nonlocal pos
        shift = value = 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    while pos < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length = varint()
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, wire, value))
    return out


def spm_settings(model: bytes) -> SpmSettings:
    """Reads the settings of a serialized SentencePiece model (see `SpmSettings`)."""
    import struct

    # ModelProto: 1 pieces, 2 trainer_spec, 3 normalizer_spec. Defaults as in the .proto.
    model_type, byte_fallback = UNIGRAM, False
    charsmap, dummy, extra, escape = b"", True, True, True
    scores, types = [], []
    for number, _, value in _fields(model):
        if number == 1:  # SentencePiece: 1 piece, 2 score (float), 3 type
            score, kind = 0.0, NORMAL
            for n, wire, v in _fields(value):
                if n == 2 and wire == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and wire == 0:
                    kind = v
            scores.append(score)
            types.append(kind)
        elif number == 2:  # TrainerSpec: 3 model_type, 35 byte_fallback
            for n, _, v in _fields(value):
                if n == 3:
                    model_type = v
                elif n == 35:
                    byte_fallback = bool(v)
        elif number == 3:  # NormalizerSpec: 2 charsmap, 3 dummy prefix, 4 extra ws, 5 escape
            for n, _, v in _fields(value):
                if n == 2:
                    charsmap = bytes(v)
                elif n == 3:
                    dummy = bool(v)
                elif n == 4:
                    extra = bool(v)
                elif n == 5:
                    escape = bool(v)
    return SpmSettings(model_type, byte_fallback, charsmap, dummy, extra, escape, scores, types)


def bpe_merges(settings: SpmSettings, tokens) -> List[Tuple[str, str]]:
    """The merges of a SentencePiece BPE model for `tokenizers`' BPE: each split of a normal
    piece into two pieces of the vocabulary, ranked as SentencePiece merges (the highest-scoring
    merged piece first; then by its id and the parts' ids)."""
    ids = {token: i for i, token in enumerate(tokens)}
    merges = []
    for merged, piece in enumerate(tokens):
        if settings.types[merged] != NORMAL:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in ids and right in ids:
                merges.append(((-settings.scores[merged], merged, ids[left], ids[right]),
                               left, right))
    merges.sort()
    return [(left, right) for _, left, right in merges]


def build_spm_tokenizer(vocab: Vocab):
    """A `tokenizers.Tokenizer` equal in ids to electra-tf's SentencePiece tokenizer of `vocab`.

    Raises:
        ValueError: the model is neither a Unigram nor a BPE model, or does not escape whitespace.
    """
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors)

    settings = spm_settings(vocab.model)
    if settings.model_type not in (UNIGRAM, BPE):
        raise ValueError(f"SentencePiece model {vocab.path} is a "
                         f"{_MODEL_TYPES.get(settings.model_type, settings.model_type)} model; "
                         "the Hugging Face export supports unigram models (--learn-spm's, "
                         "spm_train's default) and bpe models")
    if not settings.escape_whitespaces:
        raise ValueError(f"SentencePiece model {vocab.path} does not mark spaces with "
                         f"{WORD_START_MARKER!r} (escape_whitespaces false): not supported by "
                         "the Hugging Face export")
    control, unknown, _ = piece_kinds(vocab)
    special = vocab.special
    if settings.model_type == BPE:
        tokenizer = Tokenizer(models.BPE(
            {piece: i for i, piece in enumerate(vocab.tokens)},
            bpe_merges(settings, vocab.tokens), unk_token=vocab.tokens[special.unk_id],
            fuse_unk=True, byte_fallback=settings.byte_fallback))
    else:
        tokenizer = Tokenizer(models.Unigram(
            [(piece, score) for piece, score in zip(vocab.tokens, settings.scores)],
            unk_id=special.unk_id, byte_fallback=settings.byte_fallback))
    steps = []
    if settings.charsmap:
        steps.append(normalizers.Precompiled(settings.charsmap))
    if settings.remove_extra_whitespaces:  # SentencePiece's: ASCII spaces only
        steps += [normalizers.Replace(Regex("^ +| +$"), ""),
                  normalizers.Replace(Regex(" {2,}"), " ")]
    if steps:
        tokenizer.normalizer = normalizers.Sequence(steps)
    scheme = "always" if settings.add_dummy_prefix else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=WORD_START_MARKER, prepend_scheme=scheme, split=True)
    decoder_steps = [decoders.Metaspace(replacement=WORD_START_MARKER, prepend_scheme=scheme)]
    if settings.byte_fallback:
        decoder_steps = [decoders.ByteFallback()] + decoder_steps
    tokenizer.decoder = decoders.Sequence(decoder_steps)
    tokens = vocab.tokens
    cls, sep = tokens[special.cls_id], tokens[special.sep_id]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, special.cls_id), (sep, special.sep_id)])
    specials = sorted(set(special) | control | unknown)
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i in specials])
    return tokenizer


def special_token_names(vocab: Vocab) -> Dict[str, str]:
    """transformers' special-token attributes, named by the model's pieces."""
    tokens, special = vocab.tokens, vocab.special
    return {"unk_token": tokens[special.unk_id], "sep_token": tokens[special.sep_id],
            "pad_token": tokens[special.pad_id], "cls_token": tokens[special.cls_id],
            "mask_token": tokens[special.mask_id]}
