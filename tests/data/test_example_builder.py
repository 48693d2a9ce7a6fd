"""The official ExampleBuilder state machine (parity checklist items 1-6 of official_electra.md)."""

import random

import pytest

from electra_tf.data.build.example_builder import ExampleBuilder, PackedExample, example_features

CLS, SEP = 101, 102


class ScriptedRandom:
    """A `random.Random` stand-in that returns scripted draws and checks their order and kind."""

    def __init__(self, *script):
        self.script = list(script)

    def random(self):
        assert self.script, "unexpected extra random() draw"
        kind, value = self.script.pop(0)
        assert kind == "random", f"expected a {kind} draw, got random()"
        return value

    def randint(self, a, b):
        assert self.script, "unexpected extra randint() draw"
        kind, value = self.script.pop(0)
        assert kind == ("randint", a, b), f"expected {kind}, got randint({a}, {b})"
        return value

    def assert_exhausted(self):
        assert not self.script, f"draws not taken: {self.script}"


def R(value):  # a scripted random() draw
    return ("random", value)


def seq(start, n):
    return list(range(start, start + n))


def feed(builder, sentences):
    """Adds sentences; returns (index of the emitting sentence, example) pairs."""
    out = []
    for i, s in enumerate(sentences):
        ex = builder.add_sentence(s)
        if ex is not None:
            out.append((i, ex))
    return out


def test_two_segment_example_exact_features():
    # target 16 -> first-segment target (16 - 3) // 2 = 6.
    rng = ScriptedRandom(R(0.5),  # not single-segment
                         R(0.7),  # B crosses the first target, (c) draw >= 0.5 -> second segment
                         R(0.9))  # next target: max_length
    builder = ExampleBuilder(16, rng)
    a, b, c, d = seq(1, 3), seq(4, 4), seq(8, 5), seq(13, 4)
    emitted = feed(builder, [a, b, c, d])
    rng.assert_exhausted()
    # Emitted by the sentence that reached the target (3 + 4 + 5 + 4 = 16), which is included.
    assert [i for i, _ in emitted] == [3]
    ex = emitted[0][1]
    # first = A; second = B + C + D truncated to max(0, 16 - 3 - 3) = 10 tokens; 3 dropped.
    assert ex == PackedExample(a, seq(4, 10), 3)
    features = example_features(ex, 16, CLS, SEP)
    assert features["input_ids"] == [CLS, 1, 2, 3, SEP] + seq(4, 10) + [SEP]
    assert features["segment_ids"] == [0] * 5 + [1] * 11
    assert features["input_mask"] == [1] * 16
    assert builder.current_length == 0 and builder.target_length == 16


def test_padding_and_single_segment_features():
    features = example_features(PackedExample([7, 8], [], 0), 8, CLS, SEP)
    assert features == {"input_ids": [CLS, 7, 8, SEP, 0, 0, 0, 0],
                        "input_mask": [1, 1, 1, 1, 0, 0, 0, 0],
                        "segment_ids": [0, 0, 0, 0, 0, 0, 0, 0]}
    features = example_features(PackedExample([7], [9], 0), 8, CLS, SEP)
    assert features == {"input_ids": [CLS, 7, SEP, 9, SEP, 0, 0, 0],
                        "input_mask": [1, 1, 1, 1, 1, 0, 0, 0],
                        "segment_ids": [0, 0, 0, 1, 1, 0, 0, 0]}


def test_reorder_quirk_short_sentence_joins_first_segment_after_second_started():
    # target 20 -> first target 8. A (5) first; B (7): 12 !< 8, draw 0.9 -> second;
    # C (2): 5 + 2 < 8 -> FIRST (condition (b) is checked for every sentence); D (6) -> second,
    # which is then truncated to 20 - 7 - 3 = 10 tokens.
    rng = ScriptedRandom(R(0.5), R(0.9), R(0.5))
    builder = ExampleBuilder(20, rng)
    a, b, c, d = seq(1, 5), seq(10, 7), seq(20, 2), seq(30, 6)
    (i, ex), = feed(builder, [a, b, c, d])
    rng.assert_exhausted()
    assert i == 3
    assert ex == PackedExample(a + c, (b + d)[:10], 3)


def test_condition_c_draw_below_half_keeps_sentence_in_first_and_short_circuits():
    # B crosses the first target (6) with draw 0.2 -> first. For C, len(first) = 7 >= 6, so (c)
    # fails before its draw: no draw is taken (the scripted RNG would fail on an extra one).
    rng = ScriptedRandom(R(0.5), R(0.2), R(0.9))
    builder = ExampleBuilder(16, rng)
    a, b, c = seq(1, 3), seq(4, 4), seq(8, 9)
    (i, ex), = feed(builder, [a, b, c])
    rng.assert_exhausted()
    assert ex == PackedExample(a + b, seq(8, 6), 3)  # second[: 16 - 7 - 3]


def test_single_segment_draw_puts_everything_in_first_and_truncates_to_max_minus_2():
    rng = ScriptedRandom(R(0.05), R(0.9))  # 0.05 < 0.1 -> first target 100000
    builder = ExampleBuilder(10, rng)
    (i, ex), = feed(builder, [seq(1, 4), seq(5, 4), seq(9, 4)])
    rng.assert_exhausted()
    assert ex == PackedExample(seq(1, 8), [], 4)
    assert example_features(ex, 10, CLS, SEP)["input_ids"] == [CLS] + seq(1, 8) + [SEP]


@pytest.mark.parametrize("first_len,second_kept", [(14, 0), (13, 0), (12, 1), (10, 3)])
def test_truncation_of_second_segment_uses_max_length(first_len, second_kept):
    # A long first sentence (always first by condition (a)); the second keeps
    # max(0, 16 - len(first) - 3) tokens and the total never exceeds max_length.
    rng = ScriptedRandom(R(0.5), R(0.9))
    builder = ExampleBuilder(16, rng)
    (i, ex), = feed(builder, [seq(1, first_len), seq(100, 10)])
    rng.assert_exhausted()
    assert ex.first_segment == seq(1, first_len)
    assert ex.second_segment == seq(100, second_kept)
    assert ex.num_dropped == 10 - second_kept
    assert len(example_features(ex, 16, CLS, SEP)["input_ids"]) == 16


def test_overflow_is_dropped_not_carried_and_random_target_is_used():
    # Example 1: the second sentence cannot join the first segment (14 >= 6, no (c) draw) and is
    # truncated away; then the 5% draw fires and randint(5, 16) gives 7.
    rng = ScriptedRandom(R(0.5), R(0.01), (("randint", 5, 16), 7),
                         # Example 2: target 7 -> first target (7 - 3) // 2 = 2; no (c) draw
                         # because len(first) = 2 is not < 2; then the next target is max.
                         R(0.5), R(0.5))
    builder = ExampleBuilder(16, rng)
    (_, ex1), = feed(builder, [seq(1, 14), seq(20, 7)])
    assert ex1 == PackedExample(seq(1, 14), [], 7)
    assert builder.target_length == 7 and builder.current_length == 0
    # Nothing of the overflow is carried: the next example holds only new sentences.
    emitted = feed(builder, [[50, 51], [52, 53], [54, 55, 56]])
    rng.assert_exhausted()
    assert [i for i, _ in emitted] == [2]  # 2 + 2 + 3 >= 7
    # [50, 51] first; [52, 53]: 4 !< 2 and (c) fails -> second; [54..56] -> second.
    assert emitted[0][1] == PackedExample([50, 51], [52, 53, 54, 55, 56], 0)
    assert builder.target_length == 16


def test_end_document_flushes_non_empty_buffer_only():
    rng = ScriptedRandom(R(0.5), R(0.9))
    builder = ExampleBuilder(128, rng)
    assert builder.end_document() is None  # empty buffer: no example, no draw
    assert builder.add_sentence([1, 2]) is None
    assert builder.add_sentence([]) is None  # a line that tokenised to nothing
    assert builder.add_sentence([3]) is None
    ex = builder.end_document()
    rng.assert_exhausted()
    assert ex == PackedExample([1, 2, 3], [], 0)  # all fit under the first target (62)
    assert builder.end_document() is None


def _official_reference(lines, max_length, rng):
    """A literal transcription of the official ExampleBuilder over pre-tokenised lines.

    `lines` holds token-id lists, or None for a blank line (add_line("")).
    """
    sentences, length, target, out = [], 0, max_length, []

    def create():
        nonlocal sentences, length, target
        ft = 100000 if rng.random() < 0.1 else (target - 3) // 2
        first, second = [], []
        for s in sentences:
            if (len(first) == 0 or len(first) + len(s) < ft or
                    (len(second) == 0 and len(first) < ft and rng.random() < 0.5)):
                first += s
            else:
                second += s
        first = first[:max_length - 2]
        second = second[:max(0, max_length - len(first) - 3)]
        sentences, length = [], 0
        target = rng.randint(5, max_length) if rng.random() < 0.05 else max_length
        return first, second

    for line in lines:
        if line is None and length != 0:
            out.append(create())
            continue
        ids = line or []
        sentences.append(ids)
        length += len(ids)
        if length >= target:
            out.append(create())
    return out


@pytest.mark.parametrize("seed", range(3))
def test_matches_official_transcription_with_a_seeded_rng(seed):
    data_rng = random.Random(1000 + seed)
    lines = []
    for _ in range(3000):
        u = data_rng.random()
        if u < 0.1:
            lines.append(None)
        elif u < 0.12:
            lines.append([])
        else:
            n = data_rng.choice([1, 2, 5, 10, 20, 40, 70, 150])
            lines.append([data_rng.randrange(1000, 2000) for _ in range(data_rng.randint(1, n))])
    expected = _official_reference(lines, 64, random.Random(seed))
    builder = ExampleBuilder(64, random.Random(seed))
    got = []
    for line in lines:
        ex = builder.end_document() if line is None else builder.add_sentence(line)
        if ex is not None:
            got.append((ex.first_segment, ex.second_segment))
    assert len(got) > 300
    assert got == expected


def test_random_target_draw_statistics():
    # The next target is uniform in [5, max_length] with p = 0.05, else max_length.
    max_length, n = 32, 40000
    builder = ExampleBuilder(max_length, random.Random(7))
    targets = []
    while len(targets) < n:
        if builder.add_sentence([1]) is not None:
            targets.append(builder.target_length)
    drawn = [t for t in targets if t != max_length]
    # P(target != max) = 0.05 * (1 - 1/28) (randint can return max_length itself).
    p = 0.05 * (1 - 1 / (max_length - 4))
    assert abs(len(drawn) / n - p) < 5 * (p * (1 - p) / n) ** 0.5
    assert min(drawn) == 5 and max(drawn) == max_length - 1
    mean = sum(drawn) / len(drawn)
    assert abs(mean - (5 + max_length - 1) / 2) < 1.0  # uniform over [5, max_length - 1] here


def test_single_segment_draw_statistics():
    # Sentences of one token: without the single-segment draw, the first segment stops at the
    # first target and the rest goes to the second, so single-segment examples are exactly the
    # ones whose 0.1 draw fired.
    n = 20000
    builder = ExampleBuilder(32, random.Random(11))
    single = total = 0
    while total < n:
        ex = builder.add_sentence([1])
        if ex is not None:
            total += 1
            single += not ex.second_segment
    assert abs(single / n - 0.1) < 5 * (0.1 * 0.9 / n) ** 0.5


def test_rejects_max_length_below_random_target_minimum():
    with pytest.raises(ValueError, match="max_length"):
        ExampleBuilder(4, random.Random(0))
