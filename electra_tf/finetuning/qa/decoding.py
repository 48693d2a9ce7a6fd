"""N-best decoding of the QA head's outputs (official `SpanBasedQAScorer.write_predictions`).

Per question, over its windows in order:

1. Candidates: joint prediction: every (start_top_index[i], end_top_index[i, j]) with scores
   start_top_log_probs[i] and end_top_log_probs[i, j] (`beam_size` x `beam_size`; n_best_size
   does not limit the beam); otherwise the `n_best_size` best starts x the `n_best_size` best
   ends of the raw (masked) logits, scored by the logits.
2. A candidate is dropped if: start or end is past the record's tokens; start is 0; start or end
   is not a context token (the query, [CLS] and both [SEP]s are not); the window is not the
   start's max-context window (the end's is not checked); end < start; or it spans more than
   `max_answer_length` sub-tokens.
3. Null score (SQuAD 2.0): the minimum over windows of answerable_logit (without the classifier:
   start_logits[0] + end_logits[0]); 1e6 when the question has no window.
4. Candidates of all windows are sorted by score_start + score_end, descending, stably (ties keep
   window, start, end order).
5. N-best: walking that list, the text of a candidate is `get_final_text` of its sub-tokens
   (joined by spaces, " ##" and then any "##" removed, whitespace collapsed) against the words
   it covers (joined by single spaces); a text already seen is skipped; at most n_best_size
   texts. None left: the single text "empty" (QUIRK Q22, mirrored).
6. Prediction: SQuAD 1.1 / MRQA: the first n-best text; SQuAD 2.0: the first non-empty one, with
   null odds = the null score (classifier) or null score - the best non-null score; the "no
   answer" decision is the evaluation's (`qa_na_threshold`).

`get_final_text(pred, orig)`: BasicTokenize orig and join with spaces; find the first occurrence
of pred in it (none: orig); delete spaces from both (lengths differ: orig); map the match's first
and last characters back to orig through the space-free alignment and return that slice:
("steve smith", "Steve Smith's") -> "Steve Smith", ("1895", "(1895-1943).") -> "1895".
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from electra_tf.data.text.portable_tokenization import BasicTokenizer
from electra_tf.finetuning.qa.features import DocTokens, WindowInfo

EMPTY_PREDICTION = "empty"  # official text when no candidate survives
NULL_SCORE_INIT = 1e6  # official initial null score ("large and positive")
# Candidates whose texts are computed in one tokenizer call before walking the n-best list.
PREFETCH_FACTOR = 3


class Candidate(NamedTuple):
    record: int  # index of the window's record in the split
    start: int
    end: int
    start_score: float
    end_score: float


class NBestEntry(NamedTuple):
    text: str
    start_score: float
    end_score: float
    record: int = -1
    start: int = -1
    end: int = -1


def best_indexes(logits: np.ndarray, n: int) -> np.ndarray:
    """The n highest positions, ties to the lower index (official `_get_best_indexes`)."""
    return np.argsort(-np.asarray(logits), kind="stable")[:n]


def window_candidates(info: WindowInfo, record: int, outputs: Dict[str, np.ndarray],
                      joint_prediction: bool, n_best_size: int,
                      max_answer_length: int) -> List[Candidate]:
    """The surviving candidates of one record, in the official generation order."""
    if joint_prediction:
        starts = outputs["start_top_index"][record]
        ends = outputs["end_top_index"][record]
        start_scores = outputs["start_top_log_probs"][record]
        end_scores = outputs["end_top_log_probs"][record]
        start_grid = np.broadcast_to(starts[:, None], ends.shape)
        start_score_grid = np.broadcast_to(start_scores[:, None], ends.shape)
        end_grid, end_score_grid = ends, end_scores
    else:
        start_logits = outputs["start_logits"][record]
        end_logits = outputs["end_logits"][record]
        starts = best_indexes(start_logits, n_best_size)
        ends = best_indexes(end_logits, n_best_size)
        start_grid, end_grid = np.meshgrid(starts, ends, indexing="ij")
        start_score_grid = start_logits[start_grid]
        end_score_grid = end_logits[end_grid]
    first, last = info.offset, info.offset + info.length  # context tokens: [first, last)
    valid = ((start_grid < info.num_tokens) & (end_grid < info.num_tokens) & (start_grid != 0)
             & (start_grid >= first) & (start_grid < last) & (end_grid >= first) & (end_grid < last)
             & (end_grid >= start_grid) & (end_grid - start_grid + 1 <= max_answer_length))
    # Windows hold at least one sub-token; clipping only keeps the lookup in range for the
    # candidates already dropped above.
    valid &= info.max_context[np.clip(start_grid - first, 0, info.length - 1)]
    rows, cols = np.nonzero(valid)  # row-major: the official loop order
    return [Candidate(record, int(start_grid[i, j]), int(end_grid[i, j]),
                      start_score_grid[i, j], end_score_grid[i, j]) for i, j in zip(rows, cols)]


def detokenize(pieces: Sequence[str]) -> str:
    """WordPieces joined by spaces, " ##" then any "##" removed, whitespace collapsed."""
    text = " ".join(pieces).replace(" ##", "").replace("##", "")
    return " ".join(text.strip().split())


def _strip_spaces(text: str):
    chars, ns_to_s = [], {}
    for i, char in enumerate(text):
        if char == " ":
            continue
        ns_to_s[len(chars)] = i
        chars.append(char)
    return "".join(chars), ns_to_s


def get_final_text(pred_text: str, orig_text: str, basic_tokens: Callable[[str], List[str]]) -> str:
    """Projects a detokenized prediction back onto the original words (module docstring).

    Args:
        pred_text: str. The detokenized sub-tokens.
        orig_text: str. The covered whitespace words joined by single spaces.
        basic_tokens: BERT BasicTokenizer (the run's lower-casing) of a text.
    """
    tok_text = " ".join(basic_tokens(orig_text))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_ns_to_s = _strip_spaces(orig_text)
    tok_ns, tok_ns_to_s = _strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
    if start not in tok_s_to_ns or end not in tok_s_to_ns:
        return orig_text
    orig_start = orig_ns_to_s.get(tok_s_to_ns[start])
    orig_end = orig_ns_to_s.get(tok_s_to_ns[end])
    if orig_start is None or orig_end is None:
        return orig_text
    return orig_text[orig_start:orig_end + 1]


class BasicTokenCache:
    """BERT BasicTokenizer words of texts, computed in batches and remembered.

    On the TensorFlow backend the in-graph `GraphBasicTokenizer` (what the exported SavedModel
    decodes with); elsewhere `portable_tokenization.BasicTokenizer` (Python, no TensorFlow; the
    same words, as the TF-free tokenizer's ids are the same).

    Args:
        do_lower_case, strip_accents: the run's tokenization.
        in_graph: bool or None. The in-graph tokenizer (True) or the Python one (False); None:
            the Keras backend's.
    """

    def __init__(self, do_lower_case: bool, strip_accents: bool, in_graph: Optional[bool] = None):
        if in_graph is None:
            # lazy: decoding itself is numpy; only the choice of tokenizer asks Keras
            import keras

            in_graph = keras.backend.backend() == "tensorflow"
        self._words_of = (_graph_words if in_graph else _python_words)(do_lower_case,
                                                                      strip_accents)
        self._cache: Dict[str, List[str]] = {}

    def prefetch(self, texts: Sequence[str]) -> None:
        missing = sorted({t for t in texts if t not in self._cache})
        for begin in range(0, len(missing), 50_000):
            chunk = missing[begin:begin + 50_000]
            self._cache.update(zip(chunk, self._words_of(chunk)))

    def __call__(self, text: str) -> List[str]:
        if text not in self._cache:
            self.prefetch([text])
        return self._cache[text]


def _graph_words(do_lower_case: bool, strip_accents: bool) -> Callable[[List[str]], List[List[str]]]:
    """Texts -> their BasicTokenizer words, in one TensorFlow graph call per batch."""
    # lazy: TensorFlow backend only (JAX and PyTorch runs decode without it)
    import tensorflow as tf

    # lazy: TensorFlow backend only (the graph tokenizer imports TensorFlow)
    from electra_tf.data.text.basic_tokenizer import GraphBasicTokenizer

    tokenizer = GraphBasicTokenizer(do_lower_case, strip_accents)
    return lambda texts: [[w.decode("utf-8") for w in row]
                          for row in tokenizer.tokenize(tf.constant(texts, tf.string)).to_list()]


def _python_words(do_lower_case: bool, strip_accents: bool) -> Callable[[List[str]], List[List[str]]]:
    """Texts -> their BasicTokenizer words, in Python (`portable_tokenization`)."""
    tokenizer = BasicTokenizer(do_lower_case, strip_accents)
    return lambda texts: [tokenizer.tokenize(t) for t in texts]


class Prediction(NamedTuple):
    """The decoded answer of one question.

    Attributes:
        text: str. The official prediction (v2: the best non-empty text).
        null_odds: float or None. SQuAD 2.0 only.
        nbest: list of NBestEntry.
    """

    text: str
    null_odds: Optional[float]
    nbest: List[NBestEntry]


class Decoder:
    """Decodes every question of a split (module docstring).

    Args:
        words: per question, its paragraph's whitespace words.
        docs: per question, its DocTokens.
        windows: per record, its WindowInfo.
        vocab_tokens: token strings in id order.
        basic_tokens: BasicTokenCache.
        v2: bool. SQuAD 2.0 (null odds, first non-empty text).
        joint_prediction, answerable_classifier, n_best_size, max_answer_length: official hparams.
    """

    def __init__(self, words: Sequence[Sequence[str]], docs: Sequence[DocTokens],
                 windows: Sequence[WindowInfo], vocab_tokens: Sequence[str],
                 basic_tokens: BasicTokenCache, v2: bool, joint_prediction: bool,
                 answerable_classifier: bool, n_best_size: int, max_answer_length: int):
        self.words, self.docs, self.windows = words, docs, windows
        self.vocab_tokens = vocab_tokens
        self.basic_tokens = basic_tokens
        self.v2 = v2
        self.joint_prediction = joint_prediction
        self.answerable_classifier = answerable_classifier
        self.n_best_size = n_best_size
        self.max_answer_length = max_answer_length
        self.records_of: List[List[int]] = [[] for _ in words]
        for record, info in enumerate(windows):
            self.records_of[info.example].append(record)

    def _texts(self, candidate: Candidate, input_ids: np.ndarray) -> Tuple[str, str]:
        info = self.windows[candidate.record]
        ids = input_ids[candidate.record][candidate.start:candidate.end + 1]
        pred_text = detokenize([self.vocab_tokens[i] for i in ids])
        doc = self.docs[info.example]
        first_word = doc.tok_to_orig[info.doc_start + candidate.start - info.offset]
        last_word = doc.tok_to_orig[info.doc_start + candidate.end - info.offset]
        orig_text = " ".join(self.words[info.example][first_word:last_word + 1])
        return pred_text, orig_text

    def ranked_candidates(self, example: int, outputs: Dict[str, np.ndarray]):
        """(candidates sorted by score, null score) of one question."""
        candidates: List[Candidate] = []
        null_score = NULL_SCORE_INIT
        for record in self.records_of[example]:
            if self.v2:
                if self.answerable_classifier:
                    score = outputs["answerable_logit"][record]
                else:
                    score = outputs["start_logits"][record][0] + outputs["end_logits"][record][0]
                null_score = min(null_score, float(score))
            candidates += window_candidates(self.windows[record], record, outputs,
                                            self.joint_prediction, self.n_best_size,
                                            self.max_answer_length)
        totals = np.array([c.start_score + c.end_score for c in candidates], np.float32)
        order = np.argsort(-totals, kind="stable")
        return [candidates[i] for i in order], null_score

    def decode(self, outputs: Dict[str, np.ndarray], input_ids: np.ndarray) -> List[Prediction]:
        """Predictions of every question, in split order.

        Args:
            outputs: the QA head's outputs over the split's records (numpy).
            input_ids: int [n_records, seq]. The records' ids.
        """
        ranked = [self.ranked_candidates(e, outputs) for e in range(len(self.words))]
        head = self.n_best_size * PREFETCH_FACTOR
        self.basic_tokens.prefetch([self._texts(c, input_ids)[1]
                                    for candidates, _ in ranked for c in candidates[:head]])
        return [self._predict(candidates, null_score, input_ids)
                for candidates, null_score in ranked]

    def _predict(self, candidates: List[Candidate], null_score: float,
                 input_ids: np.ndarray) -> Prediction:
        nbest: List[NBestEntry] = []
        seen = set()
        for candidate in candidates:
            if len(nbest) >= self.n_best_size:
                break
            pred_text, orig_text = self._texts(candidate, input_ids)
            text = get_final_text(pred_text, orig_text, self.basic_tokens)
            if text in seen:
                continue
            seen.add(text)
            nbest.append(NBestEntry(text, float(candidate.start_score), float(candidate.end_score),
                                    candidate.record, candidate.start, candidate.end))
        if not nbest:
            nbest.append(NBestEntry(EMPTY_PREDICTION, 0.0, 0.0))
        if not self.v2:
            return Prediction(nbest[0].text, None, nbest)
        best = next((e for e in nbest if e.text), None)
        if self.answerable_classifier:
            null_odds = null_score
        else:
            best_score = (best.start_score + best.end_score) if best else 0.0
            null_odds = null_score - best_score
        return Prediction(best.text if best else "", float(null_odds), nbest)
