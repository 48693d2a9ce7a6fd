"""Builds ELECTRA pretraining TFRecords from a directory of corpus files.

Inputs (--input-format): plain text, one sentence per line, a blank line between documents
(default); OpenWebText (a directory of tar archives such as OpenWebText's .xz files, one document
per member); JSON Lines (one document per line, its text under --jsonl-text-field). Files ending
in .gz, .bz2 or .xz are decompressed as streams. Bad input (a truncated stream, a corrupt archive
member, a JSON line without the field, invalid UTF-8) is skipped and counted, naming the file and
line or member, in manifest.json and inputs.jsonl (--bad-input error stops instead).

The examples are shuffled globally (a seeded external sort in bounded memory), so training
batches mix like a random draw whatever the number of shards.

With no flags: reads pretrain_data/corpus with pretrain_data/vocab.txt (fetching both first if
absent) and writes pretrain_data/pretrain_tfrecords/: pretrain_data.tfrecord-*-of-*, the held-out
eval_data.tfrecord-*-of-*, inputs.jsonl (per input file) and manifest.json (settings, counts,
checksums). Same inputs and settings give byte-identical shards, with any --num-processes. See
electra_tf/data/builder.py for the differences from the official script.
"""

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

from electra_tf.data import builder as b  # noqa: E402
from electra_tf.data.corpus import CorpusError  # noqa: E402
from electra_tf.sources.fetch import FetchError, default_data_ready, fetch_default_data  # noqa: E402
from electra_tf.data.formats import DEFAULT_JSONL_TEXT_FIELD, INPUT_FORMATS  # noqa: E402
from electra_tf.vocab import VocabError  # noqa: E402

logger = logging.getLogger(b.__name__)


def fetch_default_data_if_needed(args) -> None:
    """Fetches pretrain_data/ (corpus and vocab) when the default corpus is used and absent."""
    if args.corpus_dir is None and not default_data_ready(b.DEFAULT_DATA_DIR):
        logger.info("default data not found in %s: fetching it first", b.DEFAULT_DATA_DIR)
        fetch_default_data(data_dir=b.DEFAULT_DATA_DIR)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    arg = p.add_argument
    arg("--corpus-dir", help=f"directory of corpus files, read recursively; hidden files are "
        f"skipped (default: {b.DEFAULT_CORPUS_DIR}, fetched first if missing)")
    arg("--input-format", choices=INPUT_FORMATS, default="text", help="text: one sentence per "
        "line, blank lines between documents; openwebtext: tar archives (e.g. OpenWebText's .xz "
        "files) of text files, one document per member, blank lines not document breaks; "
        "jsonl: JSON Lines, one document per line (default: %(default)s)")
    arg("--jsonl-text-field", default=DEFAULT_JSONL_TEXT_FIELD, help="with --input-format "
        "jsonl: the top-level key holding a document's text (default: %(default)s)")
    arg("--bad-input", choices=b.BAD_INPUT_POLICIES, default="skip", help="skip: skip and count "
        "bad input (truncated or corrupt streams and archive members, JSON lines without the "
        "text field, invalid UTF-8 replaced), naming file and line/member in manifest.json and "
        "inputs.jsonl; error: stop at the first (default: %(default)s)")
    arg("--vocab-file", help=f"WordPiece vocab (default: {b.DEFAULT_VOCAB_FILE}); with "
        "--learn-vocab, where the learned vocab is written (default: "
        "<parent of --output-dir>/vocab.txt)")
    arg("--output-dir", default=b.DEFAULT_OUTPUT_DIR, help="where the shards and manifest.json go "
        "(default: %(default)s)")
    arg("--max-seq-length", type=int, default=b.DEFAULT_MAX_SEQ_LENGTH, help="example length incl. "
        f"[CLS]/[SEP], at least {b.MIN_MAX_SEQ_LENGTH} (default: %(default)s)")
    arg("--num-processes", type=int, default=1, help="worker processes, each taking whole files "
        "(then writing shards); each pays a few seconds of TensorFlow start-up; the output does "
        "not depend on it (default: %(default)s)")
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
    arg("--seed", type=int, default=b.DEFAULT_SEED, help="seed of every random choice: "
        "packing, held-out split and the global shuffle (default: %(default)s)")
    arg("--shuffle-memory-mb", type=int, default=b.DEFAULT_SHUFFLE_MEMORY_MB, help="memory per "
        "process for sorting one bucket of the global shuffle; larger corpora use more buckets, "
        "not more memory (default: %(default)s)")
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
    data_logger = logging.getLogger("electra_tf.data")  # the builder's modules and the fetch
    data_logger.addHandler(handler)
    data_logger.setLevel(logging.INFO)
    config = b.BuildConfig(command=b.format_command([sys.argv[0]] + list(argv)), **vars(args))
    try:
        b.resolve_config(config)  # bad flags fail before any download
        fetch_default_data_if_needed(args)
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
