"""The dataset build's settings: `BuildConfig`, its defaults, and `resolve_config`.

`BuildConfig` holds the flags of `build_pretraining_dataset.py`; `resolve_config` fills in the
default paths (the official DATA_DIR layout: vocab.txt and pretrain_tfrecords/ side by side) and
checks every setting, raising a `BuildError` that names the flag. Both engines resolve a config
the same way: the local build (`builder.build_dataset`) and the Beam build
(`beam_build.build_dataset_beam`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from electra_tf.data.text.formats import DEFAULT_JSONL_TEXT_FIELD, INPUT_FORMATS
from electra_tf.data.text.spm_learning import SPECIAL_PIECES as SPM_SPECIAL_PIECES
from electra_tf.data.text.tokenizer_choice import AUTO, resolve_tokenizer
from electra_tf.errors import BuildError, is_utf8_path, shown_path

DEFAULT_DATA_DIR = "pretrain_data"  # official DATA_DIR layout: vocab.txt, pretrain_tfrecords/
DEFAULT_CORPUS_DIR = os.path.join(DEFAULT_DATA_DIR, "corpus")
DEFAULT_VOCAB_FILE = os.path.join(DEFAULT_DATA_DIR, "vocab.txt")
DEFAULT_OUTPUT_DIR = os.path.join(DEFAULT_DATA_DIR, "pretrain_tfrecords")
DEFAULT_MAX_SEQ_LENGTH = 128  # official --max-seq-length
DEFAULT_SEED = 0
DEFAULT_EVAL_FRACTION = 0.01
DEFAULT_SHUFFLE_MEMORY_MB = 128
MIN_SHUFFLE_MEMORY_MB = 1
BAD_INPUT_POLICIES = ("skip", "error")
# The smallest max_seq_length accepted: room for [CLS] a [SEP] b [SEP] with a few tokens each
# (the official random target alone needs >= 5).
MIN_MAX_SEQ_LENGTH = 8
# A sanity bound (the model's position table is 512 by default); catches typos before they
# allocate huge buffers.
MAX_MAX_SEQ_LENGTH = 65536
PROGRESS_INTERVAL_SECONDS = 2.0
# --learn-spm's default output, in DATA_DIR beside vocab.txt (the trainer looks there).
SPM_MODEL_NAME = "spm.model"


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Settings of one dataset build (the CLI flags of `build_pretraining_dataset.py`).

    Attributes:
        corpus_dir: directory of corpus files, read recursively (None: `pretrain_data/corpus`).
        vocab_file: vocab to read; with `learn_vocab`, where to write the learned vocab. None
            means `pretrain_data/vocab.txt` (read), or `<parent of output_dir>/vocab.txt`
            (learned: the official DATA_DIR/vocab.txt layout). Once resolved, the vocabulary the
            build tokenises with, either kind: with `spm_model` or `learn_spm`, the model's path.
        spm_model: a SentencePiece model to tokenise with instead of a WordPiece vocab; with
            `learn_spm`, where to write the learned model (None: `<parent of output_dir>/spm.model`).
        output_dir: where shards and manifest.json go (default `pretrain_data/pretrain_tfrecords`).
        max_seq_length: example length incl. [CLS]/[SEP] (official default 128).
        num_processes: worker processes.
        blanks_separate_docs: `text` input: a blank line ends a document (else blank lines are
            skipped and each file is one document).
        do_lower_case: lowercase (and, with strip_accents, strip accents) before WordPiece.
        strip_accents: strip accents (only has an effect with do_lower_case, as in BERT).
        num_out_files: number of train shards; None picks a default from the corpus size.
        seed: seed of every random draw (packing, shuffle; the held-out split has none).
        overwrite: replace an existing dataset in output_dir (and an existing learned vocab).
        eval_fraction: share of the tokens held out into eval shards, in [0, 1) (`split`).
        learn_vocab: learn a WordPiece vocab of this size from the corpus instead of reading one.
        learn_spm: train a SentencePiece model of this size on the corpus (`spm_learning`).
        input_format: "text", "openwebtext" or "jsonl" (see `formats`).
        jsonl_text_field: `jsonl` input: the key of a document's text.
        bad_input: "skip" (count and list input problems) or "error" (stop at the first).
        shuffle_memory_mb: memory per process for sorting one shuffle bucket.
        tokenizer: "auto", "tensorflow" or "tokenizers" (`tokenizer_choice`); resolved, the
            one the build runs ("tensorflow" or "tokenizers").
        command: the command line, recorded in the manifest.
        progress_interval: seconds between progress lines.
    """

    corpus_dir: Optional[str] = None
    vocab_file: Optional[str] = None
    output_dir: str = DEFAULT_OUTPUT_DIR
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    num_processes: int = 1
    blanks_separate_docs: bool = True
    do_lower_case: bool = True
    strip_accents: bool = True
    num_out_files: Optional[int] = None
    seed: int = DEFAULT_SEED
    overwrite: bool = False
    eval_fraction: float = DEFAULT_EVAL_FRACTION
    learn_vocab: Optional[int] = None
    spm_model: Optional[str] = None
    learn_spm: Optional[int] = None
    input_format: str = "text"
    jsonl_text_field: str = DEFAULT_JSONL_TEXT_FIELD
    bad_input: str = "skip"
    shuffle_memory_mb: int = DEFAULT_SHUFFLE_MEMORY_MB
    tokenizer: str = AUTO
    command: Optional[str] = None
    progress_interval: float = PROGRESS_INTERVAL_SECONDS


def resolve_config(config: BuildConfig) -> BuildConfig:
    """Fills path defaults and checks every setting; raises BuildError naming a bad one."""
    if not MIN_MAX_SEQ_LENGTH <= config.max_seq_length <= MAX_MAX_SEQ_LENGTH:
        raise BuildError(
            f"--max-seq-length must be between {MIN_MAX_SEQ_LENGTH} and {MAX_MAX_SEQ_LENGTH}, "
            f"got {config.max_seq_length}")
    if config.num_processes < 1:
        raise BuildError(f"--num-processes must be >= 1, got {config.num_processes}")
    if config.num_out_files is not None and config.num_out_files < 1:
        raise BuildError(f"--num-out-files must be >= 1, got {config.num_out_files}")
    if not 0.0 <= config.eval_fraction < 1.0:
        raise BuildError(f"--eval-fraction must be in [0, 1), got {config.eval_fraction}")
    if config.seed < 0:
        raise BuildError(f"--seed must be >= 0, got {config.seed}")
    if config.learn_vocab is not None and config.learn_vocab < 1:
        raise BuildError(f"--learn-vocab must be a positive vocab size, got {config.learn_vocab}")
    if config.learn_spm is not None and config.learn_spm <= len(SPM_SPECIAL_PIECES):
        raise BuildError(f"--learn-spm must be a vocab size above {len(SPM_SPECIAL_PIECES)} (the "
                         f"special tokens), got {config.learn_spm}")
    sentencepiece = config.spm_model is not None or config.learn_spm is not None
    if sentencepiece and (config.vocab_file is not None or config.learn_vocab is not None):
        raise BuildError("--spm-model / --learn-spm (SentencePiece) and --vocab-file / "
                         "--learn-vocab (WordPiece) exclude each other: give one vocabulary")
    if config.input_format not in INPUT_FORMATS:
        raise BuildError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, got "
                         f"{config.input_format!r}")
    if not config.jsonl_text_field:
        raise BuildError("--jsonl-text-field must not be empty")
    if config.bad_input not in BAD_INPUT_POLICIES:
        raise BuildError(f"--bad-input must be one of {', '.join(BAD_INPUT_POLICIES)}, got "
                         f"{config.bad_input!r}")
    if config.shuffle_memory_mb < MIN_SHUFFLE_MEMORY_MB:
        raise BuildError(f"--shuffle-memory-mb must be >= {MIN_SHUFFLE_MEMORY_MB}, got "
                         f"{config.shuffle_memory_mb}")
    corpus_dir = config.corpus_dir or DEFAULT_CORPUS_DIR
    vocab_file, spm_model = config.vocab_file, config.spm_model
    if sentencepiece:
        if spm_model is None:  # learned: beside the tfrecords dir, where the trainer looks
            spm_model = os.path.join(_data_dir(config.output_dir), SPM_MODEL_NAME)
        vocab_file = spm_model
    elif vocab_file is None:
        if config.learn_vocab is not None:  # official layout: DATA_DIR/vocab.txt
            vocab_file = os.path.join(_data_dir(config.output_dir), "vocab.txt")
        else:
            vocab_file = DEFAULT_VOCAB_FILE
    out, corpus = os.path.realpath(config.output_dir), os.path.realpath(corpus_dir)
    if out == corpus or out.startswith(corpus + os.sep):
        raise BuildError(
            f"--output-dir {shown_path(config.output_dir)} must not be inside --corpus-dir "
            f"{shown_path(corpus_dir)}")
    if os.path.exists(config.output_dir) and not os.path.isdir(config.output_dir):
        raise BuildError(f"--output-dir {shown_path(config.output_dir)} exists and is not a "
                         "directory")
    if not is_utf8_path(config.output_dir):
        raise BuildError(f"--output-dir {shown_path(config.output_dir)}: TensorFlow writes and "
                         "reads only file names that are valid UTF-8; choose another directory")
    return dataclasses.replace(config, corpus_dir=corpus_dir, vocab_file=vocab_file,
                               spm_model=spm_model, tokenizer=resolve_tokenizer(config.tokenizer))


def _data_dir(output_dir: str) -> str:
    """The parent of --output-dir (DATA_DIR in the official layout DATA_DIR/pretrain_tfrecords)."""
    output_dir = os.path.normpath(output_dir)
    data_dir = os.path.dirname(output_dir)
    if not data_dir or os.path.basename(output_dir) in (".", ".."):
        data_dir = os.path.dirname(os.path.abspath(output_dir))
    return data_dir
