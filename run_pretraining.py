"""Pretrain an ELECTRA model: `python run_pretraining.py --model-size small`.

Reads DATA_DIR/pretrain_tfrecords/ and DATA_DIR/vocab.txt (written by build_pretraining_dataset.py,
whose manifest.json must match the vocab and max_seq_length) and writes checkpoints, TensorBoard
events, eval_results.txt and SavedModels (export/discriminator, export/generator) to
DATA_DIR/models/MODEL_NAME/. Re-running the same command resumes from the latest checkpoint;
nothing is ever deleted without --overwrite (not even in debug mode).

Examples:
  python run_pretraining.py --model-size small
  python run_pretraining.py --hparams '{"debug": true}'
  python run_pretraining.py --hparams '{"do_train": false, "do_eval": true}'
  python run_pretraining.py --hparams '{"do_train": false, "do_export": true}'
  python run_pretraining.py --hparams my_hparams.json --overwrite
"""

import argparse
import os
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Standard library only, so --help stays fast (run_pretraining_cli imports TensorFlow).
from electra_tf.cli import run_pretraining_cli, setup_logging  # noqa: E402
from electra_tf.config import HPARAM_NAMES  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    epilog = ("hparams (official configure_pretraining.py names; meanings and defaults in "
              "docs/config.md; an unknown key is an error):\n"
              + textwrap.fill(", ".join(HPARAM_NAMES), width=96, initial_indent="  ",
                              subsequent_indent="  ")
              + "\n\nexit status: 0 done, 2 bad input (one line on stderr), 130 interrupted "
                "(the latest checkpoint is kept).")
    parser = argparse.ArgumentParser(
        prog="run_pretraining.py", description=__doc__, epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="pretrain_data",
                        help="directory with vocab.txt and pretrain_tfrecords/ (default: %(default)s)")
    parser.add_argument("--model-name", default="electra_small",
                        help="run name; outputs go to DATA_DIR/models/MODEL_NAME (default: %(default)s)")
    parser.add_argument("--hparams", default=None,
                        help="JSON object of hparam overrides, or the path of a .json file holding "
                             "one (official names, listed below)")
    parser.add_argument("--model-size", choices=("small", "base", "large"), default=None,
                        help="shortcut for the model_size hparam (base/large also apply the paper's "
                             "training settings; explicit hparams win)")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete an existing run in DATA_DIR/models/MODEL_NAME and start afresh "
                             "(without it, an existing run is resumed); refuses a directory that "
                             "is not a run")
    parser.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_logging(args.quiet)
    return run_pretraining_cli(args)  # imports TensorFlow (after --help)


if __name__ == "__main__":
    sys.exit(main())
