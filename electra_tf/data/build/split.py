"""The held-out split: which documents go to eval, keyed by their content and sized in tokens.

Rule version 2 (issue 35; version 1 was a seeded draw per document keyed by the file's name):

1. *Key* (`DocumentKey`): a document's key is the first 8 bytes of the sha256 of its normalised
   text (Unicode NFC, every run of whitespace, line ends included, one space, no leading or
   trailing space). A renamed, reordered, re-wrapped, CRLF or compressed copy of a document has
   the same key; so has a copy of it in another file.
2. *Survey* (`survey_file`, a first pass over the corpus): each document's key and its number of
   WordPiece tokens, one small record per document (16 bytes).
3. *Selection* (`select_held_out`): documents with the same key are one unit (every copy goes to
   the same side, so a duplicate never leaks from train into eval; copies are kept, not
   removed). Units are visited in key order, a uniformly random order that depends only on the
   texts, and taken until the held-out tokens reach `fraction` of all tokens; a unit that would
   take them above `1 + SHARE_TOLERANCE` times that target is skipped (it stays in train), so
   one huge document cannot overshoot the share, and nothing that would leave train without
   tokens is taken. If no unit fits, the smallest one is held out (at least one document, as long
   as the corpus has two distinct texts).
4. *Packing* (`packing.iter_examples`, the second pass): each file gets the indices of its held-out
   documents (`FileSplit`); its counts are checked against the survey's, so a file that changed
   between the passes fails the build instead of splitting the wrong documents.

The selection is a pure function of the multiset of (key, tokens) records, so it is the same
whatever the file names, their order, their compression, the number of processes or the engine
(the local builder and Apache Beam call the same functions).
"""

from __future__ import annotations

import dataclasses
import hashlib
import unicodedata
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

SPLIT_RULE_VERSION = 2  # 1: a seeded draw per document, keyed by the file's name (before issue 35)
SHARE_TOLERANCE = 0.1  # the held-out token share aims within this relative distance of the target
_KEY_BYTES = 8
_WALK_CHUNK = 1 << 16  # units converted to Python ints at a time by the selection walk

# (non-blank lines) -> (ids [total], row_splits [n + 1]), as `Tokenizer.encode_batch`.
EncodeBatch = Callable[[List[str]], Tuple[np.ndarray, np.ndarray]]


class DocumentKey:
    """Hashes a document's normalised text line by line (memory: one line at a time)."""

    def __init__(self):
        self._hash = hashlib.sha256()
        self._empty = True

    def add(self, line: str) -> None:
        """Adds one line of the document (its line end counts as whitespace)."""
        if not unicodedata.is_normalized("NFC", line):
            line = unicodedata.normalize("NFC", line)
        words = line.split()
        if not words:
            return
        text = " ".join(words)
        # Lines are joined by one space, so only the words and their order matter.
        self._hash.update((text if self._empty else " " + text).encode("utf-8", "surrogatepass"))
        self._empty = False

    def key(self) -> int:
        """The document's key: an unsigned 64-bit integer."""
        return int.from_bytes(self._hash.digest()[:_KEY_BYTES], "big")


def document_key(lines: Iterable[str]) -> int:
    """The key of a document given as its lines (`DocumentKey`)."""
    hasher = DocumentKey()
    for line in lines:
        hasher.add(line)
    return hasher.key()


@dataclasses.dataclass(frozen=True)
class FileSurvey:
    """One corpus file's documents in file order: keys uint64 [n] and WordPiece tokens int64 [n]."""

    keys: np.ndarray
    tokens: np.ndarray

    def to_bytes(self) -> Tuple[bytes, bytes]:
        """A portable form (for Beam's coders)."""
        return self.keys.astype("<u8").tobytes(), self.tokens.astype("<i8").tobytes()

    @classmethod
    def from_bytes(cls, keys: bytes, tokens: bytes) -> "FileSurvey":
        return cls(np.frombuffer(keys, "<u8").astype(np.uint64),
                   np.frombuffer(tokens, "<i8").astype(np.int64))


def survey_file(line_batches: Iterable[List[str]], encode_batch: EncodeBatch,
                on_tokens: Optional[Callable[[int], None]] = None) -> FileSurvey:
    """The survey of one file: each document's key and token count (documents as `packing` sees
    them: runs of non-blank lines, "" or the file's end closing one).

    Args:
        line_batches: batches of stripped lines, "" ending a document (`formats`).
        encode_batch: tokenises a list of lines (`Tokenizer.encode_batch`).
        on_tokens: called with each batch's number of tokens (counters, progress).
    """
    keys: List[int] = []
    tokens: List[int] = []
    hasher, count = None, 0
    for lines in line_batches:
        nonblank = [line for line in lines if line]
        lengths = np.diff(encode_batch(nonblank)[1]).tolist() if nonblank else []
        if on_tokens is not None:
            on_tokens(int(sum(lengths)))
        k = 0
        for line in lines:
            if not line:
                if hasher is not None:
                    keys.append(hasher.key())
                    tokens.append(count)
                    hasher = None
                continue
            if hasher is None:
                hasher, count = DocumentKey(), 0
            hasher.add(line)
            count += lengths[k]
            k += 1
    if hasher is not None:
        keys.append(hasher.key())
        tokens.append(count)
    return FileSurvey(np.array(keys, np.uint64), np.array(tokens, np.int64))


@dataclasses.dataclass(frozen=True)
class FileSplit:
    """What the packing pass needs of one file: its held-out document indices (file order) and
    the survey's counts, which the packing pass must find again."""

    held_out: frozenset
    documents: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """The held-out split of a corpus: per file (relpath) its `FileSplit`, and the manifest's
    `eval_split` entry (`summary`)."""

    files: Dict[str, FileSplit]
    summary: dict


def select_held_out(tokens: np.ndarray, fraction: float,
                    tolerance: float = SHARE_TOLERANCE) -> np.ndarray:
    """The held-out units of the rule (module docstring, step 3).

    Args:
        tokens: int64 [n], each unit's tokens, in key order.
        fraction: the target share of tokens, in (0, 1).
        tolerance: a unit is skipped if it would take the share above (1 + tolerance) * target.

    Returns:
        int64 [m]: the indices of the held-out units, ascending.
    """
    total = int(tokens.sum())
    target = fraction * total
    upper = min(target * (1 + tolerance), total - 1)  # never all: train keeps a token
    taken, held = [], 0
    for start in range(0, len(tokens), _WALK_CHUNK):
        for i, count in enumerate(tokens[start:start + _WALK_CHUNK].tolist(), start):
            if held >= target:
                break
            if held + count <= upper:
                taken.append(i)
                held += count
        if held >= target:
            break
    if not taken and len(tokens) > 1:
        smallest = int(np.argmin(tokens))  # the first of the smallest: the smallest key
        if tokens[smallest] < total:
            taken.append(smallest)
    return np.array(taken, np.int64)


def plan_split(surveys: Iterable[Tuple[str, FileSurvey]], fraction: float) -> SplitPlan:
    """The held-out split of a corpus from its files' surveys (any order of files).

    Args:
        surveys: (relpath, FileSurvey) of every corpus file.
        fraction: --eval-fraction, in (0, 1).

    Returns:
        SplitPlan. Memory: a few copies of the survey records (16 bytes per document).
    """
    surveys = sorted(surveys, key=lambda item: item[0])
    keys = np.concatenate([s.keys for _, s in surveys] + [np.zeros(0, np.uint64)])
    tokens = np.concatenate([s.tokens for _, s in surveys] + [np.zeros(0, np.int64)])
    unit_keys, inverse, copies = np.unique(keys, return_inverse=True, return_counts=True)
    unit_tokens = np.zeros(len(unit_keys), np.int64)
    np.add.at(unit_tokens, inverse, tokens)
    chosen = select_held_out(unit_tokens, fraction)
    held_keys = unit_keys[chosen]
    files, held_documents = {}, 0
    for relpath, survey in surveys:
        position = np.minimum(np.searchsorted(held_keys, survey.keys), max(len(held_keys) - 1, 0))
        held = (np.flatnonzero(held_keys[position] == survey.keys) if len(held_keys)
                else np.zeros(0, np.int64))
        held_documents += len(held)
        files[relpath] = FileSplit(frozenset(held.tolist()), len(survey.keys),
                                   int(survey.tokens.sum()))
    total, held_tokens = int(tokens.sum()), int(unit_tokens[chosen].sum())
    summary = {"rule_version": SPLIT_RULE_VERSION, "target_fraction": fraction,
               "tolerance": SHARE_TOLERANCE, "token_fraction": held_tokens / max(total, 1),
               "held_out_tokens": held_tokens, "tokens": total,
               "held_out_documents": held_documents, "documents": len(keys),
               "duplicate_documents": int(len(keys) - len(unit_keys)),
               "within_tolerance": bool(abs(held_tokens - fraction * total)
                                        <= SHARE_TOLERANCE * fraction * total)}
    return SplitPlan(files, summary)


def no_split_summary() -> dict:
    """The manifest's `eval_split` entry of a build with --eval-fraction 0 (no survey)."""
    return {"rule_version": SPLIT_RULE_VERSION, "target_fraction": 0.0}


def split_warning(summary: dict) -> Optional[str]:
    """The warning line of a split whose token share missed the tolerance (documents too large
    for the target, or too few), or None; `summary` is the manifest's `eval_split`."""
    if summary.get("within_tolerance", True):
        return None
    return (f"the held-out documents hold {100 * summary['token_fraction']:.2f}% of the tokens, "
            f"not within {100 * summary['tolerance']:.0f}% of --eval-fraction "
            f"{summary['target_fraction']:g} ({summary['held_out_documents']} of "
            f"{summary['documents']} documents: too few or too large documents for that share)")
