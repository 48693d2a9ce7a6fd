"""The user-facing error base, and the one helper that turns any error into one line.

Every error a user can fix (a bad flag, file, config or run directory) derives from
`ElectraError`; the command-line tools catch that base alone (`electra_tf.cli.run_cli`), print
one line and exit 2. Anything else is a bug and keeps its traceback. The concrete classes live
next to the code that raises them (`ConfigError` in hparams.py, `VocabError` in vocab.py, ...);
those a whole family of modules raises live here, below all of them: `TrainingError` (every
module of `electra_tf.training`), `BuildError` (the dataset build's modules in `electra_tf.data`)
and `DataError` (the modules that check and read pretraining shards).
"""

from __future__ import annotations

import os
import re
from typing import Optional, Union

# TensorFlow's decorations of an op error, no use to a user: `{{function_node ...}}` and the
# trailing ` [Op:Name]`.
_TF_NOISE = re.compile(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\]")


class ElectraError(Exception):
    """A problem with the user's inputs or environment; the message says what and where."""


class TrainingError(ElectraError, RuntimeError):
    """Training cannot continue (non-finite loss, incompatible or unreadable run directory, ...)."""


class BuildError(ElectraError, ValueError):
    """Bad input or settings for the dataset builder; the message is one line naming the problem."""


class DataError(ElectraError, ValueError):
    """The pretraining data is missing or does not match the config."""


class Preempted(Exception):
    """The run was asked to stop (SIGTERM) and saved a checkpoint first: not an error. The
    command-line tools exit with `electra_tf.cli.EXIT_PREEMPTED`; rerunning resumes."""


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
        message is empty. An OSError reads `<reason>: <file>` (the file name escaped, see
        `shown_path`).
    """
    if isinstance(error, OSError) and error.strerror:
        text = error.strerror
        names = [name for name in (error.filename, error.filename2) if name is not None]
        if names:
            text += ": " + " -> ".join(shown_path(name) for name in names)
    else:
        text = _TF_NOISE.sub("", str(error)).strip()
    if not whole:
        text = text.splitlines()[0] if text else ""
    text = " ".join(text.split()) or type(error).__name__
    return text[:limit] if limit else text


def shown_path(path: Union[str, bytes, os.PathLike]) -> str:
    """A file name as messages show it: printable, on one line, whatever its bytes.

    File names are bytes on POSIX; Python hands the ones that are not valid UTF-8 over with
    surrogate escapes (`caf\\udce9.txt`), which cannot be printed or encoded as UTF-8. Those
    bytes are shown as `\\xNN` (`caf\\xe9.txt`), control characters (a newline in a name) as
    escapes too, so a message stays one printable line naming the file unambiguously.
    """
    raw = os.fsencode(path)
    text = raw.decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def is_utf8_path(path: Union[str, bytes, os.PathLike]) -> bool:
    """True if the file name's bytes are valid UTF-8 (what TensorFlow's file APIs need)."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
