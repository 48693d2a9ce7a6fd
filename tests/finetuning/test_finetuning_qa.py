"""QA readers, features, decoding and the official evaluations, against hand-computed values
(parity items QA-1..15, QA-21..31; docs/parity.md). No data set is downloaded: the files are
written here from real sentences."""

import json
import os

import numpy as np
import pytest

from electra_tf.finetuning.qa import evaluation
from electra_tf.finetuning.qa.data import QA_WHITESPACE, read_mrqa, read_squad, split_words
from electra_tf.finetuning.qa.decoding import (BasicTokenCache, Decoder, detokenize,
                                               get_final_text, window_candidates)
from electra_tf.finetuning.qa.features import (Window, WindowInfo, doc_windows, featurize,
                                               improve_answer_span, max_context)
from electra_tf.finetuning.task_files import DataFileError
from tests.finetuning_fixtures import squad_file, tokenizer_for

WORDS = ["the", "leader", "was", "john", "smith", "1895", "1943", "what", "year", "born", "cat",
         "sat", "on", "mat", "milk", "cow", "of", "a", "glass", "drank", "who", "steve", "##s"]
LEADER = "The leader was John Smith (1895-1943)."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tokenizer_for(tmp_path_factory.mktemp("qa_vocab"), WORDS)[0]


@pytest.fixture(scope="module")
def basic_tokens():
    return BasicTokenCache(do_lower_case=True, strip_accents=True)


def _squad(path, paragraphs, version="2.0"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}, f)
    return str(path)


def _qa(qid, question, text=None, start=None, impossible=False):
    qa = {"id": qid, "question": question, "is_impossible": impossible, "answers": []}
    if text is not None:
        qa["answers"] = [{"text": text, "answer_start": start}]
    return qa


# ------------------------------------------------------------------------------------------------
# Reading (QA-1..6)
# ------------------------------------------------------------------------------------------------
def test_qa1_qa2_whitespace_words_and_char_to_word_offset():
    assert QA_WHITESPACE == frozenset(" \t\r\n\u202f")
    paragraph = split_words(" ab\u00a0c\td\u202fe\n")
    assert paragraph.words == ["ab\u00a0c", "d", "e"]  # U+00A0 stays inside a word
    assert paragraph.char_to_word == [-1, 0, 0, 0, 0, 0, 1, 1, 2, 2]
    assert paragraph.word_starts == [1, 6, 8]


def test_qa3_only_the_train_split_reads_answers(tmp_path):
    path = _squad(tmp_path / "dev.json", [{"context": "the cat sat", "qas": [
        _qa("a", "who sat", "cat", 4), _qa("b", "what", impossible=True)]}])
    dev = read_squad(path, "dev", v2=True)
    assert [(e.start_word, e.answer_text, e.is_impossible) for e in dev.examples] == [
        (None, None, False), (None, None, False)]
    train = read_squad(path, "train", v2=True)
    assert [(e.start_word, e.end_word, e.answer_text, e.is_impossible)
            for e in train.examples] == [(1, 1, "cat", False), (-1, -1, "", True)]


def test_qa4_qa5_answer_checks_errors_and_official_skipping(tmp_path):
    context = "I drank a glass of milk"
    ok = _squad(tmp_path / "ok.json", [{"context": context, "qas": [
        _qa("case", "what", "Milk", 19)]}])  # case differences pass (lower-cased test)
    assert [e.end_word for e in read_squad(ok, "train", v2=False).examples] == [5]
    bad = [_qa("wrong", "what", "cow", 18),  # covered words "of milk" do not contain "cow"
           _qa("past", "what", "milk and more", 19),  # runs past the context's end
           _qa("outside", "what", "milk", 99)]  # official: IndexError
    path = _squad(tmp_path / "bad.json", [{"context": context, "qas": bad + [
        _qa("good", "what", "glass", 10)]}])
    with pytest.raises(DataFileError, match=r"bad.json: article 0, paragraph 0, question 'wrong': "
                       r"the answer text 'cow' is not at character 18 \(the context there reads "
                       r"' mi'\) \(set skip_bad_answers"):
        read_squad(path, "train", v2=False)
    split = read_squad(path, "train", v2=False, skip_bad_answers=True)
    assert [e.qid for e in split.examples] == ["good"]
    assert [e.eid for e in split.examples] == [0]  # skipped questions take no id (QA-6)
    assert len(split.skipped) == 3
    assert "runs past the end of the context" in split.skipped[1]
    assert "outside the context" in split.skipped[2]


def test_qa6_example_ids_are_consecutive_and_feature_ids_encode_the_window(tmp_path, tokenizer):
    path = _squad(tmp_path / "t.json", [
        {"context": "the cat sat on the mat", "qas": [_qa("a", "who", "cat", 4),
                                                       _qa("b", "who", "mat", 19)]},
        {"context": "john smith was born", "qas": [_qa("c", "who", "john", 0)]}])
    split = read_squad(path, "train", v2=False)
    assert [e.eid for e in split.examples] == [0, 1, 2]
    features = featurize(split.examples, tokenizer, 8, 4, 2, True)  # 4 sub-tokens per window
    eids = features.arrays["eid"].tolist()
    assert eids == [1000 * w.example + w.window for w in features.windows]
    assert [w.window for w in features.windows][:2] == [0, 1]  # several windows per question


@pytest.mark.parametrize("content,message", [
    ("{not json", r"t.json:1: not valid JSON"),
    ('{"data": ' + "[" * 100000 + "]" * 100000 + "}", r"t.json: JSON nested too deeply"),
    ('{"version": "2.0"}', r"t.json: missing key 'data'"),
    ('{"data": [{"paragraphs": [{"context": "a", "qas": [{"question": "q"}]}]}]}',
     r"t.json: article 0, paragraph 0, question 0: missing key 'id'"),
    ('{"data": [{"paragraphs": [{"context": "a b", "qas": [{"id": "x", "question": "q", '
     '"answers": [], "is_impossible": false}]}]}]}',
     r"question 'x': an answerable training question has no answers"),
    ('{"data": [{"paragraphs": [{"context": "a", "qas": [{"id": "x", "question": "q", '
     '"is_impossible": true, "answers": []}, {"id": "x", "question": "q", "is_impossible": true, '
     '"answers": []}]}]}]}', r"question 'x': duplicate question id"),
    ('{"data": [{"paragraphs": [{"context": "a", "qas": [{"id": "x", "question": "q", '
     '"answers": []}]}]}]}', r"question 'x': missing key 'is_impossible'"),
])
def test_bad_squad_files_are_one_error_naming_file_and_record(tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(DataFileError, match=message):
        read_squad(str(path), "train", v2=True)


def test_dev_questions_need_gold_answers_for_the_evaluation(tmp_path):
    path = _squad(tmp_path / "dev.json", [{"context": "a b", "qas": [
        {"id": "x", "question": "q", "answers": [{"answer_start": 0}]}]}])
    with pytest.raises(DataFileError, match=r"question 'x', answer 0: missing key 'text'"):
        read_squad(path, "dev", v2=True)
    assert read_squad(path, "test", v2=True).examples[0].qid == "x"  # predictions only


def test_mrqa_reader_first_detected_answer_header_and_bad_lines(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [{"header": {"dataset": "x"}},
             {"context": "I drank a glass of milk", "qas": [
                 {"qid": "m1", "question": "what", "answers": ["milk", "MILK"],
                  "detected_answers": [{"text": "milk", "char_spans": [[19, 22]]},
                                       {"text": "glass", "char_spans": [[10, 14]]}]}]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    split = read_mrqa(str(path), "train")
    assert [(e.qid, e.start_word, e.answer_text) for e in split.examples] == [("m1", 5, "milk")]
    assert split.gold == {"m1": ["milk", "MILK"]}
    path.write_text(json.dumps(lines[0]) + "\n{oops\n")
    with pytest.raises(DataFileError, match=r"train.jsonl:2: not valid JSON"):
        read_mrqa(str(path), "train")
    path.write_text(json.dumps(lines[0]) + "\n" + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(DataFileError, match=r"train.jsonl:2: JSON nested too deeply"):
        read_mrqa(str(path), "train")


# ------------------------------------------------------------------------------------------------
# Features (QA-7..15)
# ------------------------------------------------------------------------------------------------
def test_qa9_windows_exact():
    assert doc_windows(600, 512 - 20 - 3, 128) == [Window(0, 489), Window(128, 472)]
    assert [w.start for w in doc_windows(1000, 512 - 10 - 3, 128)] == [0, 128, 256, 384, 512]
    assert doc_windows(0, 100, 128) == []
    assert doc_windows(10, 4, 128) == [Window(0, 4), Window(4, 4), Window(8, 2)]  # stride > D


def test_qa11_max_context_scores_and_ties_to_the_earliest_window():
    windows = [Window(0, 489), Window(128, 472)]
    assert max_context(windows, 0)[300] and not max_context(windows, 1)[300 - 128]
    assert max_context(windows, 1)[400 - 128] and not max_context(windows, 0)[400]
    tie = [Window(0, 5), Window(2, 5)]  # sub-token 3: min(3, 1) vs min(1, 3), same length
    assert max_context(tie, 0)[3] and not max_context(tie, 1)[1]
    assert max_context(tie, 1)[2]  # sub-token 4: min(4, 0) < min(2, 2)


def test_qa8_answer_refinement_narrows_to_the_wordpieces(tokenizer):
    pieces = [tokenizer.vocab.tokens[i] for i in tokenizer.encode("(1895-1943).")]
    assert pieces == ["(", "1895", "-", "1943", ")", "."]
    doc = tokenizer.encode(LEADER)
    start = len(tokenizer.encode("The leader was John Smith"))
    assert improve_answer_span(doc, start, len(doc) - 1, tokenizer.encode("1895")) == (
        start + 1, start + 1)
    assert improve_answer_span(doc, 0, 1, tokenizer.encode("milk")) == (0, 1)  # no match: kept


def test_qa7_qa12_qa13_qa14_qa15_training_records(tmp_path, tokenizer):
    path = _squad(tmp_path / "t.json", [{"context": LEADER, "qas": [
        _qa("year", "what year was the leader john smith born", "1895", LEADER.index("1895")),
        _qa("none", "who drank milk", impossible=True)]}])
    split = read_squad(path, "train", v2=True)
    # 11 sub-tokens: the leader was john smith ( 1895 - 1943 ) .; the first question is cut to
    # 4 WordPieces, so L = 12 leaves D = 5 per window and stride 3 gives (0, 5), (3, 5), (6, 5);
    # the second has 3 ("who drank milk"): D = 6, windows (0, 6), (3, 6), (6, 5).
    features = featurize(split.examples, tokenizer, 12, 4, 3, True)
    arrays, windows = features.arrays, features.windows
    assert [(w.example, w.doc_start, w.length) for w in windows] == [
        (0, 0, 5), (0, 3, 5), (0, 6, 5), (1, 0, 6), (1, 3, 6), (1, 6, 5)]
    vocab = tokenizer.vocab.tokens
    first = [vocab[i] for i in arrays["input_ids"][0][:arrays["input_mask"][0].sum()]]
    assert first == ["[CLS]", "what", "year", "was", "the", "[SEP]", "the", "leader", "was",
                     "john", "smith", "[SEP]"]  # QA-7: the first 4 question WordPieces
    np.testing.assert_array_equal(arrays["segment_ids"][0], [0] * 6 + [1] * 6)  # QA-12
    # QA-13: "1895" is sub-token 6; window 2 starts at 6: position 0 + 4 + 2 = 6; window 1
    # (3..7) holds it at 3 + 6 = 9.
    assert arrays["start_positions"].tolist() == [0, 9, 6, 0, 0, 0]
    assert arrays["end_positions"].tolist() == [0, 9, 6, 0, 0, 0]
    # QA-14: window 0 lacks the answer: 0 / 0 but is_impossible 0; QA-15: unanswerable: 1 in all.
    assert arrays["is_impossible"].tolist() == [0, 0, 0, 1, 1, 1]
    eval_features = featurize(read_squad(path, "dev", v2=True).examples, tokenizer, 12, 4, 3, False)
    assert not eval_features.arrays["start_positions"].any()
    assert not eval_features.arrays["is_impossible"].any()


# ------------------------------------------------------------------------------------------------
# Decoding (QA-10, QA-21..26)
# ------------------------------------------------------------------------------------------------
def _joint_outputs(starts, ends, start_scores, end_scores, answerable=0.0):
    return {"start_top_index": np.array([starts]), "end_top_index": np.array([ends]),
            "start_top_log_probs": np.array([start_scores], np.float32),
            "end_top_log_probs": np.array([end_scores], np.float32),
            "answerable_logit": np.array([answerable], np.float32)}


def test_qa21_candidate_filters():
    # Record: [CLS] q q [SEP] c0..c5 [SEP] (offset 4, length 6); max-context only at c0..c3.
    info = WindowInfo(0, 0, 0, 6, 2, np.array([1, 1, 1, 1, 0, 0], bool))
    starts = [0, 2, 4, 5, 8, 5, 6, 4]
    ends = [[5] * 8, [5] * 8, [3] + [5] * 7, [5] * 8, [9] * 8, [4] + [5] * 7, [7] * 8, [11] * 8]
    out = _joint_outputs(starts, ends, [0.0] * 8, [[0.0] * 8] * 8)
    kept = {(c.start, c.end) for c in window_candidates(info, 0, out, True, 20, 3)}
    # start 0: [CLS]; start 2: question; (4, 3) and (5, 4): end < start; start 8: not its
    # max-context window (c4); (4, 11): end past the record; kept: (4, 5), (5, 5), (6, 7).
    assert kept == {(4, 5), (5, 5), (6, 7)}
    # max_answer_length counts sub-tokens: 1 keeps only (5, 5).
    assert {(c.start, c.end) for c in window_candidates(info, 0, out, True, 20, 1)} == {(5, 5)}


def test_qa22_qa23_ranking_is_stable_and_nbest_holds_distinct_texts(tokenizer, basic_tokens):
    words = ["the", "cat", "sat", "on", "the", "mat"]
    ids = [tokenizer.encode(w)[0] for w in words]
    from electra_tf.finetuning.qa.features import DocTokens
    doc = DocTokens(np.array(ids, np.int32), np.arange(6, dtype=np.int32), np.arange(6, dtype=np.int32))
    input_ids = np.array([[2, 3] + ids + [3]])  # [CLS] [SEP] the cat sat on the mat [SEP]
    info = WindowInfo(0, 0, 0, 6, 0, np.ones(6, bool))
    # Candidates (start, end) with scores: "the" at 2 and at 6 tie and are one text.
    out = _joint_outputs([2, 6, 3], [[2, 3, 4], [6, 7, 7], [3, 2, 2]],
                         [-1.0, -1.0, -0.5], [[-1.0, -2.0, -3.0], [-1.0, -0.5, -9.0],
                                              [-1.0, -9.0, -9.0]])
    decoder = Decoder([words], [doc], [info], tokenizer.vocab.tokens, basic_tokens, False, True,
                      True, 3, 30)
    ranked, _ = decoder.ranked_candidates(0, out)
    # Generated (start-major): (2,2) -2, (2,3) -3, (2,4) -4, (6,6) -2, (6,7) -1.5, (6,7) -10,
    # (3,3) -1.5; (3,2) twice dropped (end < start). Stable sort by the summed score:
    assert [(c.start, c.end, c.start_score + c.end_score) for c in ranked] == [
        (6, 7, -1.5), (3, 3, -1.5), (2, 2, -2.0), (6, 6, -2.0), (2, 3, -3.0), (2, 4, -4.0),
        (6, 7, -10.0)]
    prediction = decoder.decode(out, input_ids)[0]
    assert [e.text for e in prediction.nbest] == ["the mat", "cat", "the"]  # 3 distinct, n=3
    assert prediction.text == "the mat"


def test_qa23_v2_takes_the_first_non_empty_text_and_qa26_min_null_odds(tokenizer, basic_tokens):
    words = ["the", "cat"]
    from electra_tf.finetuning.qa.features import DocTokens
    ids = [tokenizer.encode(w)[0] for w in words]
    doc = DocTokens(np.array(ids, np.int32), np.arange(2, dtype=np.int32), np.arange(2, dtype=np.int32))
    windows = [WindowInfo(0, 0, 0, 2, 0, np.ones(2, bool)), WindowInfo(0, 1, 0, 2, 0, np.ones(2, bool))]
    out = {key: np.concatenate([a, b]) for (key, a), (_, b) in zip(
        _joint_outputs([2], [[3]], [-1.0], [[-1.0]], answerable=0.7).items(),
        _joint_outputs([3], [[3]], [-3.0], [[-3.0]], answerable=-1.25).items())}
    decoder = Decoder([words], [doc, doc], windows, tokenizer.vocab.tokens, basic_tokens, True,
                      True, True, 20, 30)
    prediction = decoder.decode(out, np.array([[2, 3] + ids + [3]] * 2))[0]
    assert prediction.text == "the cat" and prediction.null_odds == pytest.approx(-1.25)
    no_classifier = Decoder([words], [doc, doc], windows, tokenizer.vocab.tokens, basic_tokens,
                            True, True, False, 20, 30)
    out["start_logits"] = np.array([[0.5, 0, 0, 0, 0], [2.0, 0, 0, 0, 0]], np.float32)
    out["end_logits"] = np.array([[0.25, 0, 0, 0, 0], [0.0, 0, 0, 0, 0]], np.float32)
    # Null score = min over windows of start[0] + end[0] = 0.75, minus the best span's -2.
    assert no_classifier.decode(out, np.array([[2, 3] + ids + [3]] * 2))[0].null_odds == \
        pytest.approx(2.75)


def test_qa10_a_context_without_subtokens_gives_no_records_and_decodes_empty(tmp_path, tokenizer,
                                                                              basic_tokens):
    path = _squad(tmp_path / "t.json", [{"context": "\x00\x01", "qas": [_qa("z", "what")]}])
    split = read_squad(path, "dev", v2=True)
    features = featurize(split.examples, tokenizer, 16, 4, 4, False)
    assert features.windows == [] and features.arrays["input_ids"].shape == (0, 16)
    decoder = Decoder([split.examples[0].paragraph.words], features.doc_tokens, [],
                      tokenizer.vocab.tokens, basic_tokens, True, True, True, 20, 30)
    prediction = decoder.decode({}, np.zeros([0, 16], np.int32))[0]
    assert (prediction.text, prediction.null_odds) == ("empty", 1e6)


def test_qa24_detokenize():
    assert detokenize(["john", "##son", "'", "s", "##s"]) == "johnson ' ss"
    assert detokenize(["a", "##", "b"]) == "a b"  # " ##" removed first, then any "##"
    assert detokenize([" x ", "y"]) == "x y"


def test_qa25_get_final_text(basic_tokens):
    assert get_final_text("steve smith", "Steve Smith's", basic_tokens) == "Steve Smith"
    assert get_final_text("1895", "(1895-1943).", basic_tokens) == "1895"
    assert get_final_text("cafe", "Café", basic_tokens) == "Café"
    assert get_final_text("xyz", "abc", basic_tokens) == "abc"


# ------------------------------------------------------------------------------------------------
# Official evaluation (QA-28..31)
# ------------------------------------------------------------------------------------------------
def test_qa28_normalisation_and_f1():
    assert evaluation.normalize_answer("The  Cat's, hat!") == "cats hat"
    assert evaluation.normalize_answer("Thea") == "thea"
    assert evaluation.f1_v1("the cat sat", "cat sat down") == pytest.approx(0.8)
    assert evaluation.f1_v2("", "") == 1.0 and evaluation.f1_v2("a cat", "") == 0.0
    assert evaluation.f1_v1("", "") == 0.0  # v1 / MRQA: nothing common


def _v2_dataset():
    def qa(qid, answers):
        return {"id": qid, "question": "q", "answers": [{"text": t, "answer_start": 0}
                                                        for t in answers]}
    return [{"paragraphs": [{"context": "c", "qas": [
        qa("a", ["the cat"]), qa("b", []), qa("c", ["dog house", "a dog"]), qa("d", [])]}]}]


def test_qa29_v2_thresholds_null_odds_and_reports_13_sorted_keys():
    predictions = {"a": "cat", "b": "x", "c": "dog", "d": "y"}
    na = {"a": -5.0, "b": -1.0, "c": -3.0, "d": 0.5}
    result = evaluation.evaluate_v2(_v2_dataset(), predictions, na, -2.75)
    assert list(result) == sorted([
        "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total",
        "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh", "exact", "f1", "total"])
    # a: raw EM 1 (na -5 < -2.75); c: raw "dog" vs "a dog" EM 1; b, d: na above -> unanswerable = 1.
    assert result["exact"] == 100.0 and result["total"] == 4
    assert (result["HasAns_total"], result["NoAns_total"]) == (2, 2)
    high = evaluation.evaluate_v2(_v2_dataset(), predictions, dict(na, a=-2.0), -2.75)
    assert high["HasAns_exact"] == 50.0  # a is predicted null although answerable


def test_qa30_best_threshold_worked_example():
    predictions = {"a": "the cat", "b": "x", "c": "no", "d": "y"}
    na = {"a": -5.0, "c": -3.0, "b": -1.0, "d": 0.5}
    has = {"a": True, "b": False, "c": True, "d": False}
    assert evaluation.best_threshold(predictions, {"a": 1, "b": 0, "c": 0, "d": 0}, na, has) == \
        (75.0, -5.0)
    assert evaluation.best_threshold(predictions, {"a": 1, "b": 0, "c": 0.5, "d": 0}, na, has) == \
        (87.5, -3.0)


def test_qa31_missing_predictions_v1_counts_zero_mrqa_skips_and_q27_v2_no_crash():
    dataset = [{"paragraphs": [{"context": "c", "qas": [
        {"id": "a", "answers": [{"text": "cat"}]}, {"id": "b", "answers": [{"text": "dog"}]}]}]}]
    assert evaluation.evaluate_v1(dataset, {"a": "the cat"}) == {"exact_match": 50.0, "f1": 50.0}
    assert evaluation.evaluate_mrqa({"a": ["cat"], "b": ["dog"]}, {"a": "cat"}) == {
        "exact_match": 100.0, "f1": 100.0}
    result = evaluation.evaluate_v2(_v2_dataset(), {"a": "cat", "b": ""}, {"a": -5.0, "b": -5.0},
                                    -2.75)
    assert result["total"] == 2 and result["HasAns_total"] == 1 and result["NoAns_exact"] == 100.0


def test_squad_file_helper_is_valid_for_both_versions(tmp_path):
    path = squad_file(tmp_path / "d.json", ["x"], version="1.1")
    assert [e.qid for e in read_squad(path, "train", v2=False).examples] == ["x"]
