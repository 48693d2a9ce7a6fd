"""Builds the pretraining dataset: corpus files -> globally shuffled TFRecord shards + manifest.

The steps, each in its own module:
1. read (`formats`, `corpus`): plain text, gzip/bzip2/xz streams, OpenWebText archives or JSON
   Lines become document lines; bad input is a counted skip (or, with `bad_input="error"`, an
   error) naming the file and line or member;
2. pack (`packing`, `example_builder`): per file, tokenised in batches (`tokenization`) and
   packed by the official state machine, seeded per file, so examples depend only on (file,
   seed, settings);
3. shuffle (`shuffle`): each example's seeded key places it in one global random order; a
   bounded-memory external sort (scatter to bucket files, sort each bucket) writes the shards
   as consecutive key ranges, so every shard, and every stretch of one, is a random sample of
   the corpus: training batches mix like a random draw whatever the shard count;
4. install (`output`, `manifest`): shards renamed into place, `inputs.jsonl` (per input file:
   sizes, documents, examples, problems), `manifest.json` last.
Work runs in `num_processes` processes (`workers`, `build_worker`): files are packed in tasks
pulled from a queue, then shards are written per unit of buckets.

Differences from the official `build_pretraining_dataset.py` (each one deliberate):
* Determinism: every draw is seeded (`packing`); same inputs and seed give byte-identical
  shards, and the shards do not depend on `num_processes` (the official builder is unseeded).
* Mixing: the official builder writes each job's examples round-robin into its own shards in
  corpus order and relies on its fixed 1000 shards and the reader's shuffles to mix; here the
  examples are shuffled globally (above), for any shard count.
* Shards: `num_out_files` is configurable (official: fixed 1000). Default: one shard per
  `DEFAULT_BYTES_PER_SHARD` of corpus text, at least `MIN_DEFAULT_SHARDS`, at most 1000. Shards
  that would be empty are not written and the rest are numbered consecutively.
* Held-out split: documents keyed by their text and taken until they hold `eval_fraction` of
  the tokens (`split`; a first pass over the corpus) go to `eval_data.tfrecord-{i}-of-{m}`,
  m = ceil(num_out_files * eval_fraction). The official builder has no held-out split.
* Input formats beyond plain text, and counted bad input (`formats`).
* Safety: nothing is replaced without `overwrite`, temporaries are hidden, the manifest is last
  (`output`). The default data is fetched by `build_pretraining_dataset.py`, not here.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import shlex
import shutil
import sys
import time
from datetime import datetime, timezone
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from electra_tf import atomic
from electra_tf.data import corpus as corpus_lib
from electra_tf.data.build_worker import (BuildError, BuildWorker, WorkerSpec, inputs_part_path,
                                         write_error)
from electra_tf.data.corpus import (WHOLE_FILE_PROBLEMS, CorpusFile, format_problem,
                                    list_corpus_files)
from electra_tf.data.formats import (DEFAULT_JSONL_TEXT_FIELD, INPUT_FORMATS, InputSettings,
                                     estimated_text_bytes, is_compressed, is_plain_text)
from electra_tf.data.manifest import build_manifest, merge_pack_results
from electra_tf.data.output import (INPUTS_NAME, check_output_dir, install_shards,
                                    remove_temporaries, temp_prefix)
from electra_tf.data.packing import PackSettings
from electra_tf.data.shuffle import BucketLayout, ShuffleError
from electra_tf.data.split import SplitPlan, no_split_summary, plan_split, split_warning
from electra_tf.data.tfrecord_io import EVAL_PREFIX, MANIFEST_NAME, TRAIN_PREFIX, shard_name
from electra_tf.data.workers import Progress, WorkerFailed, WorkerPool
from electra_tf.errors import is_utf8_path, shown_path
from electra_tf.locking import DirectoryLock
from electra_tf.progress import RateEta
from electra_tf.data.spm_learning import SPECIAL_PIECES as SPM_SPECIAL_PIECES
from electra_tf.sentencepiece_vocab import SENTENCEPIECE
from electra_tf.vocab import load_vocab

__all__ = ["BuildConfig", "BuildError", "build_dataset", "resolve_config", "format_command"]

logger = logging.getLogger(__name__)

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
OFFICIAL_NUM_OUT_FILES = 1000
DEFAULT_BYTES_PER_SHARD = 8 << 20
MIN_DEFAULT_SHARDS = 4
PROGRESS_INTERVAL_SECONDS = 2.0
# Record bytes per byte of text, for planning shuffle buckets (~1.1 measured at length 128;
# padding of short examples raises it). Only sets bucket sizes; memory is bounded regardless.
RECORD_BYTES_PER_TEXT_BYTE = 1.25
TASKS_PER_PROCESS = 8  # packing tasks per process: small enough to balance, large to amortise
MAX_TASK_BYTES = 64 << 20
# --learn-spm's default output, in DATA_DIR beside vocab.txt (the trainer looks there).
SPM_MODEL_NAME = "spm.model"
MAX_SHOWN_PROBLEMS = 3  # input problems named in a warning or error line


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
    command: Optional[str] = None
    progress_interval: float = PROGRESS_INTERVAL_SECONDS


def default_num_out_files(corpus_bytes: int) -> int:
    """Default train shard count: one per 8 MiB of text, >= 4, <= 1000."""
    wanted = max(MIN_DEFAULT_SHARDS, math.ceil(corpus_bytes / DEFAULT_BYTES_PER_SHARD))
    return min(OFFICIAL_NUM_OUT_FILES, wanted)


def num_eval_files(num_out_files: int, eval_fraction: float) -> int:
    """Eval shard count: proportional to the train shards, at least one (0 if no split)."""
    if eval_fraction <= 0:
        return 0
    return max(1, math.ceil(num_out_files * eval_fraction))


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
                               spm_model=spm_model)


def _data_dir(output_dir: str) -> str:
    """The parent of --output-dir (DATA_DIR in the official layout DATA_DIR/pretrain_tfrecords)."""
    output_dir = os.path.normpath(output_dir)
    data_dir = os.path.dirname(output_dir)
    if not data_dir or os.path.basename(output_dir) in (".", ".."):
        data_dir = os.path.dirname(os.path.abspath(output_dir))
    return data_dir


def _prepare_learned_file(config: BuildConfig, files: Sequence[CorpusFile], flag: str,
                          path: str, what: str, pass_it: str) -> None:
    """Checks that `flag` (--learn-vocab / --learn-spm) can read the corpus and may write `path`
    (the file it learns: `what`), and makes `path`'s directory. `pass_it`: how a user gives such a
    file instead (the messages of both flags have one shape)."""
    not_plain = next((f for f in files if is_compressed(f.path) or not is_plain_text(f.path)),
                     None) if config.input_format == "text" else None
    if config.input_format != "text" or not_plain is not None:
        shown = f" ({shown_path(not_plain.path)} is not)" if not_plain is not None else ""
        raise BuildError(f"{flag} reads uncompressed plain-text corpora only{shown}; {pass_it}")
    if os.path.exists(path) and not config.overwrite:
        raise BuildError(f"{what} {path} exists; pass --overwrite to replace it with a learned "
                         f"{'vocab' if flag == '--learn-vocab' else 'one'}, or give another path "
                         f"with {'--vocab-file' if flag == '--learn-vocab' else '--spm-model'}")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)


def learn_corpus_vocab(config: BuildConfig, files: Sequence[CorpusFile]) -> None:
    """--learn-vocab: learns a WordPiece vocab of the corpus into `config.vocab_file` (both
    engines: the Beam build learns it on the launcher, before the pipeline)."""
    _prepare_learned_file(config, files, "--learn-vocab", config.vocab_file, "vocab file",
                          "learn the vocab from such a corpus and pass it with --vocab-file")
    from electra_tf.data.vocab_learning import learn_vocab

    logger.info("learning a WordPiece vocab of %d tokens from %d files into %s",
                config.learn_vocab, len(files), config.vocab_file)
    try:
        learn_vocab([f.path for f in files], config.learn_vocab, config.vocab_file,
                    do_lower_case=config.do_lower_case, strip_accents=config.strip_accents)
    except ValueError as e:  # e.g. a size too small for the specials and the alphabet
        raise BuildError(f"--learn-vocab {config.learn_vocab}: {e}") from e


def learn_corpus_spm(config: BuildConfig, files: Sequence[CorpusFile]) -> None:
    """--learn-spm: trains a SentencePiece model on the corpus into `config.spm_model`."""
    _prepare_learned_file(config, files, "--learn-spm", config.spm_model, "SentencePiece model",
                          "train the model on such a corpus and pass it with --spm-model")
    from electra_tf.data.spm_learning import learn_spm

    logger.info("training a SentencePiece model of %d pieces on %d files into %s",
                config.learn_spm, len(files), config.spm_model)
    try:
        learn_spm([f.path for f in files], config.learn_spm, config.spm_model,
                  do_lower_case=config.do_lower_case)
    except ValueError as e:
        raise BuildError(f"--learn-spm {config.learn_spm}: {e}") from e


def load_build_vocab(config: BuildConfig):
    """The resolved config's vocabulary; `--spm-model` must name a SentencePiece model."""
    vocab = load_vocab(config.vocab_file)
    if config.spm_model is not None and vocab.kind != SENTENCEPIECE:
        raise BuildError(f"--spm-model {config.spm_model} is not a SentencePiece model (a "
                         "WordPiece vocab.txt goes to --vocab-file)")
    return vocab


class Plan(NamedTuple):
    """How the work is split, and where its temporary files go."""

    num_processes: int
    num_out_files: int
    num_eval_files: int
    tasks: List[Tuple[int, List[CorpusFile]]]  # packing tasks: consecutive files by relpath
    layouts: Dict[str, BucketLayout]  # per split
    shard_tmp: Dict[str, Dict[int, str]]  # per split: shard index -> temporary path
    shuffle_dir: str
    inputs_tmp: str

    def temp_paths(self) -> List[str]:
        return ([p for paths in self.shard_tmp.values() for p in paths.values()]
                + [self.shuffle_dir, self.inputs_tmp])


def pack_tasks(files: Sequence[CorpusFile], num_processes: int) -> List[List[CorpusFile]]:
    """Cuts the files (in relpath order) into consecutive runs of about equal text size.

    About TASKS_PER_PROCESS tasks per process (at most MAX_TASK_BYTES each), so the processes
    pulling them finish together; a file is never split.
    """
    sizes = [estimated_text_bytes(f) for f in files]
    target = max(1, min(MAX_TASK_BYTES, sum(sizes) // (TASKS_PER_PROCESS * num_processes)))
    tasks, current, current_bytes = [], [], 0
    for corpus_file, size in zip(files, sizes):
        current.append(corpus_file)
        current_bytes += size
        if current_bytes >= target:
            tasks.append(current)
            current, current_bytes = [], 0
    if current:
        tasks.append(current)
    return tasks


def make_plan(config: BuildConfig, files: Sequence[CorpusFile]) -> Plan:
    text_bytes = sum(estimated_text_bytes(f) for f in files)
    num_out = config.num_out_files or default_num_out_files(text_bytes)
    num_eval = num_eval_files(num_out, config.eval_fraction)
    tasks = pack_tasks(files, config.num_processes)
    memory = config.shuffle_memory_mb << 20
    record_bytes = text_bytes * RECORD_BYTES_PER_TEXT_BYTE
    layouts = {"train": BucketLayout.plan(num_out, record_bytes * (1 - config.eval_fraction),
                                          memory)}
    if num_eval:
        layouts["eval"] = BucketLayout.plan(num_eval, record_bytes * config.eval_fraction, memory)
    prefix = temp_prefix(config.output_dir)
    shard_tmp = {split: {i: prefix + shard_name(name, i, n) for i in range(n)}
                 for split, name, n in (("train", TRAIN_PREFIX, num_out),
                                        ("eval", EVAL_PREFIX, num_eval)) if n}
    return Plan(max(1, min(config.num_processes, len(tasks))), num_out, num_eval,
                list(enumerate(tasks)), layouts, shard_tmp, prefix + "shuffle",
                prefix + INPUTS_NAME)


def _describe_reading(label: str, num_files: int, text_mb: float):
    rate = RateEta("MB", scale=1e6)  # of text read; the ETA is for this pass

    def describe(totals: Dict[str, int]) -> str:
        examples = f", examples {totals.get('examples', 0)}" if label == "progress" else ""
        return (f"{label}: files {totals.get('files', 0)}/{num_files}, "
                f"{totals.get('bytes', 0) / 1e6:.1f}/~{text_mb:.1f} MB of text "
                f"({rate.describe(totals.get('bytes', 0), text_mb * 1e6)}), "
                f"documents {totals.get('documents', 0)}{examples}")
    return describe


def _survey(pool: WorkerPool, config: BuildConfig, plan: Plan, num_files: int,
            text_mb: float) -> Optional[SplitPlan]:
    """The held-out split's first pass (each document's key and tokens) and its plan; None
    without a split."""
    if config.eval_fraction <= 0:
        return None
    logger.info("surveying the documents for the held-out split (--eval-fraction %g of the "
                "tokens)", config.eval_fraction)
    surveys = pool.map("survey", plan.tasks, Progress(
        _describe_reading("survey", num_files, text_mb), config.progress_interval))
    return plan_split([item for task in surveys for item in task], config.eval_fraction)


def build_dataset(config: BuildConfig) -> dict:
    """Builds globally shuffled TFRecord shards, `inputs.jsonl` and `manifest.json`.

    Args:
        config: BuildConfig.

    Returns:
        The manifest (also written to `<output_dir>/manifest.json`).

    Raises:
        BuildError, CorpusError, VocabError: bad input or settings (one-line messages).
        LockError: another process writes to the output dir.
    """
    started_at = datetime.now(timezone.utc)
    start = time.monotonic()
    config = resolve_config(config)
    created = not os.path.isdir(config.output_dir)
    os.makedirs(config.output_dir, exist_ok=True)
    try:
        # One writer per output dir: a second build there stops with one line naming this one.
        with DirectoryLock(config.output_dir, "--output-dir"):
            return _build(config, started_at, start)
    finally:
        if created and os.path.isdir(config.output_dir) and not os.listdir(config.output_dir):
            os.rmdir(config.output_dir)


def _build(config: BuildConfig, started_at: datetime, start: float) -> dict:
    """`build_dataset` once the output dir is locked."""
    check_output_dir(config.output_dir, config.overwrite)
    files = list_corpus_files(config.corpus_dir)
    if sum(f.size for f in files) == 0:
        raise BuildError(f"corpus dir {shown_path(config.corpus_dir)} contains only empty files")
    if config.learn_vocab is not None:
        learn_corpus_vocab(config, files)
    if config.learn_spm is not None:
        learn_corpus_spm(config, files)
    vocab = load_build_vocab(config)
    plan = make_plan(config, files)
    spec = _worker_spec(config, vocab, plan)
    text_mb = sum(estimated_text_bytes(f) for f in files) / 1e6
    logger.info("building from %d files (~%.1f MB of text) in %s with %d process(es) into %s",
                len(files), text_mb, config.corpus_dir, plan.num_processes, config.output_dir)
    os.makedirs(plan.shuffle_dir)
    phases = {}
    try:
        with WorkerPool(plan.num_processes, functools.partial(BuildWorker, spec)) as pool:
            phase_start = time.monotonic()
            split_plan = _survey(pool, config, plan, len(files), text_mb)
            if split_plan is not None:
                phases["survey"] = time.monotonic() - phase_start
                phase_start = time.monotonic()
            tasks = [(i, task, split_plan and {f.relpath: split_plan.files[f.relpath]
                                               for f in task}) for i, task in plan.tasks]
            results = pool.map("pack", tasks, Progress(
                _describe_reading("progress", len(files), text_mb), config.progress_interval,
                rate_key="tokens", rate_unit="tokens"))
            totals = merge_pack_results(results, config.max_seq_length)
            long_lines = [entry for result in results for entry in result["long_lines"]]
            check_train_examples(config.corpus_dir, totals)
            _join_inputs(plan)
            phases["pack"] = time.monotonic() - phase_start
            phase_start = time.monotonic()
            total = sum(split.examples for split in totals.pack.splits.values())
            units = [(split, buckets, shards) for split, layout in plan.layouts.items()
                     for buckets, shards in layout.units()]
            logger.info("shuffling %d examples: %d bucket(s) of <= %d MiB in memory", total,
                        sum(layout.num_buckets for layout in plan.layouts.values()),
                        config.shuffle_memory_mb)
            unit_counts = pool.map("gather", units, Progress(
                lambda t: f"shuffle: {t.get('written', 0)}/{total} examples written",
                config.progress_interval))
            phases["shuffle"] = time.monotonic() - phase_start
        for (split, _, _), counts in zip(units, unit_counts):
            totals.shard_counts.setdefault(split, {}).update(counts)
        shards = install_shards(config.output_dir, config.overwrite, plan.temp_paths(),
                                plan.shard_tmp, totals.shard_counts)
        os.replace(plan.inputs_tmp, os.path.join(config.output_dir, INPUTS_NAME))
        shutil.rmtree(plan.shuffle_dir)
    except BaseException as e:
        remove_temporaries(plan.temp_paths())
        if isinstance(e, (WorkerFailed, ShuffleError)):
            raise BuildError(str(e)) from None
        if isinstance(e, OSError):
            raise write_error(e, "the dataset", config.output_dir) from None
        raise
    manifest = build_manifest(config, vocab, len(files), plan, totals, shards, started_at,
                              time.monotonic() - start, phases, INPUTS_NAME,
                              eval_split=split_plan.summary if split_plan else no_split_summary())
    _finish(config, manifest, long_lines)
    return manifest


def check_train_examples(corpus_dir: str, totals) -> None:
    """Raises BuildError when packing made no training example (`totals`: BuildTotals); the
    message names the input problems met (the likely cause: a whole corpus in a format that is
    not read, or given with the wrong --input-format)."""
    if totals.pack.splits["train"].examples == 0:
        causes = ""
        if totals.num_problems:
            causes = (f"; {totals.num_problems} input problem(s), first: "
                      + "; ".join(format_problem(p) for p in totals.problems[:MAX_SHOWN_PROBLEMS]))
        raise BuildError(
            f"no training examples: the corpus in {shown_path(corpus_dir)} has no tokenizable "
            "text" + (" outside the held-out documents" if totals.pack.splits["eval"].examples
                      else "") + causes)


def _finish(config: BuildConfig, manifest: dict, long_lines: List[dict]) -> None:
    """Writes manifest.json (last: its presence marks a complete dataset), then the warnings
    and the summary."""
    try:
        atomic.write_json(os.path.join(config.output_dir, MANIFEST_NAME), manifest)
    except OSError as e:
        raise write_error(e, MANIFEST_NAME, config.output_dir) from None
    corpus_lib.warn_long_lines(manifest["counts"], long_lines, config.max_seq_length)
    log_summary(config, manifest)


def _worker_spec(config: BuildConfig, vocab, plan: Plan) -> WorkerSpec:
    """What every build process needs to know (picklable)."""
    return WorkerSpec(
        vocab_file=config.vocab_file, vocab_sha256=vocab.sha256,
        do_lower_case=config.do_lower_case, strip_accents=config.strip_accents,
        input=InputSettings(config.input_format, config.blanks_separate_docs,
                            config.jsonl_text_field),
        pack=PackSettings(config.max_seq_length, config.seed, config.eval_fraction,
                          vocab.special.unk_id),
        strict_input=config.bad_input == "error", shuffle_dir=plan.shuffle_dir,
        layouts=plan.layouts, shard_paths=plan.shard_tmp,
        memory_bytes=config.shuffle_memory_mb << 20, num_writers=plan.num_processes)


def _join_inputs(plan: Plan) -> None:
    """Concatenates the tasks' parts of inputs.jsonl (tasks are consecutive runs by relpath)."""
    with open(plan.inputs_tmp, "wb") as out:
        for task_index, _ in plan.tasks:
            part = inputs_part_path(plan.shuffle_dir, task_index)
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
            os.remove(part)


def log_summary(config: BuildConfig, manifest: dict) -> None:
    train, evals = manifest["splits"]["train"], manifest["splits"]["eval"]
    counts = manifest["counts"]
    if config.eval_fraction > 0 and not evals["examples"]:
        logger.warning("no document was held out for eval (%d documents, --eval-fraction %g): "
                       "there are no eval shards", counts["documents"], config.eval_fraction)
    elif split_warning(manifest["eval_split"]):
        logger.warning("%s", split_warning(manifest["eval_split"]))
    skipped = [p for p in manifest["input_problems"] if p["problem"] in WHOLE_FILE_PROBLEMS]
    if counts["skipped_files"]:
        # On a line of its own: a whole file of the corpus is not in the dataset.
        logger.warning(
            "%d file(s) NOT READ (binary data, or a format that is not read: listed in %s and "
            "%s); first: %s", counts["skipped_files"], MANIFEST_NAME, INPUTS_NAME,
            "; ".join(format_problem(p) for p in skipped[:MAX_SHOWN_PROBLEMS]))
    if counts["input_problems"]:
        logger.warning(
            "%d input problem(s) skipped or repaired (%d documents skipped, %d damaged files): "
            "listed in %s and %s; first: %s", counts["input_problems"], counts["skipped_documents"],
            counts["damaged_files"], MANIFEST_NAME, INPUTS_NAME,
            "; ".join(format_problem(p) for p in manifest["input_problems"][:MAX_SHOWN_PROBLEMS]))
    logger.info(
        "done: %d train examples in %d shards, %d eval examples in %d shards, %d documents, "
        "%d tokens in %.1f s (%.0f tokens/s) -> %s", train["examples"], len(train["shards"]),
        evals["examples"], len(evals["shards"]), counts["documents"],
        counts["tokenized_tokens"], manifest["elapsed_seconds"],
        manifest["throughput"]["tokens_per_second"],
        os.path.join(config.output_dir, MANIFEST_NAME))


def format_command(argv: Sequence[str]) -> str:
    """The command line as one shell-quoted string (recorded in the manifest)."""
    return shlex.join([os.path.basename(sys.executable)] + list(argv))
