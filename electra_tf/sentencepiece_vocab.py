"""What a SentencePiece model is: its kind, how a file is recognised as one, its pieces.

A SentencePiece model (`spm_train`'s `X.model`, a serialized `ModelProto`; `--spm-model FILE`, or
a `.model` vocab file) is the other kind of vocabulary besides a WordPiece vocab.txt: its kind's
name (`Vocab.kind`), how a file is recognised as one, the marker its pieces start words with, and
its control / unknown / byte pieces. `vocab.load_vocab` reads a model into a `Vocab` (its pieces
as the tokens, BERT's five specials looked up once: see vocab.py).

Only `sentencepiece` (the Python package) reads the file; tokenisation itself is
tensorflow-text's in-graph op (`electra_tf.data.text.spm_tokenization`), or, in a dataset build
without TensorFlow, the `sentencepiece` package's processor (`data.portable_tokenization`).
"""

from __future__ import annotations

# Vocab.kind of a SentencePiece model (a WordPiece vocab.txt is "wordpiece").
SENTENCEPIECE = "sentencepiece"
# SentencePiece marks a piece that starts a word (follows a space) with this character.
WORD_START_MARKER = "\u2581"


def looks_like_sentencepiece(path: str, head: bytes) -> bool:
    """Whether a vocab file should be read as a SentencePiece model rather than a vocab.txt.

    Args:
        path: the file's name (`.model` is SentencePiece's extension).
        head: the file's first bytes. A serialized ModelProto starts with its first piece
            (field 1, wire type 2: byte 0x0A), which no WordPiece vocab line does.
    """
    return path.endswith(".model") or head[:1] == b"\x0a"


def piece_kinds(vocab):
    """(control, unknown, byte) id sets of a SentencePiece vocab's model (`vocab`: a
    `vocab.Vocab` of kind SENTENCEPIECE)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(vocab.model)
    size = processor.GetPieceSize()
    return ({i for i in range(size) if processor.IsControl(i)},
            {i for i in range(size) if processor.IsUnknown(i)},
            {i for i in range(size) if processor.IsByte(i)})
