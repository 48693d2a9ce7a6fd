"""The held-out split's rule (pure functions): content keys, the token-sized selection, the plan."""

import random

import numpy as np
import pytest

from electra_tf.data.build.split import (SHARE_TOLERANCE, SPLIT_RULE_VERSION, FileSurvey,
                                   document_key, plan_split, select_held_out, split_warning,
                                   survey_file)


def test_document_key_is_the_normalised_text():
    key = document_key(["Café au lait,", "served hot."])
    assert key == document_key(["Cafe\u0301 au  lait,\tserved", "hot."])  # NFD, spaces, wrap
    assert key == document_key(["  Café au lait, served hot.  "])
    assert key != document_key(["café au lait, served hot."])  # case is content
    assert key != document_key(["Café au lait,", "served cold."])
    assert 0 <= key < 1 << 64


def test_survey_counts_documents_as_packing_does():
    def encode_batch(lines):  # one token per word
        lengths = [len(line.split()) for line in lines]
        return np.zeros(sum(lengths), np.int32), np.cumsum([0] + lengths)

    batches = [["a b", "c", "", "", "d e f"], ["g", ""], ["", "h"]]
    survey = survey_file(batches, encode_batch)
    assert survey.tokens.tolist() == [3, 4, 1]
    assert survey.keys.tolist() == [document_key(["a b c"]), document_key(["d e f g"]),
                                    document_key(["h"])]
    again = FileSurvey.from_bytes(*survey.to_bytes())
    assert again.keys.tolist() == survey.keys.tolist()
    assert again.tokens.tolist() == survey.tokens.tolist()


def share(tokens, taken):
    return tokens[taken].sum() / tokens.sum()


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.05, 0.2, 0.5])
@pytest.mark.parametrize("position", [0, 500, 1000])
def test_share_within_tolerance_with_one_document_100x_the_others(fraction, position):
    rng = np.random.default_rng(0)
    tokens = rng.integers(50, 150, 1000)
    tokens = np.insert(tokens, position, 100 * 100)  # 100x the mean, wherever its key falls
    taken = select_held_out(tokens, fraction)
    assert abs(share(tokens, taken) - fraction) <= SHARE_TOLERANCE * fraction
    assert len(set(taken.tolist())) == len(taken) >= 1
    if fraction * tokens.sum() * (1 + SHARE_TOLERANCE) < 100 * 100:
        assert position not in taken  # it would overshoot: skipped, in train


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fraction", [0.005, 0.01, 0.1])
def test_share_within_tolerance_on_heavy_tailed_sizes(seed, fraction):
    # Pareto sizes (alpha 1.1: the largest document holds a good part of the corpus), as
    # 12,744 real documents whose old per-document draw held out 0.5% to 4.9% of the tokens.
    rng = np.random.default_rng(seed)
    tokens = np.ceil(20 * (1 + rng.pareto(1.1, 12744))).astype(np.int64)
    taken = select_held_out(tokens, fraction)
    assert abs(share(tokens, taken) - fraction) <= SHARE_TOLERANCE * fraction
    # Taken in key order: all before the last taken unit either taken or too large to fit.
    upper = fraction * tokens.sum() * (1 + SHARE_TOLERANCE)
    skipped = sorted(set(range(taken[-1])) - set(taken.tolist()))
    held_before = np.cumsum([tokens[i] if i in set(taken.tolist()) else 0
                             for i in range(taken[-1])])
    for i in skipped:
        assert (held_before[i - 1] if i else 0) + tokens[i] > upper


def test_at_least_one_document_and_never_all():
    assert select_held_out(np.array([50, 40, 60]), 0.01).tolist() == [1]  # the smallest
    assert select_held_out(np.array([50, 40, 40]), 0.01).tolist() == [1]  # ties: first key
    assert select_held_out(np.array([500]), 0.5).tolist() == []  # train keeps its one text
    assert select_held_out(np.array([1, 1]), 0.9).tolist() == [0]  # never every token
    assert select_held_out(np.array([0, 0]), 0.5).tolist() == []


def survey_of(documents):
    return FileSurvey(np.array([document_key([d]) for d in documents], np.uint64),
                      np.array([len(d.split()) for d in documents], np.int64))


def corpus_texts(num, seed):
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(5000)}" for _ in range(rng.randint(5, 40)))
            for _ in range(num)]


def held_texts(plan, files):
    return sorted(files[path][i] for path, fs in plan.files.items() for i in fs.held_out)


def test_plan_ignores_file_names_and_order_and_keeps_duplicates_on_one_side():
    texts = corpus_texts(400, seed=1)
    # The duplicate: the text with the smallest key, so the walk takes it first.
    dup = min(texts, key=lambda t: document_key([t]))
    files = {"a.txt": texts[:200] + [dup], "b.txt": texts[200:]}
    plan = plan_split([(p, survey_of(d)) for p, d in files.items()], 0.1)
    copies = {(p, i) for p, docs in files.items() for i, d in enumerate(docs) if d == dup}
    assert len(copies) == 2
    assert all(i in plan.files[p].held_out for p, i in copies)  # both copies: eval
    summary = plan.summary
    assert summary["rule_version"] == SPLIT_RULE_VERSION == 2
    assert summary["duplicate_documents"] == 1 and summary["documents"] == 401
    assert summary["held_out_documents"] == len(held_texts(plan, files))
    assert summary["within_tolerance"] and split_warning(summary) is None
    assert abs(summary["token_fraction"] - 0.1) <= 0.01
    # Renamed, reordered (within and across files): the same held-out texts.
    rng = random.Random(7)
    shuffled = texts + [dup]
    rng.shuffle(shuffled)
    renamed = {"z/1.txt": shuffled[:150], "m.txt.gz": shuffled[150:]}
    replan = plan_split([(p, survey_of(d)) for p, d in reversed(renamed.items())], 0.1)
    assert held_texts(replan, renamed) == held_texts(plan, files)
    assert replan.summary == summary


def test_warning_names_a_share_off_the_target():
    files = {"a.txt": ["one two three four", "five six seven eight nine"]}
    plan = plan_split([(p, survey_of(d)) for p, d in files.items()], 0.01)
    assert plan.summary["held_out_documents"] == 1 and not plan.summary["within_tolerance"]
    assert split_warning(plan.summary) == (
        "the held-out documents hold 44.44% of the tokens, not within 10% of --eval-fraction "
        "0.01 (1 of 2 documents: too few or too large documents for that share)")
