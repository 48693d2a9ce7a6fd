"""Which tokenizer a dataset build runs: TensorFlow's in-graph one, or the TensorFlow-free one.

`build_pretraining_dataset.py --tokenizer`:

- `tensorflow`: `tokenization.Tokenizer` (tensorflow-text in a TensorFlow graph; the tokenizer
  fine-tuning and the exported `serve_text` run too);
- `tokenizers`: `portable_tokenization.PortableTokenizer` (BERT's BasicTokenizer in Python,
  WordPiece by Hugging Face `tokenizers`; SentencePiece by the `sentencepiece` package), for a
  machine without TensorFlow (a JAX or PyTorch box). The same ids, so byte-identical shards,
  except on the one input class `portable_tokenization` names;
- `auto` (the default): `tensorflow` where TensorFlow and tensorflow-text import, else
  `tokenizers` (one line says so).

The choice is made once, where the build starts (`resolve_tokenizer`), and handed to every
worker as a name: a worker that cannot run it fails the build with one line rather than
tokenise with the other one, so a dataset is never a mix of the two (they differ on that input
class). The manifest records which one built it (`manifest_entry`).
"""

from __future__ import annotations

import functools
import logging
from typing import Optional

from electra_tf import console
from electra_tf.data.text.portable_tokenization import PortableTokenizer
from electra_tf.errors import BuildError, error_line
from electra_tf.vocab import WORDPIECE

logger = logging.getLogger(__name__)

AUTO = "auto"
TENSORFLOW = "tensorflow"
TOKENIZERS = "tokenizers"
CHOICES = (AUTO, TENSORFLOW, TOKENIZERS)


@functools.lru_cache(maxsize=None)
def tensorflow_problem() -> Optional[str]:
    """Why TensorFlow's tokenizer cannot run in this process (None: it can). Imports TensorFlow
    and tensorflow-text (quietly, as the tools do); the answer is kept for the process."""
    try:
        console.import_tensorflow()
        import tensorflow_text  # noqa: F401 -- its ops: the tokenizer's
    except ImportError as e:
        return error_line(e)
    return None


def resolve_tokenizer(name: str) -> str:
    """`--tokenizer` NAME as the tokenizer the build runs ("tensorflow" or "tokenizers").

    Raises:
        BuildError: an unknown name, or "tensorflow" where TensorFlow cannot be imported.
    """
    if name not in CHOICES:
        raise BuildError(f"--tokenizer must be one of {', '.join(CHOICES)}, got {name!r}")
    if name == TOKENIZERS:
        return name
    problem = tensorflow_problem()
    if problem is None:
        return TENSORFLOW
    if name == TENSORFLOW:
        raise BuildError(f"--tokenizer tensorflow: TensorFlow cannot be imported here ({problem}); "
                         f"--tokenizer {TOKENIZERS} builds the same shards without it")
    _log_fallback(problem)
    return TOKENIZERS


@functools.lru_cache(maxsize=None)
def _log_fallback(problem: str) -> None:
    logger.info("TensorFlow cannot be imported (%s): tokenizing with Hugging Face tokenizers "
                "(--tokenizer %s; the same ids as TensorFlow's tokenizer)", problem, TOKENIZERS)


def make_tokenizer(vocab, do_lower_case: bool, strip_accents: bool, name: str):
    """The tokenizer `name` ("tensorflow" or "tokenizers", resolved) over `vocab`.

    Raises:
        BuildError: "tensorflow" where it cannot be imported (never the other one instead).
    """
    if name == TENSORFLOW:
        try:  # lazy: TensorFlow is optional here (a build may tokenize without it)
            from electra_tf.data.text.tokenization import Tokenizer
        except ImportError as e:
            raise BuildError(
                f"this build tokenizes with TensorFlow (chosen where it started: --tokenizer), "
                f"which cannot be imported in this worker ({error_line(e)}); a dataset is never "
                f"built with two tokenizers: rerun with --tokenizer {TOKENIZERS}") from None
        return Tokenizer(vocab, do_lower_case=do_lower_case, strip_accents=strip_accents)
    if name == TOKENIZERS:
        return PortableTokenizer(vocab, do_lower_case=do_lower_case, strip_accents=strip_accents)
    raise ValueError(f"unresolved tokenizer {name!r}")


def manifest_entry(name: str, vocab_kind: str) -> dict:
    """The manifest's `tokenizer`: which one built the dataset, and its library's version."""
    from importlib import metadata

    library = {TENSORFLOW: "tensorflow-text",
               TOKENIZERS: "tokenizers" if vocab_kind == WORDPIECE else "sentencepiece"}[name]
    try:
        version = metadata.version(library)
    except metadata.PackageNotFoundError:
        version = "not installed"
    return {"name": name, "library": library, "version": version}
