"""SentencePiece models as ELECTRA vocabularies (`--spm-model FILE`, or a `.model` vocab file).

A SentencePiece model (`spm_train`'s `X.model`, a serialized `ModelProto`) holds its pieces in id
order; its ids are the model's token ids, unchanged. ELECTRA needs BERT's five special tokens
([PAD], [UNK], [CLS], [SEP], [MASK]) and pads with id 0, so each is looked up in the model once,
here, and handed on as plain integers (`SpecialTokens`), as for a WordPiece vocab:

- a piece literally named [PAD], [UNK], [CLS], [SEP] or [MASK] (how `--learn-spm` trains them,
  and ALBERT's spiece.model has [CLS], [SEP], [MASK]) is used first;
- otherwise the SentencePiece conventions: [PAD] = the model's pad piece (`<pad>`), [UNK] = its
  unknown piece (always the id the tokenizer gives an unknown character, whatever its name),
  [CLS] = `<cls>` or the BOS piece `<s>`, [SEP] = `<sep>` or the EOS piece `</s>`,
  [MASK] = `<mask>`. A mapping other than the literal names is logged once.

A model lacking one of them, or whose pad piece is not id 0, is a one-line `VocabError` naming
what is missing and how to train a model that has them (`--learn-spm` does).

Only `sentencepiece` (the Python package) reads the file here; tokenisation itself is
tensorflow-text's in-graph op (`electra_tf.data.spm_tokenization`), or, in a dataset build
without TensorFlow, the `sentencepiece` package's processor (`data.portable_tokenization`).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Dict, Optional, Tuple

from electra_tf.vocab import (CLS_TOKEN, MASK_TOKEN, PAD_TOKEN, SEP_TOKEN, UNK_TOKEN,
                              SpecialTokens, Vocab, VocabError)

logger = logging.getLogger(__name__)

# Vocab.kind of a SentencePiece model (a WordPiece vocab.txt is "wordpiece").
SENTENCEPIECE = "sentencepiece"
# SentencePiece marks a piece that starts a word (follows a space) with this character.
WORD_START_MARKER = "\u2581"
# Fallback names, after the literal BERT name, by SentencePiece / XLNet / T5 convention.
_CONVENTIONAL_NAMES = {
    PAD_TOKEN: ("<pad>",),
    CLS_TOKEN: ("<cls>", "<s>"),
    SEP_TOKEN: ("<sep>", "</s>"),
    MASK_TOKEN: ("<mask>",),
}
# What a user should run to get a model with the BERT specials at the ids ELECTRA expects.
TRAIN_HINT = ("train one with build_pretraining_dataset.py --learn-spm SIZE, or spm_train "
              "--pad_id=0 --pad_piece=[PAD] --unk_id=1 --unk_piece=[UNK] --bos_id=-1 --eos_id=-1 "
              "--control_symbols=[CLS],[SEP],[MASK]")


def looks_like_sentencepiece(path: str, head: bytes) -> bool:
    """Whether a vocab file should be read as a SentencePiece model rather than a vocab.txt.

    Args:
        path: the file's name (`.model` is SentencePiece's extension).
        head: the file's first bytes. A serialized ModelProto starts with its first piece
            (field 1, wire type 2: byte 0x0A), which no WordPiece vocab line does.
    """
    return path.endswith(".model") or head[:1] == b"\x0a"


def _processor(raw: bytes, path: str):
    try:
        import sentencepiece
    except ImportError as e:  # a dependency; only a broken install lacks it
        raise VocabError(f"reading the SentencePiece model {path} needs the sentencepiece "
                         "package: pip install sentencepiece") from e
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(raw)
    except (RuntimeError, OSError, TypeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise VocabError(f"{path} is not a SentencePiece model ({reason})") from None
    if processor.GetPieceSize() == 0:
        raise VocabError(f"SentencePiece model {path} has no pieces")
    return processor


def special_mapping(processor, path: str) -> Tuple[SpecialTokens, Dict[str, str]]:
    """The ids of the BERT specials in a loaded model, and the piece each was mapped to.

    Raises:
        VocabError: a special is missing, or [PAD] is not id 0 (one line naming them).
    """
    size = processor.GetPieceSize()
    index = {processor.IdToPiece(i): i for i in range(size)}
    found: Dict[str, Optional[int]] = {}
    for token in (PAD_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN):
        found[token] = next((index[name] for name in (token,) + _CONVENTIONAL_NAMES[token]
                             if name in index), None)
    # The op emits the model's unknown id for an unknown character, whatever its piece is named.
    found[UNK_TOKEN] = processor.unk_id()
    missing = [t for t in (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
               if found[t] is None]
    if missing:
        looked = "; ".join(f"{t} as {' or '.join((t,) + _CONVENTIONAL_NAMES.get(t, ()))}"
                           for t in missing)
        raise VocabError(f"SentencePiece model {path} lacks the special token(s) ELECTRA needs "
                         f"(looked for {looked}): {TRAIN_HINT}")
    if found[PAD_TOKEN] != 0:
        raise VocabError(
            f"SentencePiece model {path}: its pad piece {processor.IdToPiece(found[PAD_TOKEN])!r} "
            f"is id {found[PAD_TOKEN]}, but ELECTRA pads with id 0 (id 0 is "
            f"{processor.IdToPiece(0)!r}): {TRAIN_HINT}")
    ids = [found[t] for t in (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)]
    if len(set(ids)) != len(ids):
        raise VocabError(f"SentencePiece model {path}: two BERT special tokens map to the same "
                         f"piece ({dict(zip((PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN), ids))}): "
                         f"{TRAIN_HINT}")
    mapping = {t: processor.IdToPiece(found[t]) for t in found}
    return SpecialTokens(*ids), mapping


def load_sentencepiece_vocab(path: str, raw: bytes) -> Vocab:
    """A `Vocab` (kind "sentencepiece") of the SentencePiece model whose bytes are `raw`.

    Args:
        path: str. Where `raw` was read from (for messages and `Vocab.path`).
        raw: bytes. The serialized model.

    Raises:
        VocabError: not a SentencePiece model, or lacking a BERT special (see module docstring).
    """
    processor = _processor(raw, path)
    special, mapping = special_mapping(processor, path)
    unusual = {t: p for t, p in mapping.items() if t != p}
    if unusual:
        logger.info("SentencePiece model %s: BERT specials mapped as %s", path,
                    ", ".join(f"{t}={p!r} (id {getattr(special, _FIELD[t])})"
                              for t, p in unusual.items()))
    tokens = tuple(processor.IdToPiece(i) for i in range(processor.GetPieceSize()))
    return Vocab(path=path, tokens=tokens, special=special, sha256=hashlib.sha256(raw).hexdigest(),
                 kind=SENTENCEPIECE, model=raw)


_FIELD = {PAD_TOKEN: "pad_id", UNK_TOKEN: "unk_id", CLS_TOKEN: "cls_id", SEP_TOKEN: "sep_id",
          MASK_TOKEN: "mask_id"}


def piece_kinds(vocab: Vocab):
    """(control, unknown, byte) id sets of a SentencePiece vocab's model."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(vocab.model)
    size = processor.GetPieceSize()
    return ({i for i in range(size) if processor.IsControl(i)},
            {i for i in range(size) if processor.IsUnknown(i)},
            {i for i in range(size) if processor.IsByte(i)})
