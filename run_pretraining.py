"""Pretrain an ELECTRA model: `python run_pretraining.py --model-size small`.

Reads DATA_DIR/pretrain_tfrecords/ and DATA_DIR/vocab.txt (written by build_pretraining_dataset.py)
and writes checkpoints, TensorBoard events, eval_results.txt and SavedModels to
DATA_DIR/models/MODEL_NAME/. Re-running the same command resumes from the latest checkpoint.
"""

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Hparams (official names and defaults, e.g. learning_rate, num_train_steps, "
               "train_batch_size, mask_prob, generator_hidden_size, strategy, mixed_precision) "
               "are listed in docs/config.md.")
    parser.add_argument("--data-dir", default="pretrain_data",
                        help="directory with vocab.txt and pretrain_tfrecords/ (default: %(default)s)")
    parser.add_argument("--model-name", default="electra_small",
                        help="run name; outputs go to DATA_DIR/models/MODEL_NAME (default: %(default)s)")
    parser.add_argument("--hparams", default=None,
                        help="JSON object of hparam overrides, or the path of a .json file holding one")
    parser.add_argument("--model-size", choices=("small", "base", "large"), default=None,
                        help="shortcut for the model_size hparam (base/large also apply the paper's "
                             "training settings; explicit hparams win)")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete an existing run in DATA_DIR/models/MODEL_NAME and start afresh "
                             "(without it, an existing run is resumed)")
    parser.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    from electra_tf.cli import run_pretraining_cli  # heavy imports after --help

    return run_pretraining_cli(args)


if __name__ == "__main__":
    sys.exit(main())
