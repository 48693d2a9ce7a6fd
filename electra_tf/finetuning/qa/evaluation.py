"""The official QA evaluations: SQuAD 1.1, SQuAD 2.0 (with ELECTRA's options) and MRQA.

Shared (Exact): normalize(s) = lower-case, delete every ASCII punctuation character
(`string.punctuation`), replace the whole words a / an / the with a space, collapse whitespace:
"The  Cat's, hat!" -> "cats hat". EM = normalised strings equal. F1 over bags of normalised
tokens: common = multiset intersection, P = common / |pred|, R = common / |gold|, F1 = 2PR /
(P + R), 0 when nothing is common: F1("the cat sat", "cat sat down") = 0.8. A question takes its
best score over its gold answers; the figure is 100 x the mean.

- **SQuAD 1.1** (`evaluate_v1`): gold = every `answers[].text`; a question without a prediction
  scores 0 and still counts (official prints "Unanswered question"). -> exact_match, f1.
- **MRQA** (`evaluate_mrqa`, `skip_no_answer=True` as ELECTRA calls it): a question without a
  prediction is left out of the total. -> exact_match, f1.
- **SQuAD 2.0** (`evaluate_v2`): gold = the answer texts with a non-empty normalised form, or
  [""] when none; with an empty side, F1 = EM = (both empty). A question with null odds above
  `na_prob_thresh` (ELECTRA passes `qa_na_threshold` = -2.75, in answerable-logit units) scores 1
  if it is unanswerable and 0 otherwise; else its raw score stands. Reported, sorted:
  HasAns_exact/f1/total, NoAns_exact/f1/total (over the answerable / unanswerable questions),
  best_exact, best_exact_thresh, best_f1, best_f1_thresh (the oracle threshold: starting from
  "everything null", questions in ascending null odds each add their raw score if answerable and
  -1 if unanswerable with a non-empty prediction; the best running total and the null odds
  where it was reached), exact, f1, total. The official script raises KeyError in the
  HasAns/NoAns breakdown when a question has no prediction (QUIRK Q27); here the breakdowns
  cover the questions that have one (identical when all do).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Dict, List, Mapping, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (official)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def _token_f1(gold_tokens: List[str], pred_tokens: List[str]) -> float:
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_v1(gold: str, prediction: str) -> float:
    """SQuAD 1.1 / MRQA F1 (0 when nothing is common, even if both are empty)."""
    return _token_f1(normalize_answer(gold).split(), normalize_answer(prediction).split())


def f1_v2(gold: str, prediction: str) -> float:
    """SQuAD 2.0 F1: with an empty side, 1 if both are empty else 0."""
    gold_tokens = normalize_answer(gold).split() if gold else []
    pred_tokens = normalize_answer(prediction).split() if prediction else []
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    return _token_f1(gold_tokens, pred_tokens)


def _questions(dataset: Sequence[Mapping]):
    for article in dataset:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def evaluate_v1(dataset: Sequence[Mapping], predictions: Mapping[str, str]) -> Dict[str, float]:
    """The official SQuAD 1.1 evaluation. -> {"exact_match", "f1"}."""
    em = f1 = total = 0.0
    for qa in _questions(dataset):
        total += 1
        if qa["id"] not in predictions:
            continue  # official: "Unanswered question ... will receive score 0"
        golds = [a["text"] for a in qa["answers"]]
        prediction = predictions[qa["id"]]
        em += max(exact_match(g, prediction) for g in golds)
        f1 += max(f1_v1(g, prediction) for g in golds)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


def evaluate_mrqa(answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                  skip_no_answer: bool = True) -> Dict[str, float]:
    """The official MRQA evaluation (ELECTRA: skip_no_answer). -> {"exact_match", "f1"}."""
    em = f1 = total = 0.0
    for qid, golds in answers.items():
        if qid not in predictions:
            if not skip_no_answer:
                total += 1
            continue
        total += 1
        prediction = predictions[qid]
        em += max(exact_match(g, prediction) for g in golds)
        f1 += max(f1_v1(g, prediction) for g in golds)
    if total == 0:
        return {"exact_match": 0.0, "f1": 0.0}
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


def _eval_dict(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str]):
    total = len(qids)
    return {"exact": 100.0 * sum(exact[q] for q in qids) / total,
            "f1": 100.0 * sum(f1[q] for q in qids) / total, "total": total}


def best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float],
                   na_probs: Mapping[str, float], has_answer: Mapping[str, bool]):
    """(100 * best score / scored questions, threshold): the official `find_best_thresh`."""
    score = best = sum(1 for q in has_answer if not has_answer[q])
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        score += diff
        if score > best:
            best = score
            threshold = na_probs[qid]
    return 100.0 * best / len(scores), threshold


def evaluate_v2(dataset: Sequence[Mapping], predictions: Mapping[str, str],
                na_probs: Mapping[str, float], na_prob_thresh: float) -> Dict[str, float]:
    """The official SQuAD 2.0 evaluation with ELECTRA's options (module docstring).

    Returns:
        The 13 official keys, sorted by name.
    """
    has_answer: Dict[str, bool] = {}
    exact_raw: Dict[str, float] = {}
    f1_raw: Dict[str, float] = {}
    for qa in _questions(dataset):
        qid = qa["id"]
        has_answer[qid] = bool(qa["answers"])
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        if qid not in predictions:
            continue  # official: "Missing prediction for ..."
        prediction = predictions[qid]
        exact_raw[qid] = max(exact_match(g, prediction) for g in golds)
        f1_raw[qid] = max(f1_v2(g, prediction) for g in golds)

    def thresholded(scores):
        return {q: float(not has_answer[q]) if na_probs[q] > na_prob_thresh else s
                for q, s in scores.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    out = _eval_dict(exact, f1, list(exact))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in exact if has_answer[q] == wanted]
        if qids:
            for key, value in _eval_dict(exact, f1, qids).items():
                out[f"{prefix}_{key}"] = value
    out["best_exact"], out["best_exact_thresh"] = best_threshold(predictions, exact_raw, na_probs,
                                                                 has_answer)
    out["best_f1"], out["best_f1_thresh"] = best_threshold(predictions, f1_raw, na_probs, has_answer)
    return dict(sorted(out.items()))
