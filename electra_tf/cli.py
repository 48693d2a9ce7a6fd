"""Command-line glue shared by the scripts: building the config and turning errors into one line."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from electra_tf.config import ConfigError, PretrainingConfig, parse_hparams

logger = logging.getLogger("electra_tf")

EXIT_USER_ERROR = 2  # argparse's status for bad usage
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell convention


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
    """Runs `run_pretraining.py`; user errors become one line on stderr and exit code 2."""
    from electra_tf.data.pipeline import DataError
    from electra_tf.data.tfrecord_io import ManifestError
    from electra_tf.training import trainer
    from electra_tf.training.strategy import StrategyError
    from electra_tf.vocab import VocabError

    user_errors = (ConfigError, DataError, ManifestError, VocabError, StrategyError,
                   trainer.TrainingError)
    try:
        config = pretraining_config_from_args(args)
        results = trainer.run(config, overwrite=args.overwrite)
    except user_errors as e:
        print(f"run_pretraining.py: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("run_pretraining.py: interrupted; the latest checkpoint is kept", file=sys.stderr)
        return EXIT_INTERRUPTED
    logger.info("results: %s", json.dumps(results, default=str, sort_keys=True))
    return 0


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__
