"""What a command-line tool prints: the project's own lines, not TensorFlow's start-up noise.

By default a tool prints electra-tf's INFO lines (progress, eval, export, results) and warnings
and errors from anyone; TensorFlow's C++ start-up lines (oneDNN, CUDA probing: written before
its logging is configured, so no log level reaches them), its Python INFO lines ("Sharding
callback duration", the SavedModel input renames) and its WARNING chatter (`parallel_iterations`)
are dropped. `--verbose` shows everything; `--quiet` shows warnings and errors only.

Call `setup(quiet, verbose)` once, after parsing flags and BEFORE anything imports TensorFlow
(the C++ log level is read from the environment when TensorFlow loads).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile

from electra_tf import malloc_tunables

# Loggers of libraries whose INFO and WARNING lines are not the user's business by default.
THIRD_PARTY_LOGGERS = ("tensorflow", "absl", "keras", "h5py", "jax")
TF_CPP_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_TF_CPP_LOG_LEVEL = "3"  # C++ FATAL only; errors reach the user as Python exceptions
LOG_FORMAT = "%(asctime)s %(message)s"
DATE_FORMAT = "%H:%M:%S"

# Set by `setup` for the tool's child processes (the dataset builder's workers), which do not
# parse flags: "0" quiet, "1" verbose.
VERBOSE_ENV = "ELECTRA_TF_VERBOSE"
KERAS_BACKEND_ENV = "KERAS_BACKEND"  # read by Keras once, at import
# The Keras backends electra-tf runs on (`--backend`, the `backend` hparam): one list for
# the config checks, the tools, the capability table, the precision decision and fine-tuning.
KERAS_BACKENDS = ("tensorflow", "jax", "torch")

_verbose = False


def add_verbosity_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the mutually exclusive `--quiet` and `--verbose` flags."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", action="store_true",
                       help="print warnings and errors only")
    group.add_argument("--verbose", action="store_true",
                       help="print everything, TensorFlow's start-up and INFO lines included "
                            "(default: electra-tf's own lines, warnings and errors)")


def setup(quiet: bool = False, verbose: bool = False) -> None:
    """Configures logging for a tool run (see the module docstring).

    Args:
        quiet: bool. WARNING and above only.
        verbose: bool. Everything, third-party INFO lines included.
    """
    global _verbose
    _verbose = verbose
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    if not verbose:
        os.environ.setdefault(TF_CPP_LOG_LEVEL_ENV, QUIET_TF_CPP_LOG_LEVEL)
    level = logging.WARNING if quiet else logging.INFO
    root = logging.getLogger()
    if not root.handlers:  # else the host (a test runner, an application) configured logging
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
        root.addHandler(handler)
        # Records of electra_tf's loggers reach the root's handler whatever the root's level.
        root.setLevel(logging.INFO if verbose and not quiet else logging.WARNING)
    logging.getLogger("electra_tf").setLevel(level)
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)


def verbose() -> bool:
    """Whether the tool runs with --verbose (also in its child processes)."""
    return _verbose or os.environ.get(VERBOSE_ENV) == "1"


def import_tensorflow():
    """Imports TensorFlow, hiding the lines its C++ libraries write to stderr while loading
    (unless `--verbose`); they are replayed if the import fails. Returns the module.

    Keras is set to its TensorFlow backend first (`use_tensorflow_keras`)."""
    use_tensorflow_keras()
    if _verbose or "tensorflow" in sys.modules:
        import tensorflow as tf
        return tf
    with _stderr_captured():
        import tensorflow as tf
    _quiet_tensorflow_loggers()
    return tf


def use_backend(backend: str, command_line: bool) -> None:
    """A tool's choice of Keras backend, made after `setup` and before anything imports Keras
    (which reads `KERAS_BACKEND` once, at import): TensorFlow is imported (`import_tensorflow`),
    JAX or PyTorch named in `KERAS_BACKEND`. On JAX, the command line's own process
    (`command_line`: the tool's `main` got no argv; never a caller's process) first re-executes
    itself with glibc's malloc tunables where they apply (`malloc_tunables.reexec_for_jax`)."""
    if backend == "jax" and command_line:
        malloc_tunables.reexec_for_jax()
    if backend == "tensorflow":
        import_tensorflow()
    else:
        os.environ[KERAS_BACKEND_ENV] = backend


def use_tensorflow_keras() -> None:
    """A tool that runs on TensorFlow sets `KERAS_BACKEND=tensorflow` before Keras is imported.

    Keras reads its backend once, at import, from `KERAS_BACKEND` (else ~/.keras/keras.json): a
    JAX user's shell exporting `KERAS_BACKEND=jax` would otherwise give the TensorFlow trainer,
    fine-tuning and the converters JAX tensors, failing deep inside them. The tools pick their
    backend with `--backend` (pretraining) instead; the variable set to another backend is noted
    in one line. Nothing is changed once Keras is imported (the trainers check the backend).
    """
    if "keras" in sys.modules:
        return
    found = os.environ.get(KERAS_BACKEND_ENV)
    if found and found != "tensorflow":
        logging.getLogger("electra_tf").info(
            "%s=%s in the environment is ignored: this tool runs Keras on TensorFlow "
            "(pretraining on JAX or PyTorch: --backend jax or torch)", KERAS_BACKEND_ENV, found)
    os.environ[KERAS_BACKEND_ENV] = "tensorflow"


def import_tensorflow_in_child() -> None:
    """In a child process of a tool: imports TensorFlow as the tool would (its C++ start-up
    lines hidden unless the tool runs with --verbose; nothing hidden outside a tool)."""
    if os.environ.get(VERBOSE_ENV) == "0":
        import_tensorflow()


def _quiet_tensorflow_loggers() -> None:
    # Importing TensorFlow may reset the level of its logger.
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def _stderr_captured():
    """Redirects file descriptor 2 (what C++ writes to) into a temporary file for the block;
    on an exception the captured text is written back to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
