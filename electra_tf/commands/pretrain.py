"""Pretrain an ELECTRA model: `electra-pretrain --model-size small` (or `python run_pretraining.py`).

Reads DATA_DIR/pretrain_tfrecords/ and DATA_DIR/vocab.txt (or DATA_DIR/spm.model, the
SentencePiece model --learn-spm writes, when there is no vocab.txt; the vocab_file hparam names
either) (written by electra-build-dataset, whose manifest.json must match the vocabulary's
checksum and max_seq_length) and writes checkpoints, TensorBoard
events, eval_results.txt and SavedModels (export/discriminator/STEP, export/generator/STEP) to
DATA_DIR/models/MODEL_NAME/. Re-running the same command resumes from the latest checkpoint;
nothing is ever deleted without --overwrite (not even in debug mode). On SIGTERM (a preemptible
VM, a scheduler) the run saves a checkpoint at the next step boundary and exits with status 42;
the same command then resumes exactly.

Examples:
  electra-pretrain --model-size small
  electra-pretrain --hparams '{"debug": true}'
  electra-pretrain --hparams '{"do_train": false, "do_eval": true}'
  electra-pretrain --hparams '{"do_train": false, "do_export": true}'
  electra-pretrain --hparams my_hparams.json --overwrite
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from electra_tf import console
from electra_tf.cli import EXIT_PREEMPTED, run_cli
from electra_tf.commands import hparams_epilog, non_negative_int
from electra_tf.config import HPARAM_NAMES, PretrainingConfig
from electra_tf.config.hparam_checks import BACKENDS
from electra_tf.config.hparams import ConfigError, parse_hparams
from electra_tf.precision import AUTO_HELP

logger = logging.getLogger("electra_tf")

PROG = "electra-pretrain"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    epilog = hparams_epilog(
        "hparams (official configure_pretraining.py names; meanings and defaults in "
        "docs/config.md; an unknown key is an error)", HPARAM_NAMES,
        f"0 done, 2 bad input (one line on stderr), {EXIT_PREEMPTED} stopped by SIGTERM after "
        "saving a checkpoint (rerun the same command to resume), 130 interrupted (the latest "
        "checkpoint is kept).", AUTO_HELP)
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.replace("electra-pretrain", prog), epilog=epilog,
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
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the Keras backend to train with: tensorflow (the default; every "
                             "feature), jax or torch (no TensorFlow needed: a TPU VM, a GPU box; "
                             "pip install 'electra-tf[jax]'; docs/keras.md). Shortcut for the "
                             "backend hparam; a run resumes on the backend it started with")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete an existing run in DATA_DIR/models/MODEL_NAME and start afresh "
                             "(without it, an existing run is resumed); refuses a directory that "
                             "is not a run")
    parser.add_argument("--profile-steps", type=non_negative_int, default=0, metavar="N",
                        help="trace at least N training steps (whole loops, after the first loop, "
                             "which compiles) for TensorBoard's Profile tab (needs "
                             "tensorboard-plugin-profile to view); 0: off (default)")
    console.add_verbosity_flags(parser)
    return parser


def parse_args(argv=None, prog: str = PROG) -> argparse.Namespace:
    return build_parser(prog).parse_args(argv)


def pretraining_config_from_args(args: argparse.Namespace) -> PretrainingConfig:
    """`--hparams` plus the `--model-size` shortcut (they must agree when both are given)."""
    hparams = parse_hparams(args.hparams)
    if args.model_size is not None:
        if hparams.get("model_size", args.model_size) != args.model_size:
            raise ConfigError(f"--model-size {args.model_size} contradicts hparam "
                              f"model_size={hparams['model_size']!r}")
        hparams["model_size"] = args.model_size
    backend = getattr(args, "backend", None)
    if backend is not None:
        if hparams.get("backend", backend) != backend:
            raise ConfigError(f"--backend {backend} contradicts hparam "
                              f"backend={hparams['backend']!r}")
        hparams["backend"] = backend
    return PretrainingConfig.create(args.model_name, args.data_dir, hparams)


def run_pretraining_cli(args: argparse.Namespace, prog: str = "run_pretraining.py") -> int:
    """Runs the pretraining tool `prog` (see `run_cli` for errors and exit codes)."""
    def work():
        config = pretraining_config_from_args(args)
        # The learning probe is built here (it reads a fine-tuning task) and handed to the run,
        # which sees an observer only (training/ imports nothing of finetuning/).
        # lazy: after KERAS_BACKEND is set in main() (keras reads it once, at import)
        from electra_tf.finetuning import probe

        if config.backend == "tensorflow":
            # lazy: each backend's trainer imports its own framework
            from electra_tf.training.tf import trainer

            results = trainer.run(config, overwrite=args.overwrite,
                                  profile_steps=getattr(args, "profile_steps", 0),
                                  observers=probe.for_run)
        else:
            # lazy: each backend's trainer imports its own framework
            from electra_tf.training.portable import trainer as portable_trainer

            results = portable_trainer.run(config, overwrite=args.overwrite,
                                           observers=probe.for_run,
                                           profile_steps=getattr(args, "profile_steps", 0))
        logger.info("results: %s", json.dumps(results, default=str, sort_keys=True))

    return run_cli(prog, work,
                   interrupted="interrupted; the latest checkpoint is kept")


def main(argv=None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    console.setup(args.quiet, args.verbose)
    backend = selected_backend(args)
    console.use_backend(backend, command_line=argv is None)
    code = run_pretraining_cli(args, prog)
    if backend == "jax":
        from electra_tf.training.portable import hosts  # lazy: JAX is imported by JAX runs only

        if hosts.lost():  # JAX's exit would wait ~100 s for the lost host, then abort
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def selected_backend(args: argparse.Namespace) -> str:
    """--backend, else the backend hparam of --hparams, else tensorflow (a bad --hparams is
    reported later, with the rest of the config)."""
    if args.backend:
        return args.backend
    try:
        backend = parse_hparams(args.hparams).get("backend", "tensorflow")
    except (ValueError, OSError):
        return "tensorflow"
    return backend if backend in BACKENDS else "tensorflow"


if __name__ == "__main__":
    sys.exit(main())
