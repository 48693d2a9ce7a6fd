"""The dataset build's vocabulary: learned from the corpus first, or loaded as given.

`--learn-vocab` learns a WordPiece vocab (`vocab_learning`) and `--learn-spm` trains a
SentencePiece model (`spm_learning`) from an uncompressed plain-text corpus into the resolved
`vocab_file` / `spm_model`, refusing to replace one without `--overwrite`; both engines learn
here (the Beam build on its launcher, before the pipeline). `load_build_vocab` loads the
vocabulary the local build tokenises with.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

from electra_tf.data.build.build_config import BuildConfig
from electra_tf.data.text.corpus import CorpusFile
from electra_tf.data.text.formats import is_compressed, is_plain_text
from electra_tf.data.text.spm_learning import learn_spm
from electra_tf.errors import BuildError, error_line, shown_path
from electra_tf.sentencepiece_vocab import SENTENCEPIECE
from electra_tf.vocab import load_vocab

logger = logging.getLogger(__name__)


def _prepare_learned_file(config: BuildConfig, files: Sequence[CorpusFile], flag: str,
                          path: str, what: str, pass_it: str) -> None:
    """Checks that `flag` (--learn-vocab / --learn-spm) can read the corpus and may write `path`
    (the file it learns: `what`), and makes `path`'s directory. `pass_it`: how a user gives such a
    file instead (the messages of both flags have one shape)."""
    not_plain = next((f for f in files if is_compressed(f.path) or not is_plain_text(f.path)),
                     None) if config.input_format == "text" else None
    if config.input_format != "text" or not_plain is not None:
        shown = f" ({shown_path(not_plain.path)} is not)" if not_plain is not None else ""
        raise BuildError(f"{flag} reads uncompressed plain-text corpora only{shown}; {pass_it}")
    if os.path.exists(path) and not config.overwrite:
        raise BuildError(f"{what} {path} exists; pass --overwrite to replace it with a learned "
                         f"{'vocab' if flag == '--learn-vocab' else 'one'}, or give another path "
                         f"with {'--vocab-file' if flag == '--learn-vocab' else '--spm-model'}")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)


def learn_corpus_vocab(config: BuildConfig, files: Sequence[CorpusFile]) -> None:
    """--learn-vocab: learns a WordPiece vocab of the corpus into `config.vocab_file` (both
    engines: the Beam build learns it on the launcher, before the pipeline)."""
    try:  # lazy: TensorFlow is optional here (only --learn-vocab needs tensorflow-text)
        from electra_tf.data.text.vocab_learning import learn_vocab
    except ImportError as e:
        raise BuildError(f"--learn-vocab learns with tensorflow-text's WordPiece learner, which "
                         f"cannot be imported here ({error_line(e)}): learn the vocab where "
                         "TensorFlow is installed and pass it with --vocab-file, or train a "
                         "SentencePiece model with --learn-spm") from None
    _prepare_learned_file(config, files, "--learn-vocab", config.vocab_file, "vocab file",
                          "learn the vocab from such a corpus and pass it with --vocab-file")

    logger.info("learning a WordPiece vocab of %d tokens from %d files into %s",
                config.learn_vocab, len(files), config.vocab_file)
    try:
        learn_vocab([f.path for f in files], config.learn_vocab, config.vocab_file,
                    do_lower_case=config.do_lower_case, strip_accents=config.strip_accents)
    except ValueError as e:  # e.g. a size too small for the specials and the alphabet
        raise BuildError(f"--learn-vocab {config.learn_vocab}: {e}") from e


def learn_corpus_spm(config: BuildConfig, files: Sequence[CorpusFile]) -> None:
    """--learn-spm: trains a SentencePiece model on the corpus into `config.spm_model`."""
    _prepare_learned_file(config, files, "--learn-spm", config.spm_model, "SentencePiece model",
                          "train the model on such a corpus and pass it with --spm-model")
    logger.info("training a SentencePiece model of %d pieces on %d files into %s",
                config.learn_spm, len(files), config.spm_model)
    try:
        learn_spm([f.path for f in files], config.learn_spm, config.spm_model,
                  do_lower_case=config.do_lower_case)
    except ValueError as e:
        raise BuildError(f"--learn-spm {config.learn_spm}: {e}") from e


def load_build_vocab(config: BuildConfig):
    """The resolved config's vocabulary; `--spm-model` must name a SentencePiece model."""
    vocab = load_vocab(config.vocab_file)
    if config.spm_model is not None and vocab.kind != SENTENCEPIECE:
        raise BuildError(f"--spm-model {config.spm_model} is not a SentencePiece model (a "
                         "WordPiece vocab.txt goes to --vocab-file)")
    return vocab
