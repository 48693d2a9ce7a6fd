"""Packs tokenised sentences into pretraining examples: the official `ExampleBuilder` state machine.

This is a pure port of `build_pretraining_dataset.ExampleBuilder` (google-research/electra): it
takes token ids (tokenisation happens elsewhere, in batches) and returns packed segments; it does
no I/O and draws every random number from an injected `random.Random`, in the official order, so
tests can script the draws. The behaviour, quirks included, is section 1.3 of
`official_electra.md`:

* Sentences accumulate until their total length reaches `target_length`; the sentence that
  crosses the target is included, and whatever overflows `max_length` is truncated and dropped,
  never carried into the next example.
* A blank line (document end) flushes a non-empty buffer.
* With probability 0.1 the first-segment target is 100000 (one segment); otherwise it is
  `(target_length - 3) // 2`.
* A sentence joins the first segment if (a) the first segment is empty, (b) it fits strictly
  under the first-segment target, or (c) the second segment is still empty, the first segment is
  under target, and a 0.5 draw says so. (b) is checked for every sentence, so a short sentence
  after one placed in the second segment can still join the first (official reorder quirk,
  google-research/electra issue #20).
* Truncation uses `max_length`: first[:max_length - 2], then
  second[:max(0, max_length - len(first) - 3)].
* After each example, the next target is `randint(5, max_length)` with probability 0.05, else
  `max_length`.

Draw order per example (as in the official code): one `random()` for the single-segment choice;
then, for each sentence in order, one `random()` only when (a) and (b) both fail and the second
segment is empty and the first is under target (Python short-circuit); then one `random()` for
the 5% target choice, followed by one `randint(5, max_length)` only when that fires.
"""

from __future__ import annotations

import random
from typing import List, NamedTuple, Optional, Sequence

# Official constants (build_pretraining_dataset.py, ExampleBuilder._create_example).
SINGLE_SEGMENT_PROB = 0.1  # chance that an example keeps everything in the first segment
SINGLE_SEGMENT_TARGET = 100000  # first-segment target used when the single-segment draw fires
SECOND_SEGMENT_JOIN_PROB = 0.5  # condition (c): chance a target-crossing sentence stays in first
RANDOM_TARGET_PROB = 0.05  # chance the next example gets a random (shorter) target length
MIN_RANDOM_TARGET = 5  # lower bound (inclusive) of the random target length
NUM_SPECIAL_TOKENS = 3  # [CLS], [SEP], [SEP]: reserved when splitting and truncating


class PackedExample(NamedTuple):
    """The two token-id segments of one example, before [CLS]/[SEP] and padding are added.

    Attributes:
        first_segment: list[int]. Segment A token ids (never empty).
        second_segment: list[int]. Segment B token ids (empty for a single-segment example).
        num_dropped: int. Tokens of the packed sentences that truncation discarded.
    """

    first_segment: List[int]
    second_segment: List[int]
    num_dropped: int


class ExampleBuilder:
    """The official sentence-packing state machine, fed token ids.

    Args:
        max_length: int. `max_seq_length`; examples hold at most this many ids incl. specials.
        rng: random.Random. Source of every random draw (official order, see module docstring).

    Example:
        >>> builder = ExampleBuilder(128, random.Random(0))
        >>> for ids in sentences:
        ...     example = builder.add_sentence(ids)
        ...     if example: write(example)
        >>> example = builder.end_document()
    """

    def __init__(self, max_length: int, rng: random.Random):
        if max_length < MIN_RANDOM_TARGET:
            raise ValueError(f"max_length must be >= {MIN_RANDOM_TARGET}, got {max_length}")
        self.max_length = max_length
        self.rng = rng
        self._current_sentences: List[Sequence[int]] = []
        self._current_length = 0
        self._target_length = max_length

    @property
    def target_length(self) -> int:
        """The length at which the buffered sentences are flushed into an example."""
        return self._target_length

    @property
    def current_length(self) -> int:
        """Number of token ids buffered for the next example."""
        return self._current_length

    def add_sentence(self, token_ids: Sequence[int]) -> Optional[PackedExample]:
        """Adds one non-blank line's token ids (official `add_line` with a non-empty line).

        A line that tokenises to nothing is appended as an empty sentence, as in the official code
        (it never changes the output or the random draws).

        Returns:
            A `PackedExample` when the buffer reaches the target length, else None.
        """
        self._current_sentences.append(token_ids)
        self._current_length += len(token_ids)
        if self._current_length >= self._target_length:
            return self._create_example()
        return None

    def end_document(self) -> Optional[PackedExample]:
        """Handles a document boundary (official `add_line("")`): flushes a non-empty buffer.

        With an empty buffer the official code appends an empty sentence; that is kept for
        fidelity (it has no effect on any example).
        """
        if self._current_length != 0:
            return self._create_example()
        self._current_sentences.append([])
        return None

    def _create_example(self) -> PackedExample:
        rng = self.rng
        if rng.random() < SINGLE_SEGMENT_PROB:
            first_target = SINGLE_SEGMENT_TARGET
        else:
            # -3 leaves room for [CLS] and two [SEP]s; uses the *current* target length.
            first_target = (self._target_length - NUM_SPECIAL_TOKENS) // 2

        first: List[int] = []
        second: List[int] = []
        for sentence in self._current_sentences:
            if (
                not first
                or len(first) + len(sentence) < first_target
                or (not second and len(first) < first_target
                    and rng.random() < SECOND_SEGMENT_JOIN_PROB)
            ):
                first += sentence
            else:
                second += sentence

        total = len(first) + len(second)
        # Truncation uses max_length (not the target), accounting for the specials to be added.
        first = first[: self.max_length - 2]
        second = second[: max(0, self.max_length - len(first) - NUM_SPECIAL_TOKENS)]

        self._current_sentences = []
        self._current_length = 0
        if rng.random() < RANDOM_TARGET_PROB:
            self._target_length = rng.randint(MIN_RANDOM_TARGET, self.max_length)
        else:
            self._target_length = self.max_length
        return PackedExample(first, second, total - len(first) - len(second))


def example_features(example: PackedExample, max_length: int, cls_id: int, sep_id: int) -> dict:
    """The three padded features of an example (official `_make_tf_example`), as Python lists.

    input_ids = [CLS] + first + [SEP] (+ second + [SEP]); segment_ids are 0 through the first
    [SEP] and 1 after it; input_mask is 1 on real tokens; all zero-padded to `max_length`.
    This is the readable reference; `tfrecord_io.ExampleSerializer` is the fast path.

    Returns:
        {"input_ids", "input_mask", "segment_ids"}: each a list of `max_length` ints.
    """
    first, second = example.first_segment, example.second_segment
    input_ids = [cls_id] + list(first) + [sep_id]
    segment_ids = [0] * len(input_ids)
    if second:
        input_ids += list(second) + [sep_id]
        segment_ids += [1] * (len(second) + 1)
    n = len(input_ids)
    if n > max_length:
        raise ValueError(f"example of {n} ids exceeds max_length {max_length}")
    pad = [0] * (max_length - n)
    return {
        "input_ids": input_ids + pad,
        "input_mask": [1] * n + pad,
        "segment_ids": segment_ids + pad,
    }
