"""The builder's per-process work: pack files into shuffle buckets, then write shards from them.

A `BuildWorker` lives in each worker process (or in the builder's process with one process).
`pack` reads, tokenises and packs a task's files (`formats`, `packing`) with a `FilePacker`
(shared with the Apache Beam build), which serialises the examples and keys them; the worker
scatters them by key into its bucket files (`shuffle`) and writes the task's per-file lines of
`inputs.jsonl`. `gather` sorts the buckets of one unit and writes its shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from electra_tf import console
from electra_tf.data.text.corpus import CorpusFile, ReadStats, format_problem
from electra_tf.data.build.example_builder import PackedExample
from electra_tf.data.text.formats import InputSettings, Opener, iter_document_lines
from electra_tf.data.build.output import write_error
from electra_tf.data.build.packing import PackSettings, PackStats, iter_examples
from electra_tf.data.build.shuffle import (BucketLayout, BucketWriter, bucket_path, gather_unit,
                                     key_base, shuffle_key_from_base)
from electra_tf.data.build.split import FileSplit, FileSurvey, survey_file
from electra_tf.data.records.tfrecord_io import ExampleSerializer
from electra_tf.data.text.tokenizer_choice import make_tokenizer
from electra_tf.errors import BuildError, shown_path
from electra_tf.vocab import Vocab, load_vocab

SERIALIZE_BATCH_IDS = 1 << 16  # ids per serialisation batch (512 examples at length 128)
MAX_LISTED_PROBLEMS = 100  # problem records returned per task (all go to inputs.jsonl)


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs (picklable: it crosses to a spawned process)."""

    vocab_file: str
    vocab_sha256: str
    do_lower_case: bool
    strip_accents: bool
    tokenizer: str  # resolved: "tensorflow" or "tokenizers" (`tokenizer_choice`)
    input: InputSettings
    pack: PackSettings
    strict_input: bool  # --bad-input error: any input problem fails the build
    shuffle_dir: str
    layouts: Dict[str, BucketLayout]  # per split
    shard_paths: Dict[str, Dict[int, str]]  # per split: shard index -> temporary path
    memory_bytes: int
    num_writers: int  # worker processes: bucket files are per (bucket, writer)


def inputs_part_path(shuffle_dir: str, task: int) -> str:
    return os.path.join(shuffle_dir, f"inputs-{task:06d}.jsonl")


class FilePacker:
    """Reads, tokenises, packs and serialises corpus files, one at a time, into keyed records.

    The per-file work of every build engine: the local builder's workers (`BuildWorker`) and
    the Apache Beam build's DoFn (`beam_pipeline`) both call `keyed_records`, so examples,
    keys and records are the same whichever engine runs them.

    Args:
        vocab: Vocab.
        do_lower_case, strip_accents: tokenization settings.
        input_settings: InputSettings.
        pack: PackSettings.
        strict_input: --bad-input error: any input problem raises BuildError.
        opener: how corpus files are opened (`formats.Opener`; None: the builtin open).
        tokenizer: the tokenizer to run, resolved (`tokenizer_choice`: "tensorflow" or
            "tokenizers"); a worker that cannot run it fails (never runs the other).
    """

    def __init__(self, vocab: Vocab, do_lower_case: bool, strip_accents: bool,
                 input_settings: InputSettings, pack: PackSettings, strict_input: bool,
                 opener: Opener = None, tokenizer: str = "tensorflow"):
        self.vocab = vocab
        self.do_lower_case, self.strip_accents = do_lower_case, strip_accents
        self.tokenizer_name = tokenizer
        self.input, self.pack, self.strict_input = input_settings, pack, strict_input
        self.opener = opener
        self.serializer = ExampleSerializer(pack.max_seq_length, vocab.special.cls_id,
                                            vocab.special.sep_id)
        self.batch_size = max(1, SERIALIZE_BATCH_IDS // pack.max_seq_length)
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # TensorFlow's imports it: only workers that pack need it
            self._tokenizer = make_tokenizer(self.vocab, self.do_lower_case, self.strip_accents,
                                             self.tokenizer_name)
        return self._tokenizer

    def survey(self, corpus_file: CorpusFile, report) -> FileSurvey:
        """The held-out split's first pass over one file: each document's key and tokens
        (`split.survey_file`); input problems are counted by the packing pass, not here.

        Raises:
            BuildError: the file cannot be read, or (strict_input) it has an input problem.
        """
        read, stats = ReadStats(), PackStats()
        lines = self._watched(iter_document_lines(corpus_file, self.input, read, self.opener),
                              read, stats, corpus_file, report)

        def counted(tokens: int) -> None:
            stats.tokenized_tokens += tokens

        try:
            return survey_file(lines, self.tokenizer.encode_batch, counted)
        except OSError as e:
            raise BuildError(
                f"cannot read corpus file {shown_path(corpus_file.path)}: {e.strerror or e}") from e

    def keyed_records(self, corpus_file: CorpusFile, read: ReadStats, stats: PackStats,
                      report, file_split: Optional[FileSplit] = None
                      ) -> Iterator[Tuple[str, List[Tuple[int, bytes]]]]:
        """One file's examples as serialised records with their shuffle keys, in batches.

        Args:
            corpus_file: CorpusFile.
            read, stats: ReadStats and PackStats (fresh for this file), updated in place.
            report: progress callback (keyword counters: bytes, documents, tokens, examples).
            file_split: the file's held-out documents (`split.SplitPlan`); None: no split.

        Yields:
            (split, [(shuffle key, record), ...]): batches of one split, in packing order.

        Raises:
            BuildError: the file cannot be read, (strict_input) it has an input problem, or it
                changed since its survey.
        """
        bases = {split: key_base(self.pack.seed, split, corpus_file.relpath)
                 for split in self.pack.splits}
        pending: Dict[str, List[Tuple[int, PackedExample]]] = {s: [] for s in self.pack.splits}
        lines = self._watched(iter_document_lines(corpus_file, self.input, read, self.opener),
                              read, stats, corpus_file, report)
        held_out = file_split.held_out if file_split is not None else ()
        try:
            for split, index, example in iter_examples(corpus_file.relpath, lines,
                                                       self.tokenizer.encode_batch, self.pack,
                                                       stats, held_out):
                batch = pending[split]
                batch.append((shuffle_key_from_base(bases[split], index), example))
                if len(batch) >= self.batch_size:
                    yield split, self._serialized(batch, report)
                    pending[split] = []
        except OSError as e:
            raise BuildError(
                f"cannot read corpus file {shown_path(corpus_file.path)}: {e.strerror or e}") from e
        if file_split is not None:
            _check_unchanged(corpus_file, file_split, stats)
        for split, batch in pending.items():
            if batch:
                yield split, self._serialized(batch, report)

    def _serialized(self, batch: List[Tuple[int, PackedExample]],
                    report) -> List[Tuple[int, bytes]]:
        records = self.serializer.serialize([example for _, example in batch])
        report(examples=len(batch))
        return [(key, record) for (key, _), record in zip(batch, records)]

    def _watched(self, batches: Iterable[List[str]], read: ReadStats, stats: PackStats,
                 corpus_file: CorpusFile, report) -> Iterator[List[str]]:
        """Passes line batches on, reporting progress and enforcing --bad-input error."""
        seen_bytes, seen_tokens = read.bytes_read, stats.tokenized_tokens
        for batch in batches:
            self._check_input(read, corpus_file)
            report(bytes=read.bytes_read - seen_bytes, documents=batch.count(""))
            seen_bytes = read.bytes_read
            yield batch
            report(tokens=stats.tokenized_tokens - seen_tokens)
            seen_tokens = stats.tokenized_tokens
        self._check_input(read, corpus_file)
        report(tokens=stats.tokenized_tokens - seen_tokens)

    def _check_input(self, read: ReadStats, corpus_file: CorpusFile) -> None:
        if self.strict_input and read.problems:
            first = next(iter(read.problems.values()))  # checked after every batch: the first
            raise BuildError(f"bad input in {shown_path(corpus_file.path)}: {format_problem(first)} "
                             f"(--bad-input skip counts such problems instead)")


def _check_unchanged(corpus_file: CorpusFile, file_split: FileSplit, stats: PackStats) -> None:
    """Raises BuildError when packing found other documents than the survey (the file changed
    between the passes: its document indices would then hold out the wrong documents)."""
    documents = sum(s.documents for s in stats.splits.values())
    if (documents, stats.tokenized_tokens) != (file_split.documents, file_split.tokens):
        raise BuildError(
            f"corpus file {shown_path(corpus_file.path)} changed while the dataset was being "
            f"built ({file_split.documents} documents and {file_split.tokens} tokens when "
            f"surveyed, {documents} and {stats.tokenized_tokens} when packed); rerun the build "
            "once it no longer changes")


def file_summary(corpus_file: CorpusFile, read: ReadStats,
                 stats: PackStats) -> Tuple[dict, List[dict]]:
    """A packed file's line of inputs.jsonl and its problem records (sorted by kind).

    Clears `read.problems` (the records are returned), so `read` can be summed.
    """
    problems = sorted(read.problems.values(), key=lambda e: e["problem"])
    read.problems = {}
    entry = {"file": shown_path(corpus_file.relpath), "bytes": corpus_file.size,
             "text_bytes": read.bytes_read,
             "documents": sum(s.documents for s in stats.splits.values()),
             "examples": {split: s.examples for split, s in stats.splits.items()}}
    if read.lines_split:  # each piece is at most one example: most of such a line is dropped
        entry["lines_split"] = read.lines_split
        entry["tokens"] = stats.tokenized_tokens
        entry["truncated_tokens"] = sum(s.truncated_tokens for s in stats.splits.values())
    if problems:
        entry["problems"] = [{k: v for k, v in p.items() if k != "file"} for p in problems]
    return entry, problems


class BuildWorker:
    """One process's state: the vocab and a `FilePacker` (its tokenizer built lazily)."""

    def __init__(self, spec: WorkerSpec, worker_id: int):
        self.spec = spec
        self.worker_id = worker_id
        if spec.tokenizer == "tensorflow":
            console.import_tensorflow_in_child()  # a quiet tool's workers are quiet too
        vocab = load_vocab(spec.vocab_file)
        if vocab.sha256 != spec.vocab_sha256:
            raise BuildError(
                f"vocab file {spec.vocab_file} changed while the dataset was being built")
        self.vocab = vocab
        self.packer = FilePacker(vocab, spec.do_lower_case, spec.strip_accents, spec.input,
                                 spec.pack, spec.strict_input, tokenizer=spec.tokenizer)

    # -------------------------------------------------------------------------------------------
    def survey(self, task: Tuple[int, List[CorpusFile]], report) -> List[Tuple[str, FileSurvey]]:
        """The held-out split's first pass over a task's files: [(relpath, FileSurvey)]."""
        surveys = []
        for corpus_file in task[1]:
            surveys.append((corpus_file.relpath, self.packer.survey(corpus_file, report)))
            report(files=1)
        return surveys

    def pack(self, task: Tuple[int, List[CorpusFile], Optional[Dict[str, FileSplit]]],
             report) -> dict:
        """Packs a task's files into this worker's bucket files.

        Args:
            task: (task index, files in relpath order, their held-out documents by relpath or
                None without a split).
            report: progress callback (keyword counters).

        Returns:
            {"read": ReadStats fields (problems: at most MAX_LISTED_PROBLEMS, in file order),
             "problems": total problem records, "pack": PackStats.to_dict()}.
        """
        try:
            return self._pack_task(task, report)
        except OSError as e:  # reading errors are BuildErrors already: this is a failed write
            raise write_error(e, "the shuffle's temporary files", self.spec.shuffle_dir,
                              os.path.dirname(self.spec.shuffle_dir)) from None

    def _pack_task(self, task: Tuple[int, List[CorpusFile], Optional[Dict[str, FileSplit]]],
                   report) -> dict:
        task_index, files, file_splits = task
        spec = self.spec
        writers = {split: BucketWriter(spec.shuffle_dir, split, spec.layouts[split],
                                       self.worker_id) for split in spec.pack.splits}
        read, stats = ReadStats(), PackStats()
        listed: List[dict] = []
        long_lines: List[dict] = []  # files with lines over MAX_LINE_BYTES (split)
        num_problems = 0
        with open(inputs_part_path(spec.shuffle_dir, task_index), "w", encoding="utf-8") as part:
            for corpus_file in files:
                file_read, file_stats = ReadStats(), PackStats()
                file_split = file_splits[corpus_file.relpath] if file_splits else None
                for split, batch in self.packer.keyed_records(corpus_file, file_read,
                                                              file_stats, report, file_split):
                    for key, record in batch:
                        writers[split].add(key, record)
                entry, problems = file_summary(corpus_file, file_read, file_stats)
                num_problems += len(problems)
                listed += problems[:MAX_LISTED_PROBLEMS - len(listed)]
                read.add(file_read)
                stats.add(file_stats)
                if "lines_split" in entry:
                    long_lines.append(entry)
                part.write(json.dumps(entry) + "\n")
                report(files=1)
        for writer in writers.values():
            writer.flush()
        result = dataclasses.asdict(read)
        result["problems"] = listed
        return {"read": result, "problems": num_problems, "pack": stats.to_dict(),
                "long_lines": long_lines[:MAX_LISTED_PROBLEMS]}

    # -------------------------------------------------------------------------------------------
    def gather(self, unit: Tuple[str, range, range], report) -> Dict[int, int]:
        """Writes the shards of one unit (split, buckets, shards); returns {shard: records}."""
        split, buckets, shards = unit
        spec = self.spec
        writers = range(spec.num_writers)
        files = [[p for p in (bucket_path(spec.shuffle_dir, split, b, w) for w in writers)
                  if os.path.exists(p)] for b in buckets]
        try:
            return gather_unit(files, shards, spec.layouts[split].num_shards,
                               spec.shard_paths[split], spec.memory_bytes, spec.shuffle_dir,
                               report=lambda n: report(written=n))
        except OSError as e:  # a full disk
            raise write_error(e, f"the {split} shards",
                              os.path.dirname(spec.shuffle_dir)) from None

