"""Vocabularies: reading, validating and fingerprinting `vocab.txt` files and SentencePiece models.

A vocab file holds one token per line; a token's id is its 0-based line index (BERT's convention,
each line stripped of surrounding whitespace). A SentencePiece model (`--spm-model FILE`: a
`.model` file, recognised by its name or its first byte: `sentencepiece_vocab`) is the other
kind of vocabulary, read into the same `Vocab` (its pieces as the tokens, its ids unchanged).
ELECTRA needs five special tokens; their ids are looked up by string here, once, and handed to
tensor code as plain integers (`SpecialTokens`), so no tensor function ever reads a file.

In a SentencePiece model ELECTRA needs BERT's five specials too, and pads with id 0:

- a piece literally named [PAD], [UNK], [CLS], [SEP] or [MASK] (how `--learn-spm` trains them,
  and ALBERT's spiece.model has [CLS], [SEP], [MASK]) is used first;
- otherwise the SentencePiece conventions: [PAD] = the model's pad piece (`<pad>`), [UNK] = its
  unknown piece (always the id the tokenizer gives an unknown character, whatever its name),
  [CLS] = `<cls>` or the BOS piece `<s>`, [SEP] = `<sep>` or the EOS piece `</s>`,
  [MASK] = `<mask>`. A mapping other than the literal names is logged once.

A model lacking one of them, or whose pad piece is not id 0, is a one-line `VocabError` naming
what is missing and how to train a model that has them (`--learn-spm` does).
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Dict, NamedTuple, Optional, Tuple

from electra_tf.errors import ElectraError
from electra_tf.sentencepiece_vocab import SENTENCEPIECE, looks_like_sentencepiece

logger = logging.getLogger(__name__)

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
# The tokens every ELECTRA vocab must contain; [PAD] must also be id 0, since the builder pads
# with 0 and the model treats id 0 under input_mask 0 as padding.
REQUIRED_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
# Vocab.kind of a vocab.txt (a SentencePiece model's is sentencepiece_vocab.SENTENCEPIECE).
WORDPIECE = "wordpiece"


class VocabError(ElectraError, ValueError):
    """A vocab file is missing, unreadable or lacks a required special token."""


class SpecialTokens(NamedTuple):
    """Ids of the special tokens, passed explicitly to masking and example building."""

    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int


class Vocab(NamedTuple):
    """A loaded vocab file.

    Attributes:
        path: str. Where it was read from.
        tokens: tuple[str, ...]. Token strings in id order.
        special: SpecialTokens. Ids of [PAD], [UNK], [CLS], [SEP], [MASK].
        sha256: str. Hex digest of the file's bytes; the builder's manifest and the trainer
            compare it to catch a dataset built with a different vocab.
        kind: str. "wordpiece" (a vocab.txt) or "sentencepiece" (a SentencePiece model).
        model: bytes or None. A SentencePiece vocab's serialized model (what the in-graph
            tokenizer is built from); None for WordPiece.
    """

    path: str
    tokens: tuple
    special: SpecialTokens
    sha256: str
    kind: str = WORDPIECE
    model: Optional[bytes] = None

    @property
    def size(self) -> int:
        return len(self.tokens)


def file_sha256(path: str, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks (bounded memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_bytes(path: str) -> bytes:
    """Returns the vocab file's bytes.

    Args:
        path: str. The vocab file.

    Raises:
        VocabError: the file is missing or unreadable.
    """
    if not os.path.isfile(path):
        raise VocabError(f"vocab file not found: {path}{_accepted_names(path)}")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise VocabError(f"cannot read vocab file {path}: {e.strerror}") from e


# What a data directory's vocabulary is looked up as when no vocab_file is given (config.py).
DEFAULT_NAMES = ("vocab.txt", "spm.model")


def _accepted_names(path: str) -> str:
    """For a missing default `DATA_DIR/vocab.txt`: the names a data directory's vocabulary may
    have, and the files of the directory that look like one under another name ("" else)."""
    if os.path.basename(path) != DEFAULT_NAMES[0]:
        return ""
    directory = os.path.dirname(path) or "."
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    lookalikes = [n for n in names if n not in DEFAULT_NAMES
                  and (n.endswith((".model", ".vocab")) or "vocab" in n.lower())
                  and os.path.isfile(os.path.join(directory, n))]
    advice = (f"; {directory} holds {', '.join(lookalikes[:3])}: rename it to one of those, "
              "or name it with the vocab_file hparam" if lookalikes else "")
    return (" (a data directory's vocabulary is vocab.txt, a WordPiece vocab, or spm.model, a "
            f"SentencePiece model{advice})")


def _decode(path: str, raw: bytes) -> str:
    """Decodes a token-per-line vocab file's bytes.

    Args:
        path: str, named in the error message.
        raw: the file's bytes.

    Returns:
        The text.

    Raises:
        VocabError: the bytes are not UTF-8 or start with a UTF-8 byte order mark.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise VocabError(f"vocab file {path} is not UTF-8 (byte offset {e.start})") from e
    if text.startswith("\ufeff"):  # (an editor's "UTF-8 with BOM"): its first token would be
        # "\ufeff[PAD]" here and for every other reader of the file (transformers, TF Text)
        raise VocabError(f"vocab file {path} starts with a UTF-8 byte order mark (BOM, bytes "
                         "EF BB BF): save it as UTF-8 without a BOM (e.g. sed -i "
                         "'1s/^\\xEF\\xBB\\xBF//' FILE)")
    return text


def _checked_index(path: str, tokens: Tuple[str, ...]) -> Dict[str, int]:
    """Maps each token to its id after checking the vocab's invariants.

    Args:
        path: str, named in the error messages.
        tokens: the tokens in id order.

    Returns:
        {token: id}.

    Raises:
        VocabError: no tokens, a duplicate token, a missing required special token, or [PAD]
            not id 0.
    """
    if not tokens:
        raise VocabError(f"vocab file {path} is empty")
    index: Dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in index:
            raise VocabError(
                f"vocab file {path}: token {token!r} appears twice (lines {index[token] + 1} and {i + 1})"
            )
        index[token] = i
    missing = [t for t in REQUIRED_TOKENS if t not in index]
    if missing:
        raise VocabError(f"vocab file {path} lacks required special token(s): {', '.join(missing)}")
    if index[PAD_TOKEN] != 0:
        raise VocabError(
            f"vocab file {path}: {PAD_TOKEN} must be on the first line (id 0), found at line "
            f"{index[PAD_TOKEN] + 1}"
        )
    return index


def load_vocab(path: str) -> Vocab:
    """Reads and validates a BERT-style vocab file, or a SentencePiece model.

    Args:
        path: str. Path of a UTF-8 file with one token per line, or of a SentencePiece model
            (named `*.model`, or starting with a serialized ModelProto's first byte), read by
            `load_sentencepiece_vocab`.

    Returns:
        A `Vocab`.

    Raises:
        VocabError: the file is missing, unreadable, not UTF-8 (or starts with a byte order
            mark), has duplicate tokens, lacks a
            required special token, or [PAD] is not id 0. The message names the file.
    """
    raw = _read_bytes(path)
    if looks_like_sentencepiece(path, raw[:1]):
        return load_sentencepiece_vocab(path, raw)
    text = _decode(path, raw)
    # BERT's load_vocab strips each line; a trailing newline does not add an empty token.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tokens = tuple(line.strip() for line in lines)
    index = _checked_index(path, tokens)
    special = SpecialTokens(
        pad_id=index[PAD_TOKEN],
        unk_id=index[UNK_TOKEN],
        cls_id=index[CLS_TOKEN],
        sep_id=index[SEP_TOKEN],
        mask_id=index[MASK_TOKEN],
    )
    return Vocab(path=path, tokens=tokens, special=special, sha256=hashlib.sha256(raw).hexdigest())


# ------------------------------------------------------------------------------------------------
# SentencePiece models

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
