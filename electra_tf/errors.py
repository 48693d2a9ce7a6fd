"""The user-facing error base, and the one helper that turns any error into one line.

Every error a user can fix (a bad flag, file, config or run directory) derives from
`ElectraError`; the command-line tools catch that base alone (`electra_tf.cli.run_cli`), print
one line and exit 2. Anything else is a bug and keeps its traceback. The concrete classes live
next to the code that raises them (`ConfigError` in config.py, `VocabError` in vocab.py, ...);
`TrainingError` lives here because every module of `electra_tf.training` raises it.
"""

from __future__ import annotations

from typing import Optional


class ElectraError(Exception):
    """A problem with the user's inputs or environment; the message says what and where."""


class TrainingError(ElectraError, RuntimeError):
    """Training cannot continue (non-finite loss, incompatible or unreadable run directory, ...)."""


def error_line(error: BaseException, limit: Optional[int] = 300, whole: bool = False) -> str:
    """One line describing `error`, for a message that embeds it or for the terminal.

    TensorFlow's and Keras' errors run over many lines (op context, stack traces); their first
    line is the part a user can act on.

    Args:
        error: any exception.
        limit: int or None. At most this many characters (None: no limit).
        whole: bool. Keep the whole message (its lines joined) instead of the first line only.

    Returns:
        The message with runs of whitespace folded to one space, or the class name when the
        message is empty.
    """
    text = str(error).strip()
    if not whole:
        text = text.splitlines()[0] if text else ""
    text = " ".join(text.split()) or type(error).__name__
    return text[:limit] if limit else text
