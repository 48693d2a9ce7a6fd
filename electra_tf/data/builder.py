"""Builds the pretraining dataset: corpus text -> packed TFRecord shards + `manifest.json`.

The packing is the official one (`example_builder`); this module owns the I/O around it: job
split, tokenisation in batches, shard writing, the held-out split, the manifest and progress.

Differences from the official `build_pretraining_dataset.py` (each one deliberate):
* Determinism. Every input file gets its own `random.Random`, seeded from (`seed`, the file's
  path relative to the corpus dir), and a fresh `ExampleBuilder`. The official builder uses the
  unseeded global `random` and carries one builder's state across the files of a job. Because a
  document never spans files, the only effect of the reset is that the 5%-random target length
  does not carry over a file boundary; in exchange the examples depend only on (file, seed,
  settings), not on which process handles the file: same inputs, same bytes, and
  `num_processes=N` yields exactly the examples of N=1 (only their shard placement differs).
* Jobs. Files are assigned to jobs by size (largest first, to the least-loaded job) instead of by
  index modulo the job count, then each job's list is shuffled with a seeded RNG (the official
  shuffle is unseeded). Job j owns shards i with i % num_jobs == j and writes them round-robin,
  as in the official builder. The unit of parallelism is the file.
* Shards. `num_out_files` is configurable (official: fixed 1000). Default: one shard per
  `DEFAULT_BYTES_PER_SHARD` of corpus text, at least `MIN_DEFAULT_SHARDS` and one per job, at
  most 1000. Shards that would be empty are not written and the remaining ones are numbered
  consecutively, so a small corpus never yields empty files; the manifest lists what exists.
* Held-out split. With `eval_fraction` > 0 each document goes to the eval split with that
  probability (a seeded draw per document, independent of the packing draws). Eval documents are
  packed by their own builder into `eval_data.tfrecord-{i}-of-{m}` beside the train shards, with
  m = max(num_jobs, ceil(num_out_files * eval_fraction)).
* Safety. Shards are written under hidden temporary names and renamed when complete; the old
  dataset's files (manifest and shards, nothing else) are replaced only with `overwrite`; the
  manifest is written last, atomically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import multiprocessing
import os
import platform
import queue as queue_lib
import random
import re
import shlex
import sys
import time
import traceback
from datetime import datetime, timezone
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from electra_tf.data.corpus import (CorpusError, CorpusFile, ReadStats, iter_line_batches,
                                    list_corpus_files)
from electra_tf.data.example_builder import ExampleBuilder, PackedExample
from electra_tf.data.tfrecord_io import (EVAL_PREFIX, FEATURE_NAMES, MANIFEST_FORMAT_VERSION,
                                         MANIFEST_NAME, TRAIN_PREFIX, ExampleSerializer, shard_name)
from electra_tf.vocab import Vocab, VocabError, load_vocab

logger = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "pretrain_data"  # official DATA_DIR layout: vocab.txt, pretrain_tfrecords/
DEFAULT_CORPUS_DIR = os.path.join(DEFAULT_DATA_DIR, "corpus")
DEFAULT_VOCAB_FILE = os.path.join(DEFAULT_DATA_DIR, "vocab.txt")
DEFAULT_OUTPUT_DIR = os.path.join(DEFAULT_DATA_DIR, "pretrain_tfrecords")
DEFAULT_MAX_SEQ_LENGTH = 128  # official --max-seq-length
DEFAULT_SEED = 0
DEFAULT_EVAL_FRACTION = 0.01
# The smallest max_seq_length accepted: room for [CLS] a [SEP] b [SEP] with a few tokens each
# (the official random target alone needs >= 5).
MIN_MAX_SEQ_LENGTH = 8
# A sanity bound (the model's position table is 512 by default); catches typos before they
# allocate huge buffers.
MAX_MAX_SEQ_LENGTH = 65536
OFFICIAL_NUM_OUT_FILES = 1000
DEFAULT_BYTES_PER_SHARD = 8 << 20
MIN_DEFAULT_SHARDS = 4
HISTOGRAM_BUCKET_WIDTH = 8  # example lengths (incl. specials) are counted in buckets 1-8, 9-16, ...
SERIALIZE_BATCH_IDS = 1 << 16  # ids per serialisation batch (512 examples at length 128)
PROGRESS_INTERVAL_SECONDS = 2.0
_WORKER_REPORT_SECONDS = 0.5
_TMP_PREFIX = ".partial-"  # hidden: never matched by the trainer's `pretrain_data.tfrecord*` glob
_OUR_FILES = re.compile(
    r"^(%s|%s)-\d+-of-\d+$" % (re.escape(TRAIN_PREFIX), re.escape(EVAL_PREFIX)))


class BuildError(ValueError):
    """Bad input or settings for the dataset builder; the message is one line naming the problem."""


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Settings of one dataset build (the CLI flags of `build_pretraining_dataset.py`).

    Attributes:
        corpus_dir: directory of text files; None means `pretrain_data/corpus`, fetched first if
            the default data is not there yet.
        vocab_file: vocab to read; with `learn_vocab`, where to write the learned vocab. None
            means `pretrain_data/vocab.txt` (read), or `<parent of output_dir>/vocab.txt`
            (learned: the official DATA_DIR/vocab.txt layout).
        output_dir: where shards and manifest.json go (default `pretrain_data/pretrain_tfrecords`).
        max_seq_length: example length incl. [CLS]/[SEP] (official default 128).
        num_processes: worker processes; files are the unit of work.
        blanks_separate_docs: a blank line ends a document (else blank lines are skipped).
        do_lower_case: lowercase (and, with strip_accents, strip accents) before WordPiece.
        strip_accents: strip accents (only has an effect with do_lower_case, as in BERT).
        num_out_files: number of train shards; None picks a default from the corpus size.
        seed: seed of every random draw (packing, split, file order).
        overwrite: replace an existing dataset in output_dir (and an existing learned vocab).
        eval_fraction: fraction of documents held out into eval shards, in [0, 1).
        learn_vocab: learn a WordPiece vocab of this size from the corpus instead of reading one.
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
    command: Optional[str] = None
    progress_interval: float = PROGRESS_INTERVAL_SECONDS


def derive_seed(seed: int, *parts: str) -> int:
    """A 64-bit seed from the user seed and labels (stable across runs, machines and Python)."""
    digest = hashlib.sha256("\0".join((str(seed),) + parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def default_num_out_files(corpus_bytes: int, num_jobs: int) -> int:
    """Default train shard count: one per 8 MiB of text, >= 4 and >= num_jobs, <= 1000."""
    wanted = max(MIN_DEFAULT_SHARDS, math.ceil(corpus_bytes / DEFAULT_BYTES_PER_SHARD))
    return max(num_jobs, min(OFFICIAL_NUM_OUT_FILES, wanted))


def num_eval_files(num_out_files: int, eval_fraction: float, num_jobs: int) -> int:
    """Eval shard count: proportional to the train shards, at least one per job (0 if no split)."""
    if eval_fraction <= 0:
        return 0
    return max(num_jobs, math.ceil(num_out_files * eval_fraction))


def assign_files(files: Sequence[CorpusFile], num_jobs: int, seed: int) -> List[List[CorpusFile]]:
    """Balances files over jobs by size (largest first), then shuffles each job's list (seeded)."""
    jobs: List[List[CorpusFile]] = [[] for _ in range(num_jobs)]
    load = [0] * num_jobs
    for f in sorted(files, key=lambda f: (-f.size, f.relpath)):
        j = min(range(num_jobs), key=lambda k: (load[k], k))
        jobs[j].append(f)
        load[j] += f.size
    for j, job_files in enumerate(jobs):
        job_files.sort(key=lambda f: f.relpath)
        random.Random(derive_seed(seed, "job-order", str(num_jobs), str(j))).shuffle(job_files)
    return jobs


# ------------------------------------------------------------------------------------------------
# Validation (cheap, before anything is written or TensorFlow is imported)


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
    corpus_dir = config.corpus_dir or DEFAULT_CORPUS_DIR
    vocab_file = config.vocab_file
    if vocab_file is None:
        if config.learn_vocab is not None:  # official layout: DATA_DIR/vocab.txt
            output_dir = os.path.normpath(config.output_dir)
            data_dir = os.path.dirname(output_dir)
            if not data_dir or os.path.basename(output_dir) in (".", ".."):
                data_dir = os.path.dirname(os.path.abspath(output_dir))
            vocab_file = os.path.join(data_dir, "vocab.txt")
        else:
            vocab_file = DEFAULT_VOCAB_FILE
    out, corpus = os.path.realpath(config.output_dir), os.path.realpath(corpus_dir)
    if out == corpus or out.startswith(corpus + os.sep):
        raise BuildError(
            f"--output-dir {config.output_dir} must not be inside --corpus-dir {corpus_dir}")
    if os.path.exists(config.output_dir) and not os.path.isdir(config.output_dir):
        raise BuildError(f"--output-dir {config.output_dir} exists and is not a directory")
    return dataclasses.replace(config, corpus_dir=corpus_dir, vocab_file=vocab_file)


def _check_output_dir(config: BuildConfig) -> None:
    names = os.listdir(config.output_dir) if os.path.isdir(config.output_dir) else []
    partial = [n for n in names if n.startswith(_TMP_PREFIX)]
    if names and MANIFEST_NAME not in names and all(
            n.startswith(_TMP_PREFIX) or _OUR_FILES.match(n) for n in names):
        # A build killed before its manifest (written last): its shards are incomplete or
        # unverified, never to be mixed with a new build's.
        if not config.overwrite:
            raise BuildError(
                f"output dir {config.output_dir} holds an interrupted build ({len(partial)} "
                f"temporary {_TMP_PREFIX}* file(s), {len(names) - len(partial)} shard(s), no "
                f"{MANIFEST_NAME}); pass --overwrite to delete it and build afresh")
        logger.warning("--overwrite: removing an interrupted build in %s (%d temporary files, no "
                       "%s)", config.output_dir, len(partial), MANIFEST_NAME)
        _remove_previous_dataset(config.output_dir, keep=())
        return
    if names and not config.overwrite:
        raise BuildError(
            f"output dir {config.output_dir} exists and is not empty; pass --overwrite to replace "
            f"the dataset in it")


# ------------------------------------------------------------------------------------------------
# Per-job work (runs in the main process for one job, in worker processes otherwise)


@dataclasses.dataclass
class SplitStats:
    """Counts of one split (train or eval)."""

    documents: int = 0
    sentences: int = 0
    examples: int = 0
    tokens: int = 0  # real tokens in examples, [CLS]/[SEP] included
    single_segment: int = 0
    truncated_tokens: int = 0  # sentence tokens dropped by truncation
    length_histogram: List[int] = dataclasses.field(default_factory=list)

    def add(self, other: "SplitStats") -> None:
        for field in dataclasses.fields(self):
            if field.name == "length_histogram":
                continue
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))
        missing = len(other.length_histogram) - len(self.length_histogram)
        self.length_histogram += [0] * max(0, missing)
        for i, count in enumerate(other.length_histogram):
            self.length_histogram[i] += count


@dataclasses.dataclass
class JobSpec:
    """Everything a job needs (picklable: it crosses to a spawned process)."""

    job_index: int
    files: List[CorpusFile]
    vocab_file: str
    vocab_sha256: str
    max_seq_length: int
    blanks_separate_docs: bool
    do_lower_case: bool
    strip_accents: bool
    seed: int
    eval_fraction: float
    train_shards: Dict[int, str]  # global shard index -> temporary path, owned by this job
    eval_shards: Dict[int, str]


class _ShardWriter:
    """Round-robin writer over one split's shards owned by a job, with batched serialisation."""

    def __init__(self, shards: Dict[int, str], serializer: ExampleSerializer, stats: SplitStats):
        self.indices = sorted(shards)
        self.paths = [shards[i] for i in self.indices]
        self.writers = [None] * len(self.paths)
        self.counts = [0] * len(self.paths)
        self.serializer = serializer
        self.stats = stats
        self.pending: List[PackedExample] = []
        self.n_written = 0
        # Serialise in batches of about SERIALIZE_BATCH_IDS ids: amortises numpy overhead while
        # bounding memory at any max_seq_length.
        self.batch_size = max(1, SERIALIZE_BATCH_IDS // serializer.max_seq_length)

    def add(self, example: PackedExample) -> None:
        stats = self.stats
        n = len(example.first_segment) + 2
        if example.second_segment:
            n += len(example.second_segment) + 1
        else:
            stats.single_segment += 1
        stats.examples += 1
        stats.tokens += n
        stats.truncated_tokens += example.num_dropped
        stats.length_histogram[(n - 1) // HISTOGRAM_BUCKET_WIDTH] += 1
        self.pending.append(example)
        if len(self.pending) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        import tensorflow as tf  # lazy: only workers that write need it

        for record in self.serializer.serialize(self.pending):
            k = self.n_written % len(self.writers)
            if self.writers[k] is None:
                self.writers[k] = tf.io.TFRecordWriter(self.paths[k])
            self.writers[k].write(record)
            self.counts[k] += 1
            self.n_written += 1
        self.pending = []

    def close(self) -> Dict[int, int]:
        self.flush()
        for writer in self.writers:
            if writer is not None:
                writer.close()
        return dict(zip(self.indices, self.counts))


def _make_tokenizer(vocab: Vocab, do_lower_case: bool, strip_accents: bool):
    from electra_tf.data.tokenization import Tokenizer  # imports TensorFlow: only when building

    return Tokenizer(vocab, do_lower_case=do_lower_case, strip_accents=strip_accents)


class _Job:
    """The state of one job: tokenizer, per-split writers and counters."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        vocab = load_vocab(spec.vocab_file)
        if vocab.sha256 != spec.vocab_sha256:
            raise BuildError(
                f"vocab file {spec.vocab_file} changed while the dataset was being built")
        self.unk_id = vocab.special.unk_id
        self.tokenizer = _make_tokenizer(vocab, spec.do_lower_case, spec.strip_accents)
        serializer = ExampleSerializer(spec.max_seq_length, vocab.special.cls_id,
                                       vocab.special.sep_id)
        num_buckets = math.ceil(spec.max_seq_length / HISTOGRAM_BUCKET_WIDTH)
        self.stats = {split: SplitStats(length_histogram=[0] * num_buckets)
                      for split in ("train", "eval")}
        self.writers = {"train": _ShardWriter(spec.train_shards, serializer, self.stats["train"])}
        if spec.eval_shards:
            self.writers["eval"] = _ShardWriter(spec.eval_shards, serializer, self.stats["eval"])
        self.read_stats = ReadStats()
        self.tokenized_tokens = 0
        self.unk_tokens = 0
        self.files_done = 0

    def snapshot(self) -> dict:
        """Cumulative progress counters."""
        return {"files": self.files_done, "bytes": self.read_stats.bytes_read,
                "documents": self.stats["train"].documents + self.stats["eval"].documents,
                "examples": self.stats["train"].examples + self.stats["eval"].examples,
                "tokens": self.tokenized_tokens}

    def pack_file(self, corpus_file: CorpusFile, report: Callable[[], None]) -> None:
        """Reads, tokenises and packs one file with its own seeded builders (see module doc)."""
        spec, stats, writers = self.spec, self.stats, self.writers
        builders = {split: ExampleBuilder(spec.max_seq_length, random.Random(
            derive_seed(spec.seed, "pack", split, corpus_file.relpath))) for split in writers}
        split_rng = random.Random(derive_seed(spec.seed, "split", corpus_file.relpath))
        split = None  # the split of the open document; None between documents
        try:
            for lines in iter_line_batches(corpus_file.path, self.read_stats):
                nonblank = [line for line in lines if line]
                if nonblank:
                    ids, row_splits = self.tokenizer.encode_batch(nonblank)
                    self.tokenized_tokens += int(ids.shape[0])
                    self.unk_tokens += int(np.count_nonzero(ids == self.unk_id))
                    ids, row_splits = ids.tolist(), row_splits.tolist()
                k = 0
                for line in lines:
                    if not line:
                        # Official: blank lines reach the builder only when they separate
                        # documents (between documents they would append an empty sentence,
                        # which changes nothing).
                        if spec.blanks_separate_docs and split is not None:
                            example = builders[split].end_document()
                            if example:
                                writers[split].add(example)
                            split = None
                        continue
                    if split is None:
                        split = "train"
                        if spec.eval_fraction > 0 and split_rng.random() < spec.eval_fraction:
                            split = "eval"
                        stats[split].documents += 1
                    stats[split].sentences += 1
                    example = builders[split].add_sentence(ids[row_splits[k]:row_splits[k + 1]])
                    k += 1
                    if example:
                        writers[split].add(example)
                report()
        except OSError as e:
            raise BuildError(
                f"cannot read corpus file {corpus_file.path}: {e.strerror or e}") from e
        if split is not None:  # the end of a file always ends a document
            example = builders[split].end_document()
            if example:
                writers[split].add(example)
        self.files_done += 1

    def finish(self) -> dict:
        shard_counts = {split: writer.close() for split, writer in self.writers.items()}
        return {
            "read": dataclasses.asdict(self.read_stats),
            "splits": {split: dataclasses.asdict(s) for split, s in self.stats.items()},
            "tokenized_tokens": self.tokenized_tokens,
            "unk_tokens": self.unk_tokens,
            "files": self.files_done,
            "shard_counts": shard_counts,
        }


def run_job(spec: JobSpec, report: Optional[Callable[[dict], None]] = None) -> dict:
    """Tokenises, packs and writes the files of one job.

    Args:
        spec: JobSpec.
        report: called with a cumulative progress snapshot at most every ~0.5 s.

    Returns:
        A picklable dict: read stats, per-split stats, token and [UNK] counts, and the example
        count of every shard written (by global shard index).
    """
    job = _Job(spec)
    last_report = [time.monotonic()]

    def maybe_report() -> None:
        now = time.monotonic()
        if report is not None and now - last_report[0] >= _WORKER_REPORT_SECONDS:
            report(job.snapshot())
            last_report[0] = now

    for corpus_file in spec.files:
        job.pack_file(corpus_file, maybe_report)
    result = job.finish()
    if report is not None:
        report(job.snapshot())
    return result


def _job_process(spec: JobSpec, messages) -> None:
    """Entry point of a worker process: runs one job and reports through `messages`."""
    try:
        result = run_job(spec, lambda snap: messages.put(("progress", spec.job_index, snap)))
        messages.put(("done", spec.job_index, result))
    except (BuildError, CorpusError, VocabError) as e:
        messages.put(("error", spec.job_index, str(e)))
    except BaseException:  # noqa: BLE001 -- a bug: hand the traceback to the parent
        messages.put(("crash", spec.job_index, traceback.format_exc()))


# ------------------------------------------------------------------------------------------------
# Orchestration


class _Progress:
    """Aggregates per-job snapshots and logs a line at most every `interval` seconds.

    The rate shown is over the last interval (worker start-up does not dilute it).
    """

    def __init__(self, num_files: int, corpus_bytes: int, interval: float):
        self.num_files = num_files
        self.corpus_bytes = corpus_bytes
        self.interval = interval
        self.last_time = time.monotonic()
        self.last_tokens = 0
        self.snapshots: Dict[int, dict] = {}

    def update(self, job: int, snapshot: dict) -> None:
        self.snapshots[job] = snapshot
        now = time.monotonic()
        if now - self.last_time < self.interval:
            return
        total = {k: sum(s[k] for s in self.snapshots.values())
                 for k in ("files", "bytes", "documents", "examples", "tokens")}
        rate = (total["tokens"] - self.last_tokens) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_tokens = now, total["tokens"]
        logger.info(
            "progress: files %d/%d, %.1f/%.1f MB, documents %d, examples %d, %.0f tokens/s",
            total["files"], self.num_files, total["bytes"] / 1e6, self.corpus_bytes / 1e6,
            total["documents"], total["examples"], rate)


def _run_jobs(specs: List[JobSpec], progress: _Progress) -> List[dict]:
    if len(specs) == 1:
        return [run_job(specs[0], lambda snap: progress.update(0, snap))]
    # Spawn, not fork: the parent may already hold TensorFlow threads.
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    processes = [context.Process(target=_job_process, args=(spec, messages), daemon=True)
                 for spec in specs]
    results: Dict[int, dict] = {}
    try:
        for p in processes:
            p.start()
        while len(results) < len(specs):
            try:
                kind, job, payload = messages.get(timeout=0.5)
            except queue_lib.Empty:
                for j, p in enumerate(processes):
                    if j not in results and not p.is_alive() and messages.empty():
                        raise BuildError(f"worker process {j} died (exit code {p.exitcode})")
                continue
            if kind == "progress":
                progress.update(job, payload)
            elif kind == "done":
                results[job] = payload
            elif kind == "error":
                raise BuildError(payload)
            else:
                raise RuntimeError(f"worker process {job} failed:\n{payload}")
    finally:
        # A worker sends "done" after closing its shards, so none is still writing here; one
        # still alive is only tearing TensorFlow down (or failed): stop it rather than wait.
        for p in processes:
            if p.pid is None:  # never started
                continue
            if p.is_alive():
                p.terminate()
            p.join()
        messages.close()
    return [results[j] for j in range(len(specs))]


def _versions() -> dict:
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    electra_tf_version = version("electra-tf")
    if electra_tf_version == "not installed":  # running from a source checkout
        electra_tf_version = _source_tree_version()
    return {"python": platform.python_version(), "tensorflow": version("tensorflow"),
            "tensorflow-text": version("tensorflow-text"), "electra_tf": electra_tf_version}


def _source_tree_version() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            match = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.MULTILINE)
        return match.group(1) if match else "unknown"
    except OSError:
        return "unknown"


def _write_json_atomic(path: str, data: dict) -> None:
    tmp = os.path.join(os.path.dirname(path), _TMP_PREFIX + os.path.basename(path))
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _fetch_default_data_if_needed() -> None:
    from electra_tf.data.fetch import default_data_ready, fetch_default_data

    if not default_data_ready(DEFAULT_DATA_DIR):
        logger.info("default data not found in %s: fetching it first", DEFAULT_DATA_DIR)
        fetch_default_data(data_dir=DEFAULT_DATA_DIR)


def _learn_vocab(config: BuildConfig, files: Sequence[CorpusFile]) -> None:
    if os.path.exists(config.vocab_file) and not config.overwrite:
        raise BuildError(
            f"vocab file {config.vocab_file} exists; pass --overwrite to replace it with a "
            f"learned vocab, or give another path with --vocab-file")
    from electra_tf.data.vocab_learning import learn_vocab

    parent = os.path.dirname(config.vocab_file)
    if parent:
        os.makedirs(parent, exist_ok=True)
    logger.info("learning a WordPiece vocab of %d tokens from %d files into %s",
                config.learn_vocab, len(files), config.vocab_file)
    try:
        learn_vocab([f.path for f in files], config.learn_vocab, config.vocab_file,
                    do_lower_case=config.do_lower_case, strip_accents=config.strip_accents)
    except ValueError as e:  # e.g. a size too small for the specials and the alphabet
        raise BuildError(f"--learn-vocab {config.learn_vocab}: {e}") from e


class _Plan(NamedTuple):
    """How the work is split: jobs and the temporary path of every shard (by global index)."""

    num_jobs: int
    num_out_files: int
    num_eval_files: int
    train_tmp: Dict[int, str]
    eval_tmp: Dict[int, str]

    def temp_paths(self) -> List[str]:
        return list(self.train_tmp.values()) + list(self.eval_tmp.values())


def _plan(config: BuildConfig, files: Sequence[CorpusFile], corpus_bytes: int) -> _Plan:
    num_jobs = min(config.num_processes, sum(1 for f in files if f.size > 0))
    num_out = config.num_out_files or default_num_out_files(corpus_bytes, num_jobs)
    if num_out < num_jobs:
        logger.info("using %d processes: each needs a shard of its own (--num-out-files %d)",
                    num_out, num_out)
        num_jobs = num_out
    num_eval = num_eval_files(num_out, config.eval_fraction, num_jobs)
    # The pid keeps two builds into one directory from writing the same temporary file.
    prefix = os.path.join(config.output_dir, f"{_TMP_PREFIX}{os.getpid()}-")
    return _Plan(num_jobs, num_out, num_eval,
                 {i: prefix + shard_name(TRAIN_PREFIX, i, num_out) for i in range(num_out)},
                 {i: prefix + shard_name(EVAL_PREFIX, i, num_eval) for i in range(num_eval)})


def build_dataset(config: BuildConfig) -> dict:
    """Builds packed TFRecord shards and `manifest.json` from a text corpus.

    Args:
        config: BuildConfig.

    Returns:
        The manifest (also written to `<output_dir>/manifest.json`).

    Raises:
        BuildError, CorpusError, VocabError: bad input or settings (one-line messages).
    """
    started_at = datetime.now(timezone.utc)
    start = time.monotonic()
    use_default_data = config.corpus_dir is None
    config = resolve_config(config)
    _check_output_dir(config)
    if use_default_data:
        _fetch_default_data_if_needed()
    files = list_corpus_files(config.corpus_dir)
    corpus_bytes = sum(f.size for f in files)
    if corpus_bytes == 0:
        raise BuildError(f"corpus dir {config.corpus_dir} contains only empty files")
    if config.learn_vocab is not None:
        _learn_vocab(config, files)
    vocab = load_vocab(config.vocab_file)

    plan = _plan(config, files, corpus_bytes)
    specs = [
        JobSpec(job_index=j, files=job_files, vocab_file=config.vocab_file,
                vocab_sha256=vocab.sha256, max_seq_length=config.max_seq_length,
                blanks_separate_docs=config.blanks_separate_docs,
                do_lower_case=config.do_lower_case, strip_accents=config.strip_accents,
                seed=config.seed, eval_fraction=config.eval_fraction,
                train_shards={i: p for i, p in plan.train_tmp.items() if i % plan.num_jobs == j},
                eval_shards={i: p for i, p in plan.eval_tmp.items() if i % plan.num_jobs == j})
        for j, job_files in enumerate(assign_files(files, plan.num_jobs, config.seed))
    ]
    logger.info("building from %d files (%.1f MB) in %s with %d process(es) into %s",
                len(files), corpus_bytes / 1e6, config.corpus_dir, plan.num_jobs,
                config.output_dir)
    created_dir = not os.path.isdir(config.output_dir)
    os.makedirs(config.output_dir, exist_ok=True)
    try:
        results = _run_jobs(specs, _Progress(len(files), corpus_bytes, config.progress_interval))
        totals = _merge_results(results, config.max_seq_length)
        if totals.splits["train"].examples == 0:
            raise BuildError(
                f"no training examples: the corpus in {config.corpus_dir} has no tokenizable "
                f"text" + (" outside the held-out documents" if totals.splits["eval"].examples
                           else ""))
        shards = _install_shards(config, plan, totals.shard_counts)
    except BaseException:
        for path in plan.temp_paths():
            if os.path.exists(path):
                os.remove(path)
        if created_dir and not os.listdir(config.output_dir):
            os.rmdir(config.output_dir)
        raise
    manifest = _manifest(config, vocab, len(files), plan, totals, shards, started_at,
                         time.monotonic() - start)
    _write_json_atomic(os.path.join(config.output_dir, MANIFEST_NAME), manifest)
    train, evals = manifest["splits"]["train"], manifest["splits"]["eval"]
    if config.eval_fraction > 0 and not evals["examples"]:
        logger.warning("no document was held out for eval (%d documents, --eval-fraction %g): "
                       "there are no eval shards", manifest["counts"]["documents"],
                       config.eval_fraction)
    logger.info(
        "done: %d train examples in %d shards, %d eval examples in %d shards, %d documents, "
        "%d tokens in %.1f s (%.0f tokens/s) -> %s", train["examples"], len(train["shards"]),
        evals["examples"], len(evals["shards"]), manifest["counts"]["documents"],
        manifest["counts"]["tokenized_tokens"], manifest["elapsed_seconds"],
        manifest["throughput"]["tokens_per_second"],
        os.path.join(config.output_dir, MANIFEST_NAME))
    return manifest


class _Totals(NamedTuple):
    read: ReadStats
    splits: Dict[str, SplitStats]
    shard_counts: Dict[str, Dict[int, int]]  # split -> global shard index -> examples
    tokenized_tokens: int
    unk_tokens: int


def _merge_results(results: Sequence[dict], max_seq_length: int) -> _Totals:
    read = ReadStats()
    num_buckets = math.ceil(max_seq_length / HISTOGRAM_BUCKET_WIDTH)
    splits = {s: SplitStats(length_histogram=[0] * num_buckets) for s in ("train", "eval")}
    shard_counts: Dict[str, Dict[int, int]] = {"train": {}, "eval": {}}
    for result in results:
        read.add(ReadStats(**result["read"]))
        for split in splits:
            splits[split].add(SplitStats(**result["splits"][split]))
            shard_counts[split].update(result["shard_counts"].get(split, {}))
    return _Totals(read, splits, shard_counts, sum(r["tokenized_tokens"] for r in results),
                   sum(r["unk_tokens"] for r in results))


def _install_shards(config: BuildConfig, plan: _Plan,
                    shard_counts: Dict[str, Dict[int, int]]) -> Dict[str, List[dict]]:
    """Replaces the previous dataset (with overwrite) by the new shards; returns their entries.

    Non-empty temporary shards are renamed to consecutive final names; empty ones were never
    created (writers open on first write).
    """
    output_dir = config.output_dir
    if config.overwrite:
        removed = _remove_previous_dataset(output_dir, keep=plan.temp_paths())
        if removed:
            logger.info("--overwrite: removed %d files of the previous dataset in %s", removed,
                        output_dir)
    entries = {}
    for split, prefix, temp in (("train", TRAIN_PREFIX, plan.train_tmp),
                                ("eval", EVAL_PREFIX, plan.eval_tmp)):
        counts = shard_counts[split]
        nonempty = [i for i in sorted(counts) if counts[i] > 0]
        entries[split] = []
        for k, i in enumerate(nonempty):
            name = shard_name(prefix, k, len(nonempty))
            path = os.path.join(output_dir, name)
            os.replace(temp[i], path)
            entries[split].append({"file": name, "examples": counts[i],
                                   "bytes": os.path.getsize(path)})
    return entries


def _remove_previous_dataset(output_dir: str, keep: Sequence[str]) -> int:
    """Deletes a previous build's manifest, shards and leftover temporary files.

    Only files with the builder's own names are touched; `keep` (this build's temporary shards)
    survives.
    """
    keep = {os.path.basename(path) for path in keep}
    removed = 0
    for name in sorted(os.listdir(output_dir)):
        if name in keep:
            continue
        if name == MANIFEST_NAME or _OUR_FILES.match(name) or name.startswith(_TMP_PREFIX):
            path = os.path.join(output_dir, name)
            if os.path.isfile(path) or os.path.islink(path):
                os.remove(path)
                removed += 1
    return removed


def _manifest(config: BuildConfig, vocab: Vocab, num_files: int, plan: _Plan, totals: _Totals,
              shards: Dict[str, List[dict]], started_at: datetime, elapsed: float) -> dict:
    splits, read = totals.splits, totals.read
    total = SplitStats(length_histogram=[0] * len(splits["train"].length_histogram))
    for stats in splits.values():
        total.add(stats)

    def split_entry(split: str) -> dict:
        entry = dataclasses.asdict(splits[split])
        entry["single_segment_fraction"] = splits[split].single_segment / max(
            splits[split].examples, 1)
        entry["shards"] = shards[split]
        return entry

    per_second = 1.0 / max(elapsed, 1e-9)
    return {
        "format_version": MANIFEST_FORMAT_VERSION,
        "features": {name: ["int64", config.max_seq_length] for name in FEATURE_NAMES},
        "max_seq_length": config.max_seq_length,
        "vocab": {"path": config.vocab_file, "sha256": vocab.sha256, "size": vocab.size,
                  "learned": config.learn_vocab is not None,
                  "special_ids": vocab.special._asdict()},
        "do_lower_case": config.do_lower_case,
        "strip_accents": config.strip_accents,
        "blanks_separate_docs": config.blanks_separate_docs,
        "seed": config.seed,
        "eval_fraction": config.eval_fraction,
        "corpus_dir": config.corpus_dir,
        "num_processes": plan.num_jobs,
        "num_out_files_requested": plan.num_out_files,
        "num_eval_files_requested": plan.num_eval_files,
        "splits": {"train": split_entry("train"), "eval": split_entry("eval")},
        "counts": {
            "files": num_files,
            "corpus_bytes": read.bytes_read,
            "documents": total.documents,
            "sentences": total.sentences,
            "lines": read.lines,
            "blank_lines": read.blank_lines,
            "examples": total.examples,
            "tokenized_tokens": totals.tokenized_tokens,
            "example_tokens": total.tokens,
            "unk_tokens": totals.unk_tokens,
            "unk_rate": totals.unk_tokens / max(totals.tokenized_tokens, 1),
            "truncated_tokens": total.truncated_tokens,
            "undecodable_bytes": read.undecodable_bytes,
            "nul_bytes": read.nul_bytes,
            "crlf_line_ends": read.crlf_line_ends,
            "bom_files": read.bom_files,
            "lines_split": read.lines_split,
        },
        "length_histogram": {"bucket_width": HISTOGRAM_BUCKET_WIDTH,
                             "counts": total.length_histogram},
        "single_segment_fraction": total.single_segment / max(total.examples, 1),
        "command": config.command,
        "versions": _versions(),
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_seconds": round(elapsed, 3),
        "throughput": {
            "tokens_per_second": round(totals.tokenized_tokens * per_second, 1),
            "examples_per_second": round(total.examples * per_second, 1),
            "megabytes_per_second": round(read.bytes_read / 1e6 * per_second, 3),
        },
    }


def format_command(argv: Sequence[str]) -> str:
    """The command line as one shell-quoted string (recorded in the manifest)."""
    return shlex.join([os.path.basename(sys.executable)] + list(argv))
