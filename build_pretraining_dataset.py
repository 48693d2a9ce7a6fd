"""Builds ELECTRA pretraining TFRecords from a directory of text files (one sentence per line).

With no flags: reads pretrain_data/corpus with pretrain_data/vocab.txt (fetching both first if
absent) and writes pretrain_data/pretrain_tfrecords/{pretrain_data,eval_data}.tfrecord-*-of-*
plus manifest.json. See electra_tf/data/builder.py for how this differs from the official script.
"""

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

from electra_tf.data import builder  # noqa: E402
from electra_tf.data.corpus import CorpusError  # noqa: E402
from electra_tf.vocab import VocabError  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", help=f"directory of text files, read recursively (default: {builder.DEFAULT_CORPUS_DIR}, fetched if missing)")
    p.add_argument("--vocab-file", help=f"WordPiece vocab to use (default: {builder.DEFAULT_VOCAB_FILE}); with --learn-vocab, where the learned vocab is written (default: <parent of --output-dir>/vocab.txt)")
    p.add_argument("--output-dir", default=builder.DEFAULT_OUTPUT_DIR, help="where shards and manifest.json are written (default: %(default)s)")
    p.add_argument("--max-seq-length", type=int, default=builder.DEFAULT_MAX_SEQ_LENGTH, help=f"example length incl. [CLS]/[SEP], >= {builder.MIN_MAX_SEQ_LENGTH} (default: %(default)s)")
    p.add_argument("--num-processes", type=int, default=1, help="worker processes; work is split by file (default: %(default)s)")
    p.add_argument("--blanks-separate-docs", action=argparse.BooleanOptionalAction, default=True, help="a blank line ends a document; with --no-blanks-separate-docs blank lines are skipped and each file is one document (default: on)")
    p.add_argument("--do-lower-case", dest="do_lower_case", action="store_true", default=True, help="lowercase the text before WordPiece (default)")
    p.add_argument("--no-lower-case", dest="do_lower_case", action="store_false", help="keep case (accents are then kept too, as in BERT)")
    p.add_argument("--strip-accents", "--do-strip-accents", dest="strip_accents", action="store_true", default=True, help="strip accents when lowercasing (default)")
    p.add_argument("--no-strip-accents", dest="strip_accents", action="store_false", help="keep accents")
    p.add_argument("--num-out-files", type=int, help=f"number of train shards (default: one per {builder.DEFAULT_BYTES_PER_SHARD >> 20} MiB of text, at least {builder.MIN_DEFAULT_SHARDS}, at most {builder.OFFICIAL_NUM_OUT_FILES}); shards that would be empty are not written")
    p.add_argument("--seed", type=int, default=builder.DEFAULT_SEED, help="seed of all random choices; same seed and inputs give identical files (default: %(default)s)")
    p.add_argument("--eval-fraction", type=float, default=builder.DEFAULT_EVAL_FRACTION, help="fraction of documents held out into eval_data.tfrecord-* shards; 0 disables (default: %(default)s)")
    p.add_argument("--learn-vocab", type=int, metavar="SIZE", help="learn a WordPiece vocab of SIZE tokens from the corpus (BERT special-token layout) instead of reading --vocab-file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset (manifest and shards only) in --output-dir, and an existing vocab file with --learn-vocab")
    return p.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger(builder.__name__)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    config = builder.BuildConfig(
        corpus_dir=args.corpus_dir, vocab_file=args.vocab_file, output_dir=args.output_dir,
        max_seq_length=args.max_seq_length, num_processes=args.num_processes,
        blanks_separate_docs=args.blanks_separate_docs, do_lower_case=args.do_lower_case,
        strip_accents=args.strip_accents, num_out_files=args.num_out_files, seed=args.seed,
        overwrite=args.overwrite, eval_fraction=args.eval_fraction, learn_vocab=args.learn_vocab,
        command=builder.format_command([sys.argv[0]] + list(argv)))
    try:
        builder.build_dataset(config)
    except (builder.BuildError, CorpusError, VocabError) as e:
        print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{os.path.basename(sys.argv[0])}: interrupted; partial shards were removed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
