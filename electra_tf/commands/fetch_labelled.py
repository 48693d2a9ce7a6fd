"""Fetches the labelled fine-tuning sets (BBC News, Pang & Lee) as generic classification tasks.

    python -m electra_tf.commands.fetch_labelled                    # all sets, into ./pretrain_data
    python -m electra_tf.commands.fetch_labelled --data-dir DIR --overwrite bbc_news

Writes DATA_DIR/finetuning_data/NAME/{train,dev,test}.tsv and manifest.json for each set
(`electra_tf.sources.labelled` says where the sets come from and how they are split).
"""

from __future__ import annotations

import argparse
import json
import sys

from electra_tf.cli import run_cli
from electra_tf.sources.labelled import fetch_labelled_data

PROG = "python -m electra_tf.commands.fetch_labelled"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Fetch the labelled fine-tuning sets (BBC News, Pang & Lee) into "
                    "DATA_DIR/finetuning_data/NAME/{train,dev,test}.tsv.",
        epilog="exit status: 0 done, 2 bad input or environment (one line on stderr), "
               "130 interrupted.")
    parser.add_argument("names", nargs="*", help="sets to fetch (default: all)")
    parser.add_argument("--data-dir", default="pretrain_data", help="default: %(default)s")
    parser.add_argument("--cache-dir", default=None, help="download cache (default: as the corpus fetch)")
    parser.add_argument("--overwrite", action="store_true", help="replace differing TSVs")
    return parser


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)

    def work():
        results = fetch_labelled_data(args.data_dir, args.names or None, args.cache_dir,
                                      args.overwrite)
        for result in results.values():
            print(f"{result.name}: {result.directory} {json.dumps(result.counts, sort_keys=True)}")

    return run_cli(prog, work)


if __name__ == "__main__":
    sys.exit(main())
