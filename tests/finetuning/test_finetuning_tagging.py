"""Chunking: CoNLL reader, span table, BIOES, features, span F1 (parity items TAG-1..9, TAG-12..14;
docs/parity.md), the in-graph serving features, and a learning test on sentences of the default
corpus."""

import collections
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.tagging import features as features_lib
from electra_tf.finetuning.tagging.chunk import ChunkingTask
from electra_tf.finetuning.tagging.conll import read_conll
from electra_tf.finetuning.tagging.metrics import span_f1
from electra_tf.finetuning.tagging.serving import TaggingEncoder
from electra_tf.finetuning.tagging.spans import TagError, bioes_tags, span_labels, to_bioes
from electra_tf.finetuning.task_files import DataFileError
from electra_tf.vocab import load_vocab
from tests.finetuning_fixtures import (REAL_CORPUS, REAL_VOCAB, REPO_ROOT, TINY_MODEL,
                                       corpus_tasks_dir, need_real_data, tokenizer_for)

LEADER = ["the", "leader", "(1895-1943)", "went", "japanese", "milk"]  # pieces 1,1,5,1,1,1


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    words = ["the", "leader", "1895", "1943", "went", "japanese", "milk", "cafe", "dog", "ran",
             "##s"]
    return tokenizer_for(tmp_path_factory.mktemp("tag_vocab"), words)[0]


def _pretrained(tokenizer, do_lower_case=True):
    return type("P", (), {"vocab": tokenizer.vocab, "do_lower_case": do_lower_case,
                          "strip_accents": do_lower_case})()


# ------------------------------------------------------------------------------------------------
# Reader
# ------------------------------------------------------------------------------------------------
def test_tag1_tag2_reader_fields_docstart_blank_lines_and_last_sentence(tmp_path, caplog):
    path = tmp_path / "train.txt"
    path.write_text("-DOCSTART- -X- O\n\nThe DT B-NP\ndog NN I-NP\n\n\nran VBD B-VP\n")
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        sentences = read_conll(str(path))
    assert [(s.words, s.tags) for s in sentences] == [(("The", "dog"), ("B-NP", "I-NP"))]
    assert sentences[0].source.endswith("train.txt:3")
    assert "train.txt:7: the last sentence (1 words) has no blank line after it and is dropped" \
        in caplog.text
    kept = read_conll(str(path), flush_last_sentence=True)
    assert [s.words for s in kept] == [("The", "dog"), ("ran",)]


@pytest.mark.parametrize("text,message", [
    ("The DT B-NP\ndog I-NP\n\n", r"train.txt:2: expected 3 fields like the file's first word line, got 2"),
    ("The\n\n", r"train.txt:1: a word line needs at least 2 fields"),
    ("The DT B-NP-X\n\n", r"train.txt:1: tag 'B-NP-X' is neither 'O' nor PREFIX-TYPE"),
    ("The DT NP\n\n", r"train.txt:1: tag 'NP' is neither"),
])
def test_bad_tag_lines_are_one_error_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "train.txt"
    path.write_text(text)
    with pytest.raises(DataFileError, match=message):
        read_conll(str(path))


# ------------------------------------------------------------------------------------------------
# Spans and labels
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tags,spans", [
    ("I-NP I-NP O", [(0, 1, "NP")]),
    ("B-NP I-VP", [(0, 1, "VP")]),
    ("B-NP E-NP I-NP O", [(0, 2, "NP")]),
    ("S-NP I-NP", [(0, 1, "NP")]),
    ("E-NP E-NP", [(0, 1, "NP")]),
    ("O E-NP O", [(1, 1, "NP")]),
    ("I-NP B-NP", [(0, 0, "NP"), (1, 1, "NP")]),
    ("B-NP E-NP S-VP O I-PP E-PP", [(0, 1, "NP"), (2, 2, "VP"), (4, 5, "PP")]),
])
def test_tag3_span_table(tags, spans):
    assert span_labels(tags.split()) == spans


def test_tag3_q11_empty_and_malformed():
    assert span_labels([]) == []  # official: IndexError (QUIRK Q11, fixed)
    with pytest.raises(TagError):
        span_labels(["B-NP-X"])


def test_tag4_bio_to_bioes():
    assert bioes_tags([(0, 1, "NP"), (2, 2, "VP"), (4, 6, "PP")], 8) == \
        "B-NP E-NP S-VP O B-PP I-PP E-PP O".split()
    assert to_bioes("B-VP I-NP I-NP".split()) == "B-NP I-NP E-NP".split()


def test_tag5_label_set_is_the_sorted_union_over_existing_files(tmp_path, tokenizer):
    raw = tmp_path / "finetuning_data" / "chunk"
    raw.mkdir(parents=True)
    (raw / "train.txt").write_text("the X B-NP\ndog X I-NP\n\n")
    (raw / "dev.txt").write_text("ran X B-VP\n\n")
    (raw / "test.txt").write_text("the X B-PP\n\n")
    config = FinetuningConfig.create("m", str(tmp_path), {"task_names": ["chunk"]})
    task = ChunkingTask("chunk", config, _pretrained(tokenizer))
    assert task.labels == ("B-NP", "E-NP", "S-PP", "S-VP")
    os.remove(raw / "test.txt")
    assert ChunkingTask("chunk", config, _pretrained(tokenizer)).labels == ("B-NP", "E-NP", "S-VP")


# ------------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------------
def _features(tokenizer, sentences, length):
    special = tokenizer.vocab.special
    pieces = features_lib.word_pieces(tokenizer, sentences)
    labels = [list(range(1, len(s) + 1)) for s in sentences]
    return features_lib.featurize(pieces, labels, length, special.cls_id, special.sep_id)


@pytest.mark.parametrize("length,kept", [(19, 6), (18, 5), (14, 3), (11, 2), (9, 0), (64, 6)])
def test_tag7_tag8_tag9_tag11_positions_truncation_segments(tokenizer, length, kept):
    features = _features(tokenizer, [LEADER], length)
    positions = [1, 2, 3, 8, 9, 10][:kept]  # [CLS] at 0; "(1895-1943)" is pieces 3..7
    n_tagged = int(features["labels_mask"][0].sum())
    assert n_tagged == kept
    np.testing.assert_array_equal(features["labeled_positions"][0][:kept], positions)
    assert not features["labeled_positions"][0][kept:].any()  # padding gathers position 0 ...
    assert not features["labels_mask"][0][kept:].any()  # ... and is masked
    np.testing.assert_array_equal(features["labels"][0][:6], [1, 2, 3, 4, 5, 6])
    n = int(features["input_mask"][0].sum())
    ids = features["input_ids"][0][:n].tolist()
    assert ids[0] == tokenizer.vocab.special.cls_id and ids[-1] == tokenizer.vocab.special.sep_id
    np.testing.assert_array_equal(features["segment_ids"][0], [1] * n + [0] * (length - n))


def test_q6_one_long_word_is_cut_at_the_sequence_length(tokenizer):
    word = "-".join(["milk"] * 10)  # 19 pieces
    features = _features(tokenizer, [["the", word, "dog"]], 12)
    n = int(features["input_mask"][0].sum())
    assert n == 12 and features["input_ids"][0][11] == tokenizer.vocab.special.sep_id
    assert features["labeled_positions"][0][:2].tolist() == [1, 2] and features["labels_mask"][0].sum() == 2


def test_tag6_words_are_lower_cased_whatever_the_model_does(tmp_path, tokenizer):
    raw = tmp_path / "finetuning_data" / "chunk"
    raw.mkdir(parents=True)
    (raw / "train.txt").write_text("The X B-NP\nCAFÉ X I-NP\n\n")
    config = FinetuningConfig.create("m", str(tmp_path), {"task_names": ["chunk"]})
    task = ChunkingTask("chunk", config, _pretrained(tokenizer, do_lower_case=False))
    vocab = tokenizer.vocab.tokens
    ids = task.train_features()["input_ids"][0]
    assert [vocab[i] for i in ids[:4]] == ["[CLS]", "the", "cafe", "[SEP]"]
    cased = FinetuningConfig.create("m", str(tmp_path), {"task_names": ["chunk"],
                                                         "tagging_cased": True})
    ids = ChunkingTask("chunk", cased, _pretrained(tokenizer, do_lower_case=False)).train_features()["input_ids"][0]
    assert [vocab[i] for i in ids[:4]] == ["[CLS]", "[UNK]", "[UNK]", "[SEP]"]


def assert_encoded_like_features(graph, python, num_sentences: int) -> None:
    """The in-graph encoder's ids, mask, tagged count and labeled positions equal the Python
    features' for each of the first `num_sentences` rows (test_finetuning_ner.py uses it too)."""
    for i in range(num_sentences):
        n = int(python["input_mask"][i].sum())
        np.testing.assert_array_equal(graph["input_ids"][i][:n], python["input_ids"][i][:n])
        assert int(graph["input_mask"][i].numpy().sum()) == n
        k = int(python["labels_mask"][i].sum())
        assert int(graph["num_tagged"][i]) == k
        np.testing.assert_array_equal(graph["labeled_positions"][i][:k],
                                      python["labeled_positions"][i][:k])


def test_serving_features_equal_the_training_features_on_real_text(tmp_path):
    need_real_data()
    from electra_tf.data.text.tokenization import Tokenizer

    tokenizer = Tokenizer(load_vocab(REAL_VOCAB))
    sentences = []
    with open(os.path.join(REAL_CORPUS, sorted(os.listdir(REAL_CORPUS))[0]), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                sentences.append(line.split())
            if len(sentences) == 40:
                break
    sentences += [LEADER, ["x" * 250, "a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q-r-s-t-u"], ["one"]]
    for length in (9, 24, 64):
        python = _features(tokenizer, sentences, length)
        graph = TaggingEncoder(tokenizer, length).encode(tf.constant([" ".join(s) for s in sentences]))
        assert_encoded_like_features(graph, python, len(sentences))


# ------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------
def test_tag12_tag13_tag14_span_f1_by_hand():
    names = ["B-NP", "E-NP", "O", "S-NP", "S-VP"]
    ids = {n: i for i, n in enumerate(names)}
    gold = [[ids[t] for t in "B-NP E-NP S-VP O S-NP".split()], [ids["S-NP"], ids["S-VP"], 0, 0, 0]]
    pred = [[ids[t] for t in "B-NP E-NP O O S-NP".split()], [ids["S-VP"], ids["S-VP"], 0, 0, 0]]
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], np.float32)  # sentence 2: 2 tagged words
    losses = np.array([1.0, 2.0])
    result = span_f1(np.array(gold), np.array(pred), mask, losses, names)
    # gold: {(0,1,NP), (2,2,VP), (4,4,NP)} + {(0,0,NP), (1,1,VP)} = 5; predicted: 2 + 2 = 4;
    # correct: (0,1,NP), (4,4,NP), (1,1,VP) = 3.
    assert result["precision"] == pytest.approx(75.0) and result["recall"] == pytest.approx(60.0)
    assert result["f1"] == pytest.approx(2 * 75 * 60 / 135)
    assert result["loss"] == pytest.approx(3.0 / 7)  # un-doubled (QUIRK Q10 fixed)
    assert span_f1(np.array(gold), np.array(pred), mask, losses, names,
                   legacy_loss=True)["loss"] == pytest.approx(6.0 / 7)
    nothing = span_f1(np.array(gold), np.full([2, 5], ids["O"]), mask, losses, names)
    assert (nothing["precision"], nothing["recall"], nothing["f1"]) == (0.0, 0.0, 0.0)


# ------------------------------------------------------------------------------------------------
# Learning
# ------------------------------------------------------------------------------------------------
def _majority_baseline_f1(raw):
    """F1 of tagging each word with its most frequent training tag (a per-word-form baseline)."""
    train = read_conll(os.path.join(raw, "chunk", "train.txt"))
    counts = collections.defaultdict(collections.Counter)
    for s in train:
        for word, tag in zip(s.words, to_bioes(s.tags)):
            counts[word.lower()][tag] += 1
    dev = read_conll(os.path.join(raw, "chunk", "dev.txt"))
    names = sorted({t for c in counts.values() for t in c} | {"O"} | {
        t for s in dev for t in to_bioes(s.tags)})
    index = {n: i for i, n in enumerate(names)}
    width = max(len(s.words) for s in dev)
    gold = np.zeros([len(dev), width], np.int64)
    pred = np.zeros([len(dev), width], np.int64)
    mask = np.zeros([len(dev), width], np.float32)
    for i, s in enumerate(dev):
        for j, (word, tag) in enumerate(zip(s.words, to_bioes(s.tags))):
            gold[i, j] = index[tag]
            guess = counts[word.lower()].most_common(1)
            pred[i, j] = index[guess[0][0] if guess else "O"]
            mask[i, j] = 1
    return span_f1(gold, pred, mask, np.zeros(len(dev)), names)["f1"]


def test_learning_chunks_of_corpus_sentences_beat_the_per_word_majority_baseline(tmp_path):
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["chunk"], num_train=800, num_dev=200)
    config = FinetuningConfig.create("m", os.path.join(REPO_ROOT, "pretrain_data"), dict(
        TINY_MODEL, task_names=["chunk"], random_init=True, raw_data_dir=raw, max_seq_length=64,
        learning_rate=2e-3, num_train_epochs=4, do_export=False, log_steps=1000,
        results_json=str(tmp_path / "r.json"), results_txt=str(tmp_path / "r.txt")))
    results = runner.run(config)
    dev = results["trials"][0]["metrics"]["chunk"]["dev"]
    baseline = _majority_baseline_f1(raw)
    assert dev["f1"] > baseline + 10, (dev, baseline)
