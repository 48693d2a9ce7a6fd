"""Vocabularies: reading, validating and fingerprinting `vocab.txt` files (and SentencePiece models).

A vocab file holds one token per line; a token's id is its 0-based line index (BERT's convention,
each line stripped of surrounding whitespace). A SentencePiece model (`--spm-model FILE`: a
`.model` file, recognised by its name or its first byte) is the other kind of vocabulary; it is
read by `electra_tf.sentencepiece_vocab` into the same `Vocab` (its pieces as the tokens). ELECTRA needs five special tokens; their ids are
looked up by string here, once, and handed to tensor code as plain integers (`SpecialTokens`),
so no tensor function ever reads a file.
"""

from __future__ import annotations

import hashlib
import os
from typing import Dict, NamedTuple, Optional, Tuple

from electra_tf.errors import ElectraError

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
            `sentencepiece_vocab.load_sentencepiece_vocab`.

    Returns:
        A `Vocab`.

    Raises:
        VocabError: the file is missing, unreadable, not UTF-8 (or starts with a byte order
            mark), has duplicate tokens, lacks a
            required special token, or [PAD] is not id 0. The message names the file.
    """
    raw = _read_bytes(path)
    from electra_tf import sentencepiece_vocab  # imports this module

    if sentencepiece_vocab.looks_like_sentencepiece(path, raw[:1]):
        return sentencepiece_vocab.load_sentencepiece_vocab(path, raw)
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
