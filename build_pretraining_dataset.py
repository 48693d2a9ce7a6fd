"""Builds ELECTRA pretraining TFRecords from a directory of text files (one sentence per line,
a blank line between documents).

With no flags: reads pretrain_data/corpus with pretrain_data/vocab.txt (fetching both first if
absent) and writes pretrain_data/pretrain_tfrecords/: pretrain_data.tfrecord-*-of-*, the held-out
eval_data.tfrecord-*-of-*, and manifest.json (settings, counts, checksums). Same inputs and
settings give byte-identical shards. See electra_tf/data/builder.py for the differences from the
official script.
"""

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

from electra_tf.data import builder as b  # noqa: E402
from electra_tf.data.corpus import CorpusError  # noqa: E402
from electra_tf.data.fetch import FetchError  # noqa: E402
from electra_tf.vocab import VocabError  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    arg = p.add_argument
    arg("--corpus-dir", help=f"directory of text files, read recursively; hidden files are "
        f"skipped (default: {b.DEFAULT_CORPUS_DIR}, fetched first if missing)")
    arg("--vocab-file", help=f"WordPiece vocab (default: {b.DEFAULT_VOCAB_FILE}); with "
        "--learn-vocab, where the learned vocab is written (default: "
        "<parent of --output-dir>/vocab.txt)")
    arg("--output-dir", default=b.DEFAULT_OUTPUT_DIR, help="where the shards and manifest.json go "
        "(default: %(default)s)")
    arg("--max-seq-length", type=int, default=b.DEFAULT_MAX_SEQ_LENGTH, help="example length incl. "
        f"[CLS]/[SEP], at least {b.MIN_MAX_SEQ_LENGTH} (default: %(default)s)")
    arg("--num-processes", type=int, default=1, help="worker processes, each taking whole files; "
        "each pays a few seconds of TensorFlow start-up (default: %(default)s)")
    arg("--blanks-separate-docs", action=argparse.BooleanOptionalAction, default=True,
        help="a blank line ends a document; with --no-blanks-separate-docs blank lines are skipped "
        "and each file is one document (default: on)")
    arg("--do-lower-case", dest="do_lower_case", action="store_true", default=True,
        help="lowercase before WordPiece (default)")
    arg("--no-lower-case", dest="do_lower_case", action="store_false",
        help="keep case (accents are then kept too, as in BERT)")
    arg("--strip-accents", "--do-strip-accents", dest="strip_accents", action="store_true",
        default=True, help="strip accents when lowercasing (default)")
    arg("--no-strip-accents", dest="strip_accents", action="store_false", help="keep accents")
    arg("--num-out-files", type=int, help=f"train shards (default: one per "
        f"{b.DEFAULT_BYTES_PER_SHARD >> 20} MiB of text, at least {b.MIN_DEFAULT_SHARDS}, at most "
        f"{b.OFFICIAL_NUM_OUT_FILES}); shards that would be empty are not written")
    arg("--seed", type=int, default=b.DEFAULT_SEED, help="seed of every random choice "
        "(default: %(default)s)")
    arg("--eval-fraction", type=float, default=b.DEFAULT_EVAL_FRACTION, help="fraction of "
        "documents held out into eval_data.tfrecord-* shards, 0 for none (default: %(default)s)")
    arg("--learn-vocab", type=int, metavar="SIZE", help="learn a WordPiece vocab of SIZE tokens "
        "from the corpus ([PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103 when SIZE allows)")
    arg("--overwrite", action="store_true", help="replace the dataset in --output-dir (its "
        "manifest and shards; other files are kept), and an existing vocab with --learn-vocab")
    return p.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in (b.__name__, "electra_tf.data.fetch"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    config = b.BuildConfig(command=b.format_command([sys.argv[0]] + list(argv)), **vars(args))
    try:
        b.build_dataset(config)
    except (b.BuildError, CorpusError, VocabError, FetchError, OSError) as e:
        print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{os.path.basename(sys.argv[0])}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
