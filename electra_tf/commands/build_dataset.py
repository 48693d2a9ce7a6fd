"""Builds ELECTRA pretraining TFRecords from a directory of corpus files (electra-build-dataset).

Inputs (--input-format): plain text, one sentence per line, a blank line between documents
(default); OpenWebText (a directory of tar archives such as OpenWebText's .xz files, one document
per member; also OpenWebText as downloaded, openwebtext.tar.xz); JSON Lines (one document per
line, its text under --jsonl-text-field). gzip, bzip2 and xz streams are recognised by their
bytes, whatever the file's name, and decompressed. Bad input (a truncated stream, a corrupt
archive member, a JSON line without the field or nested over 256 deep, invalid UTF-8) is skipped
and counted, naming the file and line or member, in manifest.json and inputs.jsonl; binary files
(more than 30% of their first 64 KiB invalid UTF-8, NUL or control bytes) and formats that are
not read (zip, zstd, UTF-16, ...) are skipped whole with a warning (--bad-input error stops
instead).

The examples are shuffled globally (a seeded external sort in bounded memory), so training
batches mix like a random draw whatever the number of shards.

Without TensorFlow (a JAX or PyTorch machine) the local build runs as well: --tokenizer auto
(the default) then tokenizes with Hugging Face tokenizers, giving the same shards
(--tokenizer; --learn-vocab and --runner still need TensorFlow).

With no flags: reads pretrain_data/corpus with pretrain_data/vocab.txt (fetching both first if
absent) and writes pretrain_data/pretrain_tfrecords/: pretrain_data.tfrecord-*-of-*, the held-out
eval_data.tfrecord-*-of-*, inputs.jsonl (per input file) and manifest.json (settings, counts,
checksums). Same inputs and settings give byte-identical shards, with any --num-processes. See
electra_tf/data/build/builder.py for the differences from the official script.

With --runner (an Apache Beam runner; pip install -e '.[beam]') the same dataset, byte for byte,
is built by a Beam pipeline, on this machine (DirectRunner) or a cluster; Beam's own pipeline
options go among the flags, e.g.
  --runner DirectRunner --direct_num_workers 2 --direct_running_mode multi_processing
  --runner DataflowRunner --project P --region R --temp_location gs://B/tmp \
      --corpus-dir gs://B/corpus --vocab-file gs://B/vocab.txt --output-dir gs://B/data
(docs/beam.md, "Building on a cluster", has the Dataflow, Spark and Flink commands).
"""

from __future__ import annotations

import argparse
import logging
import sys

from electra_tf import console
from electra_tf.cli import run_cli
from electra_tf.data.build import build_config as bc, build_plan as bp, builder as b
from electra_tf.data.build.beam_build import LOCAL_RUNNER, build_dataset_beam
from electra_tf.data.build.beam_runner import pipeline_options
from electra_tf.data.text.formats import DEFAULT_JSONL_TEXT_FIELD, INPUT_FORMATS
from electra_tf.data.text.tokenizer_choice import AUTO, CHOICES as TOKENIZER_CHOICES
from electra_tf.sources.fetch import default_data_ready, fetch_default_data

PROG = "electra-build-dataset"

logger = logging.getLogger(b.__name__)


def fetch_default_data_if_needed(args) -> None:
    """Fetches pretrain_data/ (corpus and vocab) when the default corpus is used and absent."""
    if args.corpus_dir is None and not default_data_ready(bc.DEFAULT_DATA_DIR):
        logger.info("default data not found in %s: fetching it first", bc.DEFAULT_DATA_DIR)
        fetch_default_data(data_dir=bc.DEFAULT_DATA_DIR)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status: 0 done, 2 bad input or environment (one line on stderr naming the "
               "problem and the file), 130 interrupted.")
    _add_input_flags(p.add_argument)
    _add_example_flags(p.add_argument)
    _add_output_flags(p.add_argument)
    console.add_verbosity_flags(p)
    return p


def _add_input_flags(arg) -> None:
    """What is read: the corpus, its format, the vocab (`arg`: the parser's add_argument)."""
    arg("--corpus-dir", help=f"directory of corpus files, read recursively; hidden files are "
        f"skipped (default: {bc.DEFAULT_CORPUS_DIR}, fetched first if missing)")
    arg("--input-format", choices=INPUT_FORMATS, default="text", help="text: one sentence per "
        "line, blank lines between documents; openwebtext: tar archives (e.g. OpenWebText's .xz "
        "files) of text files, one document per member, blank lines not document breaks; "
        "jsonl: JSON Lines, one document per line (default: %(default)s)")
    arg("--jsonl-text-field", default=DEFAULT_JSONL_TEXT_FIELD, help="with --input-format "
        "jsonl: the top-level key holding a document's text (default: %(default)s)")
    arg("--bad-input", choices=bc.BAD_INPUT_POLICIES, default="skip", help="skip: skip and count "
        "bad input (truncated or corrupt streams and archive members, JSON lines without the "
        "text field, invalid UTF-8 replaced, binary files and formats that are not read), naming "
        "file and line/member in manifest.json and inputs.jsonl; error: stop at the first "
        "(default: %(default)s)")
    arg("--vocab-file", help=f"WordPiece vocab (default: {bc.DEFAULT_VOCAB_FILE}); with "
        "--learn-vocab, where the learned vocab is written (default: "
        "<parent of --output-dir>/vocab.txt)")
    arg("--spm-model", metavar="FILE", help="a SentencePiece model (spm_train's .model) to "
        "tokenise with instead of a WordPiece --vocab-file: its pieces are the ids; [PAD] must "
        "be id 0 and [UNK], [CLS], [SEP], [MASK] pieces present (or <pad>, <unk>, <s>/<cls>, "
        "</s>/<sep>, <mask>); the model's own normalisation applies (--do-lower-case and "
        "--strip-accents do not); with --learn-spm, where the trained model is written "
        "(default: <parent of --output-dir>/spm.model)")


def _add_example_flags(arg) -> None:
    """Where the examples go and how they are made: length, processes, documents, casing."""
    arg("--output-dir", default=bc.DEFAULT_OUTPUT_DIR, help="where the shards and manifest.json go "
        "(default: %(default)s)")
    arg("--max-seq-length", type=int, default=bc.DEFAULT_MAX_SEQ_LENGTH, help="example length "
        f"incl. [CLS]/[SEP], at least {bc.MIN_MAX_SEQ_LENGTH} (default: %(default)s)")
    arg("--num-processes", type=int, default=1, help="worker processes, each taking whole files "
        "(then writing shards); with TensorFlow's tokenizer each pays a few seconds of its "
        "start-up; the output does not depend on it (default: %(default)s)")
    arg("--blanks-separate-docs", action=argparse.BooleanOptionalAction, default=True,
        help="a blank line ends a document; with --no-blanks-separate-docs blank lines are skipped "
        "and each file is one document (default: on)")
    arg("--do-lower-case", dest="do_lower_case", action="store_true", default=True,
        help="lowercase before WordPiece (default); with --learn-spm, train a case-folding "
        "SentencePiece model")
    arg("--no-lower-case", dest="do_lower_case", action="store_false",
        help="keep case (accents are then kept too, as in BERT)")
    arg("--strip-accents", "--do-strip-accents", dest="strip_accents", action="store_true",
        default=True, help="strip accents when lowercasing (default)")
    arg("--no-strip-accents", dest="strip_accents", action="store_false", help="keep accents")
    arg("--tokenizer", choices=TOKENIZER_CHOICES, default=AUTO, help="tensorflow: "
        "tensorflow-text in a TensorFlow graph (what fine-tuning and the exported serve_text "
        "run); tokenizers: without TensorFlow, BERT's BasicTokenizer in Python and WordPiece by "
        "Hugging Face tokenizers (a SentencePiece model by the sentencepiece package), the same "
        "ids and so byte-identical shards, except where a Greek capital sigma's final-sigma "
        "context holds a letter newer than TensorFlow's ICU (there it is BERT's); auto: "
        "tensorflow where TensorFlow imports, else tokenizers. manifest.json records which one "
        "built the data; one build never mixes them (default: %(default)s)")


def _add_output_flags(arg) -> None:
    """The shards: count, seed, shuffle memory, held-out share; --learn-vocab, --overwrite and
    the runner."""
    arg("--num-out-files", type=int, help=f"train shards (default: one per "
        f"{bp.DEFAULT_BYTES_PER_SHARD >> 20} MiB of text, at least {bp.MIN_DEFAULT_SHARDS}, at "
        f"most {bp.OFFICIAL_NUM_OUT_FILES}); shards that would be empty are not written")
    arg("--seed", type=int, default=bc.DEFAULT_SEED, help="seed of every random choice: "
        "packing and the global shuffle (the held-out split depends on the text only) "
        "(default: %(default)s)")
    arg("--shuffle-memory-mb", type=int, default=bc.DEFAULT_SHUFFLE_MEMORY_MB, help="memory per "
        "process for sorting one bucket of the global shuffle; larger corpora use more buckets, "
        "not more memory (default: %(default)s)")
    arg("--eval-fraction", type=float, default=bc.DEFAULT_EVAL_FRACTION, help="share of the "
        "corpus's tokens held out into eval_data.tfrecord-* shards, 0 for none: whole documents, "
        "chosen by a hash of their text (not their file), so a renamed, reordered or compressed "
        "copy holds out the same ones and copies of a document stay on one side; the share is "
        "within 10%% of this (or one document, whichever is more; manifest.json's eval_split "
        "records it). Builds before it held out this fraction of the documents, drawn per file "
        "(default: %(default)s)")
    arg("--learn-vocab", type=int, metavar="SIZE", help="learn a WordPiece vocab of SIZE tokens "
        "from the corpus ([PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103 when SIZE allows)")
    arg("--learn-spm", type=int, metavar="SIZE", help="train a SentencePiece (Unigram) model "
        "of at most SIZE pieces on the corpus (sentencepiece package; deterministic) and build "
        "with it: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, NFKC normalisation, case-folded "
        "unless --no-lower-case, accents kept")
    arg("--overwrite", action="store_true", help="replace the dataset in --output-dir (its "
        "manifest and shards; other files are kept), and an existing vocab with --learn-vocab or "
        "SentencePiece model with --learn-spm")
    arg("--runner", default=LOCAL_RUNNER, help="local: this machine's processes "
        "(--num-processes); or an Apache Beam runner (DirectRunner, DataflowRunner, SparkRunner, "
        "FlinkRunner, ...) building the same shards with Beam (needs the [beam] extra); any "
        "further flags are Beam pipeline options, passed through (default: %(default)s)")


def parse_args(argv, prog: str = PROG):
    """Returns (the build's flags, Beam pipeline options left over for --runner)."""
    p = build_parser(prog)
    args, beam_args = p.parse_known_args(argv)
    if beam_args and args.runner == LOCAL_RUNNER:
        p.error(f"unrecognized arguments: {' '.join(beam_args)} (Beam pipeline options need "
                f"--runner)")
    return args, beam_args


def main(argv=None, prog: str = PROG):
    argv = sys.argv[1:] if argv is None else argv
    args, beam_args = parse_args(argv, prog)
    quiet, verbose = args.quiet, args.verbose
    del args.quiet, args.verbose  # not build settings
    console.setup(quiet, verbose)  # `HH:MM:SS message` lines, as every tool
    settings = vars(args)
    runner = settings.pop("runner")
    if runner != LOCAL_RUNNER or args.tokenizer != "tokenizers":
        # Its C++ start-up lines hidden (unless --verbose); where it is not installed, the
        # Beam build fails naming it and --tokenizer auto uses tokenizers (`tokenizer_choice`).
        try:
            console.import_tensorflow()
        except ImportError:
            pass
    config = bc.BuildConfig(command=b.format_command([sys.argv[0]] + list(argv)), **settings)

    def work():
        bc.resolve_config(config)  # bad flags fail before any download
        if runner != LOCAL_RUNNER:
            _setup_beam(runner, beam_args)
        fetch_default_data_if_needed(args)
        if runner == LOCAL_RUNNER:
            b.build_dataset(config)
        else:
            build_dataset_beam(config, runner, beam_args)

    return run_cli(prog, work)


def _setup_beam(runner: str, beam_args) -> None:
    """Checks Beam is installed and knows `beam_args` (fail fast), and routes its log lines."""
    # Beam's PipelineOptions call logging.basicConfig(): a root handler of our own keeps it from
    # adding one that would print every line twice.
    logging.getLogger().addHandler(logging.NullHandler())
    beam_logger = logging.getLogger("apache_beam")  # job links, state changes, warnings
    beam_logger.setLevel(logging.WARNING if runner == "DirectRunner" else logging.INFO)
    pipeline_options(runner, beam_args)


if __name__ == "__main__":
    sys.exit(main())
