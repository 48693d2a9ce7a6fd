"""Training a SentencePiece model on the corpus (`build_pretraining_dataset.py --learn-spm SIZE`).

The `sentencepiece` package's trainer reads the corpus files' lines (one sentence per line; blank
lines are skipped by the trainer) and learns a Unigram model of at most SIZE pieces laid out as
ELECTRA expects, so no mapping is needed: [PAD]=0, [UNK]=1, then [CLS]=2, [SEP]=3, [MASK]=4 as
control symbols (never produced from text, as BERT never makes [MASK] out of the text
"[MASK]"), then the learned pieces. There are no BOS/EOS pieces: the builder adds [CLS]/[SEP].

Normalisation is SentencePiece's own, stored in the model (so the in-graph tokenizer and the
Hugging Face export apply the same): NFKC (`nmt_nfkc`), with case folding (`nmt_nfkc_cf`) when
lowercasing (`--do-lower-case`, the default). Accents are kept whatever `--strip-accents` says:
stripping them (NFD, drop marks) would also take Korean syllables and Vietnamese letters apart.

Deterministic: one thread, every sentence read (no sampling), no input shuffling, so the same
corpus and size give the same model bytes. The learned size can be below SIZE on a small corpus
(`hard_vocab_limit` off; a warning says so): a vocab_size hparam at least as large works.
"""

from __future__ import annotations

import io
import logging
from typing import Sequence

from electra_tf import atomic
from electra_tf.vocab import (CLS_TOKEN, MASK_TOKEN, PAD_TOKEN, SEP_TOKEN, UNK_TOKEN, Vocab,
                              load_vocab)

logger = logging.getLogger(__name__)

SPECIAL_PIECES = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
# SentencePiece's default: the rarest 0.05% of characters become [UNK] (keeps stray symbols
# from taking pieces; 1.0 would keep every character, which small CJK corpora may want).
CHARACTER_COVERAGE = 0.9995
# Sentences longer than this (bytes) are skipped by the trainer; one corpus line is a sentence.
MAX_SENTENCE_LENGTH = 1 << 16
MODEL_TYPE = "unigram"


def normalization_rule(do_lower_case: bool) -> str:
    """SentencePiece's normalisation rule for `--learn-spm` (see module docstring)."""
    return "nmt_nfkc_cf" if do_lower_case else "nmt_nfkc"


def learn_spm(files: Sequence[str], vocab_size: int, output_path: str,
              do_lower_case: bool = True) -> Vocab:
    """Trains a SentencePiece model of at most `vocab_size` pieces and writes it to `output_path`.

    Args:
        files: corpus text files, UTF-8, one sentence per line.
        vocab_size: int. Pieces of the model, the five specials included.
        output_path: str. Written atomically, replacing any existing file: the caller decides
            whether replacing is allowed.
        do_lower_case: bool. Case-fold (`nmt_nfkc_cf`) or not (`nmt_nfkc`).

    Returns:
        The written model, as `load_vocab(output_path)`.

    Raises:
        ValueError: `vocab_size` is not a positive integer larger than the specials, no files,
            or the trainer rejects the corpus (its message, one line).
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or \
            vocab_size <= len(SPECIAL_PIECES):
        raise ValueError(f"SentencePiece vocab size must be an integer above "
                         f"{len(SPECIAL_PIECES)} (the special tokens), got {vocab_size!r}")
    if not files:
        raise ValueError("no corpus files to learn a SentencePiece model from")
    import sentencepiece

    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.Train(
            input=list(files), model_writer=model, vocab_size=vocab_size,
            model_type=MODEL_TYPE, normalization_rule_name=normalization_rule(do_lower_case),
            pad_id=0, pad_piece=PAD_TOKEN, unk_id=1, unk_piece=UNK_TOKEN, bos_id=-1, eos_id=-1,
            control_symbols=[CLS_TOKEN, SEP_TOKEN, MASK_TOKEN],
            character_coverage=CHARACTER_COVERAGE, hard_vocab_limit=False,
            input_sentence_size=0, shuffle_input_sentence=False, num_threads=1,
            max_sentence_length=MAX_SENTENCE_LENGTH, minloglevel=2)
    except RuntimeError as e:
        raise ValueError(f"sentencepiece: {str(e).strip().splitlines()[-1]}") from None
    with atomic.atomic_path(output_path) as tmp:
        with open(tmp, "wb") as f:
            f.write(model.getvalue())
    vocab = load_vocab(output_path)
    logger.info("wrote a %d-piece SentencePiece model to %s", vocab.size, output_path)
    if vocab.size < vocab_size:
        logger.warning("the corpus yields only %d SentencePiece pieces, fewer than the %d asked "
                       "for (--learn-spm)", vocab.size, vocab_size)
    return vocab
