"""Per-file packing: document lines -> tokenised sentences -> packed examples, with stable ids.

Pure functions of their inputs (a tokenize function is injected; no I/O, no global state), so
the local builder and a distributed one (e.g. Apache Beam) produce the same examples:

* Every corpus file gets its own `random.Random` per split, seeded from (`seed`, the file's path
  relative to the corpus dir), and a fresh `ExampleBuilder`. (The official builder uses the
  unseeded global `random` and carries one builder's state across the files of a job. Because a
  document never spans files, the only effect of the reset is that the 5%-random target length
  does not carry over a file boundary.) So a file's examples depend only on (file, seed,
  settings), not on which process handles it.
* Held-out split: with `eval_fraction` > 0 the documents a first pass chose (`split`: keyed by
  their text, sized in tokens) go to "eval", given per file as their indices in file order;
  eval documents are packed by their own builder.
* Each example is identified by (split, file relpath, index): its position among the file's
  examples of that split. `shuffle.shuffle_key` turns that identity into the example's place in
  the globally shuffled output.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Callable, Collection, Dict, Iterable, Iterator, List, Tuple

import numpy as np

from electra_tf.data.build.example_builder import ExampleBuilder, PackedExample

SPLITS = ("train", "eval")
HISTOGRAM_BUCKET_WIDTH = 8  # example lengths (incl. specials) are counted in buckets 1-8, 9-16, ...

# (non-blank lines) -> (ids int [total], row_splits int [n + 1]), as `Tokenizer.encode_batch`.
EncodeBatch = Callable[[List[str]], Tuple[np.ndarray, np.ndarray]]


def derive_seed(seed: int, *parts: str) -> int:
    """A 64-bit seed from the user seed and labels (stable across runs, machines and Python).

    Labels are hashed as their UTF-8 bytes; a file name that is not valid UTF-8 (which Python
    hands over with surrogate escapes) as its original bytes.
    """
    text = "\0".join((str(seed),) + parts)
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big")


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

    def count(self, example: PackedExample) -> None:
        """Adds one example (its length with [CLS] and [SEP]s) to the counts."""
        n = len(example.first_segment) + 2
        if example.second_segment:
            n += len(example.second_segment) + 1
        else:
            self.single_segment += 1
        self.examples += 1
        self.tokens += n
        self.truncated_tokens += example.num_dropped
        bucket = (n - 1) // HISTOGRAM_BUCKET_WIDTH
        if bucket >= len(self.length_histogram):
            self.length_histogram += [0] * (bucket + 1 - len(self.length_histogram))
        self.length_histogram[bucket] += 1


@dataclasses.dataclass(frozen=True)
class PackSettings:
    """Settings of packing (the same for every file of a build)."""

    max_seq_length: int
    seed: int
    eval_fraction: float
    unk_id: int

    @property
    def splits(self) -> Tuple[str, ...]:
        return SPLITS if self.eval_fraction > 0 else SPLITS[:1]


@dataclasses.dataclass
class PackStats:
    """What packing counted: per-split stats, tokens tokenised and [UNK]s among them."""

    splits: Dict[str, SplitStats] = dataclasses.field(
        default_factory=lambda: {split: SplitStats() for split in SPLITS})
    tokenized_tokens: int = 0
    unk_tokens: int = 0

    def add(self, other: "PackStats") -> None:
        for split in SPLITS:
            self.splits[split].add(other.splits[split])
        self.tokenized_tokens += other.tokenized_tokens
        self.unk_tokens += other.unk_tokens

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PackStats":
        return cls({s: SplitStats(**v) for s, v in data["splits"].items()},
                   data["tokenized_tokens"], data["unk_tokens"])


def iter_examples(relpath: str, line_batches: Iterable[List[str]], encode_batch: EncodeBatch,
                  settings: PackSettings, stats: PackStats, held_out: Collection[int] = ()
                  ) -> Iterator[Tuple[str, int, PackedExample]]:
    """Packs one file's documents into examples (see the module docstring).

    Args:
        relpath: str. The file's path relative to the corpus dir (seeds its draws).
        line_batches: batches of stripped lines, "" ending a document (`formats`); the end of
            the file ends a document too.
        encode_batch: tokenises a list of lines in one call (`Tokenizer.encode_batch`).
        settings: PackSettings.
        stats: PackStats, updated in place.
        held_out: indices (in file order, from 0) of the file's documents that go to "eval"
            (`split.FileSplit.held_out`); needs `settings.eval_fraction` > 0.

    Yields:
        (split, index, example): index counts the file's examples of that split from 0.
    """
    builders = {split: ExampleBuilder(settings.max_seq_length, random.Random(
        derive_seed(settings.seed, "pack", split, relpath))) for split in settings.splits}
    index = dict.fromkeys(settings.splits, 0)
    split = None  # the split of the open document; None between documents
    document = -1  # the open document's index in the file

    def emitted(example):
        stats.splits[split].count(example)
        index[split] += 1
        return split, index[split] - 1, example

    for lines in line_batches:
        nonblank = [line for line in lines if line]
        if nonblank:
            ids, row_splits = encode_batch(nonblank)
            stats.tokenized_tokens += int(ids.shape[0])
            stats.unk_tokens += int(np.count_nonzero(ids == settings.unk_id))
            ids, row_splits = ids.tolist(), row_splits.tolist()
        k = 0
        for line in lines:
            if not line:
                # Official: blank lines reach the builder only when they separate documents
                # (between documents they would append an empty sentence, which changes nothing).
                if split is not None:
                    example = builders[split].end_document()
                    if example:
                        yield emitted(example)
                    split = None
                continue
            if split is None:
                document += 1
                split = "eval" if document in held_out else "train"
                stats.splits[split].documents += 1
            stats.splits[split].sentences += 1
            example = builders[split].add_sentence(ids[row_splits[k]:row_splits[k + 1]])
            k += 1
            if example:
                yield emitted(example)
    if split is not None:  # the end of a file always ends a document
        example = builders[split].end_document()
        if example:
            yield emitted(example)
