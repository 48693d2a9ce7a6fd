"""Builds the small fine-tuning tasks from a corpus of real text, in the official file formats.

    python -m electra_tf.commands.build_corpus_tasks --output-dir DIR [--num-train 2000 --num-dev 500]

writes DIR/<task>/train.* and dev.* for each task (`electra_tf.finetuning.corpus_tasks` says
what each task is and its baseline); the same arguments give the same files.
"""

from __future__ import annotations

import argparse
import sys

from electra_tf.cli import run_cli
from electra_tf.finetuning import corpus_tasks

PROG = "python -m electra_tf.commands.build_corpus_tasks"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=corpus_tasks.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status: 0 done, 2 bad input or environment (one line on stderr), "
               "130 interrupted.")
    parser.add_argument("--output-dir", required=True, help="gets one directory per task")
    parser.add_argument("--corpus-dir", default=corpus_tasks.DEFAULT_CORPUS,
                        help="real text (default: %(default)s)")
    parser.add_argument("--num-train", type=int, default=2000, help="examples per task (train)")
    parser.add_argument("--num-dev", type=int, default=500, help="examples per task (dev)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default=",".join(corpus_tasks.TASKS),
                        help="comma-separated subset of %(default)s")
    return parser


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)

    def work():
        written = corpus_tasks.build(args.output_dir, args.corpus_dir, args.num_train,
                                     args.num_dev, args.seed,
                                     [t.strip() for t in args.tasks.split(",") if t.strip()])
        for task, directory in written.items():
            print(f"{task}: {directory}")

    return run_cli(prog, work)


if __name__ == "__main__":
    sys.exit(main())
