"""The builder's per-process work: pack files into shuffle buckets, then write shards from them.

A `BuildWorker` lives in each worker process (or in the builder's process with one process).
`pack` reads, tokenises and packs a task's files (`formats`, `packing`), serialises the
examples and scatters them by shuffle key into this worker's bucket files (`shuffle`); it also
writes the task's per-file lines of `inputs.jsonl`. `gather` sorts the buckets of one unit and
writes its shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, Iterable, Iterator, List, Tuple

from electra_tf.data.corpus import CorpusFile, ReadStats, format_problem
from electra_tf.data.example_builder import PackedExample
from electra_tf.data.formats import InputSettings, iter_document_lines
from electra_tf.data.packing import PackSettings, PackStats, iter_examples
from electra_tf.data.shuffle import (BucketLayout, BucketWriter, bucket_path, gather_unit,
                                     key_base, shuffle_key_from_base)
from electra_tf.data.tfrecord_io import ExampleSerializer
from electra_tf.vocab import load_vocab

SERIALIZE_BATCH_IDS = 1 << 16  # ids per serialisation batch (512 examples at length 128)
MAX_LISTED_PROBLEMS = 100  # problem records returned per task (all go to inputs.jsonl)


class BuildError(ValueError):
    """Bad input or settings for the dataset builder; the message is one line naming the problem."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs (picklable: it crosses to a spawned process)."""

    vocab_file: str
    vocab_sha256: str
    do_lower_case: bool
    strip_accents: bool
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


class BuildWorker:
    """One process's state: the vocab, a lazily built tokenizer, the serializer."""

    def __init__(self, spec: WorkerSpec, worker_id: int):
        self.spec = spec
        self.worker_id = worker_id
        vocab = load_vocab(spec.vocab_file)
        if vocab.sha256 != spec.vocab_sha256:
            raise BuildError(
                f"vocab file {spec.vocab_file} changed while the dataset was being built")
        self.vocab = vocab
        self.serializer = ExampleSerializer(spec.pack.max_seq_length, vocab.special.cls_id,
                                            vocab.special.sep_id)
        self.batch_size = max(1, SERIALIZE_BATCH_IDS // spec.pack.max_seq_length)
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # imports TensorFlow: only workers that pack need it
            from electra_tf.data.tokenization import Tokenizer

            self._tokenizer = Tokenizer(self.vocab, do_lower_case=self.spec.do_lower_case,
                                        strip_accents=self.spec.strip_accents)
        return self._tokenizer

    # -------------------------------------------------------------------------------------------
    def pack(self, task: Tuple[int, List[CorpusFile]], report) -> dict:
        """Packs a task's files into this worker's bucket files.

        Args:
            task: (task index, files in relpath order).
            report: progress callback (keyword counters).

        Returns:
            {"read": ReadStats fields (problems: at most MAX_LISTED_PROBLEMS, in file order),
             "problems": total problem records, "pack": PackStats.to_dict()}.
        """
        task_index, files = task
        spec = self.spec
        writers = {split: BucketWriter(spec.shuffle_dir, split, spec.layouts[split],
                                       self.worker_id) for split in spec.pack.splits}
        read, stats = ReadStats(), PackStats()
        listed: List[dict] = []
        num_problems = 0
        with open(inputs_part_path(spec.shuffle_dir, task_index), "w", encoding="utf-8") as part:
            for corpus_file in files:
                file_read, file_stats = ReadStats(), PackStats()
                self._pack_file(corpus_file, file_read, file_stats, writers, report)
                problems = sorted(file_read.problems.values(), key=lambda e: e["problem"])
                num_problems += len(problems)
                listed += problems[:MAX_LISTED_PROBLEMS - len(listed)]
                file_read.problems = {}
                read.add(file_read)
                stats.add(file_stats)
                part.write(json.dumps(_input_entry(corpus_file, file_read, file_stats, problems))
                           + "\n")
                report(files=1)
        for writer in writers.values():
            writer.flush()
        result = dataclasses.asdict(read)
        result["problems"] = listed
        return {"read": result, "problems": num_problems, "pack": stats.to_dict()}

    def _pack_file(self, corpus_file: CorpusFile, read: ReadStats, stats: PackStats,
                   writers: Dict[str, BucketWriter], report) -> None:
        spec = self.spec
        bases = {split: key_base(spec.pack.seed, split, corpus_file.relpath)
                 for split in writers}
        pending: Dict[str, List[Tuple[int, PackedExample]]] = {split: [] for split in writers}
        lines = self._watched(iter_document_lines(corpus_file, spec.input, read), read, stats,
                              corpus_file, report)
        try:
            for split, index, example in iter_examples(corpus_file.relpath, lines,
                                                       self.tokenizer.encode_batch, spec.pack,
                                                       stats):
                batch = pending[split]
                batch.append((shuffle_key_from_base(bases[split], index), example))
                if len(batch) >= self.batch_size:
                    self._scatter(writers[split], batch, report)
                    pending[split] = []
        except OSError as e:
            raise BuildError(
                f"cannot read corpus file {corpus_file.path}: {e.strerror or e}") from e
        for split, batch in pending.items():
            self._scatter(writers[split], batch, report)

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
        if self.spec.strict_input and read.problems:
            first = next(iter(read.problems.values()))  # checked after every batch: the first
            raise BuildError(f"bad input in {corpus_file.path}: {format_problem(first)} "
                             f"(--bad-input skip counts such problems instead)")

    def _scatter(self, writer: BucketWriter, batch: List[Tuple[int, PackedExample]],
                 report) -> None:
        if not batch:
            return
        records = self.serializer.serialize([example for _, example in batch])
        for (key, _), record in zip(batch, records):
            writer.add(key, record)
        report(examples=len(batch))

    # -------------------------------------------------------------------------------------------
    def gather(self, unit: Tuple[str, range, range], report) -> Dict[int, int]:
        """Writes the shards of one unit (split, buckets, shards); returns {shard: records}."""
        split, buckets, shards = unit
        spec = self.spec
        writers = range(spec.num_writers)
        files = [[p for p in (bucket_path(spec.shuffle_dir, split, b, w) for w in writers)
                  if os.path.exists(p)] for b in buckets]
        return gather_unit(files, shards, spec.layouts[split].num_shards, spec.shard_paths[split],
                           spec.memory_bytes, spec.shuffle_dir,
                           report=lambda n: report(written=n))


def _input_entry(corpus_file: CorpusFile, read: ReadStats, stats: PackStats,
                 problems: List[dict]) -> dict:
    entry = {"file": corpus_file.relpath, "bytes": corpus_file.size,
             "text_bytes": read.bytes_read,
             "documents": sum(s.documents for s in stats.splits.values()),
             "examples": {split: s.examples for split, s in stats.splits.items()}}
    if problems:
        entry["problems"] = [{k: v for k, v in p.items() if k != "file"} for p in problems]
    return entry
