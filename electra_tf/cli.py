"""Command-line glue shared by the scripts: logging, user errors as one line, the exit codes.

Every command-line tool (run_pretraining.py, run_finetuning.py, `python -m electra_tf.convert`,
pretrain_data/fetch.py, `python -m electra_tf.sources.labelled`) calls `setup_logging` once and
runs its work through `run_cli`: a user error (`ElectraError`) becomes one line on stderr,
`PROG: error: MESSAGE`, and exit status 2 (argparse's status for bad usage); Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Callable, Optional, Tuple, Type

from electra_tf.config import ConfigError, PretrainingConfig, parse_hparams
from electra_tf.errors import ElectraError, error_line

logger = logging.getLogger("electra_tf")

EXIT_USER_ERROR = 2  # argparse's status for bad usage
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell convention

# Error classes of modules that do not derive from ElectraError yet (data/ files being rewritten
# in parallel): matched only once their module has been imported, so catching them never imports
# TensorFlow into a light tool. Drop each entry when its class derives from ElectraError.
_NOT_YET_ELECTRA_ERRORS = (
    ("electra_tf.data.pipeline", "DataError"),
    ("electra_tf.data.tfrecord_io", "ManifestError"),
    ("electra_tf.data.corpus", "CorpusError"),
    ("electra_tf.data.builder", "BuildError"),
)


def setup_logging(quiet: bool = False) -> None:
    """INFO (or, `quiet`, WARNING) lines `HH:MM:SS message` on stderr for electra_tf's loggers."""
    level = logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("electra_tf").setLevel(level)


def user_error_types() -> Tuple[Type[BaseException], ...]:
    """The exception classes `run_cli` reports as one line (ElectraError and, until they derive
    from it, the classes in `_NOT_YET_ELECTRA_ERRORS` whose module is loaded)."""
    types = [ElectraError]
    for module_name, class_name in _NOT_YET_ELECTRA_ERRORS:
        module = sys.modules.get(module_name)
        if module is not None:
            types.append(getattr(module, class_name))
    return tuple(types)


def run_cli(prog: str, work: Callable[[], Optional[int]],
            interrupted: str = "interrupted") -> int:
    """Runs `work()` for the tool `prog`, turning user errors and Ctrl-C into exit statuses.

    Args:
        prog: str. How the tool is invoked (`run_pretraining.py`), the prefix of error lines.
        work: the tool's body; returns None (or 0) on success, or its own exit status.
        interrupted: str. What to print after `prog: ` on Ctrl-C.

    Returns:
        0 (or what `work` returned), EXIT_USER_ERROR after a user error, EXIT_INTERRUPTED.
    """
    try:
        return work() or 0
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 (re-raised below unless it is a user error)
        if not isinstance(e, user_error_types()):
            raise
        print(f"{prog}: error: {error_line(e, limit=None, whole=True)}", file=sys.stderr)
        return EXIT_USER_ERROR


def pretraining_config_from_args(args: argparse.Namespace) -> PretrainingConfig:
    """`--hparams` plus the `--model-size` shortcut (they must agree when both are given)."""
    hparams = parse_hparams(args.hparams)
    if args.model_size is not None:
        if hparams.get("model_size", args.model_size) != args.model_size:
            raise ConfigError(f"--model-size {args.model_size} contradicts hparam "
                              f"model_size={hparams['model_size']!r}")
        hparams["model_size"] = args.model_size
    return PretrainingConfig.create(args.model_name, args.data_dir, hparams)


def run_pretraining_cli(args: argparse.Namespace) -> int:
    """Runs `run_pretraining.py` (see `run_cli` for errors and exit codes)."""
    from electra_tf.training import trainer

    def work():
        results = trainer.run(pretraining_config_from_args(args), overwrite=args.overwrite)
        logger.info("results: %s", json.dumps(results, default=str, sort_keys=True))

    return run_cli("run_pretraining.py", work,
                   interrupted="interrupted; the latest checkpoint is kept")
