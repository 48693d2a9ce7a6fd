"""ner and pos on CoNLL files written here: the reader's edge cases, the label column, BIO / BIOES,
the label set from the train file, entity F1 against seqeval itself (default and strict modes),
the in-graph entity decoding and character offsets, and a fine-tune-export-serve run."""

import logging
import os
import random
import warnings

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.registry import build_task, task_family
from electra_tf.finetuning.tagging import features as features_lib
from electra_tf.finetuning.tagging.conll import read_conll
from electra_tf.finetuning.tagging.entities import decoding_tables, entities
from electra_tf.finetuning.tagging.metrics import entity_f1, token_accuracy
from electra_tf.finetuning.tagging.serving import EntityDecoder, TaggingEncoder, tagging_serving
from electra_tf.finetuning.task import ScoreContext
from electra_tf.finetuning.task_files import DataFileError
from electra_tf.config.hparams import ConfigError
from tests.finetuning.test_finetuning_tagging import assert_encoded_like_features
from tests.finetuning_fixtures import tiny_pretrained, tokenizer_for, write_vocab

seqeval_metrics = pytest.importorskip("seqeval.metrics")
seqeval_scheme = pytest.importorskip("seqeval.scheme")

WORDS = ["angela", "merkel", "visited", "paris", "and", "berlin", "in", "may", "the", "cafe",
         "zurich", "is", "open", "john", "smith", "lives", "london", "##s", "new", "york"]

# One file with every edge case: a BOM, CRLF line ends, -DOCSTART- lines, runs of blank lines,
# tabs and spaces (mixed) between fields, trailing whitespace, I- without B-, a word WordPiece
# splits ("Londons" -> london ##s), accents, and a last sentence with a blank line after it.
EDGE_TRAIN = ("\ufeff-DOCSTART- -X- -X- O\r\n\r\n"
              "Angela NNP B-NP B-PER\r\n"
              "Merkel\tNNP\tI-NP\tI-PER  \r\n"
              "visited VBD B-VP O\r\n"
              "Paris NNP B-NP B-LOC\t\r\n"
              "\r\n\r\n\r\n"
              "-DOCSTART- -X- -X- O\r\n"
              "\r\n"
              "Londons NNP B-NP I-LOC\r\n"
              "Café NNP B-NP B-ORG\r\n"
              "Zürich NNP I-NP I-ORG\r\n"
              "\r\n")


def _write(directory, name, text):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tokenizer_for(tmp_path_factory.mktemp("ner_vocab"), WORDS)[0]


def _pretrained(tokenizer):
    return type("P", (), {"vocab": tokenizer.vocab, "do_lower_case": True,
                          "strip_accents": True})()


def _task(tmp_path, tokenizer, name, files, **hparams):
    raw = tmp_path / "finetuning_data"
    for file_name, text in files.items():
        _write(str(raw / name), file_name, text)
    config = FinetuningConfig.create("m", str(tmp_path), dict(task_names=[name], **hparams))
    return build_task(name, config, _pretrained(tokenizer), None, None)


# ------------------------------------------------------------------------------------------------
# Reader
# ------------------------------------------------------------------------------------------------
def test_reader_edge_cases_bom_crlf_docstart_blank_runs_tabs_trailing_whitespace(tmp_path):
    path = _write(str(tmp_path), "train.txt", EDGE_TRAIN)
    sentences = read_conll(path, check_tag=None)
    assert [(s.words, s.tags) for s in sentences] == [
        (("Angela", "Merkel", "visited", "Paris"), ("B-PER", "I-PER", "O", "B-LOC")),
        (("Londons", "Café", "Zürich"), ("I-LOC", "B-ORG", "I-ORG"))]
    assert sentences[0].lines == (3, 4, 5, 6) and sentences[1].lines == (12, 13, 14)
    assert sentences[1].source == f"{path}:12"
    # The label column by flag: 1 = POS, -2 = chunk, 3 = the last.
    assert read_conll(path, label_column=1, check_tag=None)[0].tags == ("NNP", "NNP", "VBD", "NNP")
    assert read_conll(path, label_column=-2, check_tag=None)[1].tags == ("B-NP", "B-NP", "I-NP")
    assert read_conll(path, label_column=3, check_tag=None)[0].tags == sentences[0].tags


@pytest.mark.parametrize("column,message", [
    (4, r"train.txt:3: tagging_label_column 4 is not a column of this 4-field line"),
    (-4, r"train.txt:3: tagging_label_column -4 is the word column of this 4-field line"),
    (-9, r"train.txt:3: tagging_label_column -9 is not a column"),
])
def test_a_label_column_the_file_lacks_is_one_error_naming_file_and_line(tmp_path, column, message):
    path = _write(str(tmp_path), "train.txt", EDGE_TRAIN)
    with pytest.raises(DataFileError, match=message):
        read_conll(path, label_column=column, check_tag=None)


def test_label_column_0_is_refused_by_the_config(tmp_path):
    with pytest.raises(ConfigError, match="tagging_label_column 0 is the word column"):
        FinetuningConfig.create("m", str(tmp_path), {"task_names": ["ner"],
                                                     "tagging_label_column": 0})
    with pytest.raises(ConfigError, match="tagging_scheme must be one of BIO, BIOES, got 'IOB'"):
        FinetuningConfig.create("m", str(tmp_path), {"tagging_scheme": "IOB"})
    with pytest.raises(ConfigError, match="tagging_entity_mode must be one of default, strict"):
        FinetuningConfig.create("m", str(tmp_path), {"tagging_entity_mode": "lenient"})


# ------------------------------------------------------------------------------------------------
# The ner and pos tasks
# ------------------------------------------------------------------------------------------------
def test_ner_and_pos_are_tagging_tasks_with_chunks_presets(tmp_path):
    assert task_family("ner") == task_family("pos") == task_family("chunk") == "tagging"
    config = FinetuningConfig.create("m", str(tmp_path), {"task_names": ["ner"]})
    assert config.max_seq_length == 256 and config.tagging_label_column == -1
    assert (config.tagging_scheme, config.tagging_entity_mode) == ("BIO", "default")


def test_ner_labels_come_from_the_train_file_and_split_words_tag_their_first_piece(
        tmp_path, tokenizer):
    task = _task(tmp_path, tokenizer, "ner", {
        "train.txt": EDGE_TRAIN, "dev.conll": "Paris X X B-LOC\nangela X X B-PER\n\n"},
        max_seq_length=16)
    assert task.labels == ("B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O")
    assert task.summary()["dev"] == 1
    features = task.train_features()
    vocab = tokenizer.vocab.tokens
    ids = features["input_ids"][1]
    assert [vocab[i] for i in ids[:6]] == ["[CLS]", "london", "##s", "cafe", "zurich", "[SEP]"]
    np.testing.assert_array_equal(features["labeled_positions"][1][:3], [1, 3, 4])
    assert [task.labels[i] for i in features["labels"][1][:3]] == ["I-LOC", "B-ORG", "I-ORG"]


@pytest.mark.parametrize("name,cased,lower_case", [
    ("ner", None, False), ("pos", None, False), ("chunk", None, True), ("ner", False, True)])
def test_ner_and_pos_follow_the_models_casing_unless_tagging_cased_says(tmp_path, tokenizer, name,
                                                                       cased, lower_case):
    raw = tmp_path / "finetuning_data" / name
    _write(str(raw), "train.txt", "Paris B-LOC\n\n")
    config = FinetuningConfig.create("m", str(tmp_path), {"task_names": [name],
                                                          "tagging_cased": cased})
    cased_model = type("P", (), {"vocab": tokenizer.vocab, "do_lower_case": False,
                                 "strip_accents": False})()
    task = build_task(name, config, cased_model, None, None)
    assert task.tokenizer.do_lower_case is lower_case


def test_an_unseen_dev_label_is_one_error_naming_file_and_line(tmp_path, tokenizer):
    with pytest.raises(DataFileError) as error:
        _task(tmp_path, tokenizer, "ner", {
            "train.txt": EDGE_TRAIN, "dev.txt": "\ufeffParis X X B-LOC\r\nMay X X B-MISC\r\n\r\n"})
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(os.path.join(str(tmp_path), "finetuning_data", "ner", "dev.txt")
                              + ":2: label 'B-MISC' does not occur in the training file ")


@pytest.mark.parametrize("name", ["ner", "pos"])
def test_no_dev_and_no_test_file_warns_that_nothing_is_scored(tmp_path, tokenizer, caplog, name):
    """Issue 47: a train file alone trains and exports (a use of its own: every labelled
    sentence for the export) with a warning that no metric will be reported; with do_train
    false there is nothing to do."""
    files = {"train.txt": "Paris X B-LOC\nin X O\n\n"}
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        _task(tmp_path, tokenizer, name, files)
    directory = os.path.join(str(tmp_path), "finetuning_data", name)
    assert [r.getMessage() for r in caplog.records] == [
        f"task {name!r}: no dev.txt or test.txt (or .conll) in {directory}: it trains and "
        "exports but reports no metric; add a dev file to evaluate it"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        _task(tmp_path, tokenizer, name, files, do_eval=False)
        _task(tmp_path / "with_test", tokenizer, name,
              dict(files, **{"test.txt": "Paris X B-LOC\n\n"}))
    assert not caplog.records
    with pytest.raises(DataFileError, match=rf"task '{name}': no dev.txt or test.txt .* and "
                                            r"do_train is false: nothing to do"):
        _task(tmp_path, tokenizer, name, files, do_train=False)


def test_bio_refuses_bioes_tags_and_bioes_accepts_them(tmp_path, tokenizer):
    files = {"train.txt": "Paris X S-LOC\nin X O\nNew X B-LOC\nYork X E-LOC\n\n"}
    with pytest.raises(DataFileError, match=r"train.txt:1: tag 'S-LOC' is not 'O' nor a BIO tag "
                                            r"\(B-TYPE, I-TYPE\) \(set tagging_scheme to BIOES\)"):
        _task(tmp_path, tokenizer, "ner", files)
    task = _task(tmp_path, tokenizer, "ner", files, tagging_scheme="BIOES")
    assert task.labels == ("B-LOC", "E-LOC", "O", "S-LOC")


def test_pos_takes_any_tag_from_the_chosen_column_and_scores_accuracy(tmp_path, tokenizer):
    task = _task(tmp_path, tokenizer, "pos", {
        "train.txt": "the DT B-NP O\ncafe NN I-NP O\nis VBZ B-VP O\n( -LRB- O O\nPRP$ PRP$ O O\n\n",
        "dev.txt": "the DT B-NP O\ncafe NN I-NP O\n\n"}, tagging_label_column=1)
    assert task.labels == ("-LRB-", "DT", "NN", "PRP$", "VBZ")
    eval_set = task.eval_sets()[0]
    features = eval_set.features
    predictions = np.array([[1, 4] + [0] * (features["labels"].shape[1] - 2)])
    values = task.score(eval_set, {"predictions": predictions, "loss": np.array([2.0])}, None)
    assert values == {"accuracy": 50.0, "loss": 1.0}
    assert token_accuracy([["A", "B"]], [["A", ""]]) == {"accuracy": 50.0}


@pytest.mark.parametrize("length,tagged,official", [(19, 6, 6), (12, 6, 3), (11, 5, 2), (9, 3, 0)])
def test_ner_truncation_tags_every_word_whose_first_piece_fits(tokenizer, length, tagged, official):
    words = ["the", "angela", "(1895-1943)", "paris", "may", "london"]  # pieces 1, 1, 5, 1, 1, 1
    special = tokenizer.vocab.special
    pieces = features_lib.word_pieces(tokenizer, [words])
    assert [len(p) for p in pieces[0]] == [1, 1, 5, 1, 1, 1]
    counts = {}
    for rule in (False, True):
        features = features_lib.featurize(pieces, [list(range(6))], length, special.cls_id,
                                          special.sep_id, official_truncation=rule)
        counts[rule] = int(features["labels_mask"][0].sum())
    assert (counts[False], counts[True]) == (tagged, official)


@pytest.mark.parametrize("official", [False, True])  # ner / pos, and chunk's official rule
def test_serving_features_equal_the_training_features(tokenizer, official):
    sentences = [["the", "angela", "(1895-1943)", "paris", "may", "london"],
                 ["a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q-r-s-t-u", "paris"], ["paris"] * 40, ["may"],
                 ["Café", "Zürich", "londons", "\u200b", "new", "york"]]
    special = tokenizer.vocab.special
    pieces = features_lib.word_pieces(tokenizer, sentences)
    for length in (8, 12, 24, 64):
        python = features_lib.featurize(pieces, [[0] * len(s) for s in sentences], length,
                                        special.cls_id, special.sep_id, official)
        encoder = TaggingEncoder(tokenizer, length, official_truncation=official)
        graph = encoder.encode(tf.constant([" ".join(s) for s in sentences]))
        assert_encoded_like_features(graph, python, len(sentences))


# ------------------------------------------------------------------------------------------------
# Entities and F1 against seqeval
# ------------------------------------------------------------------------------------------------
def _seqeval(gold, predicted, scheme, mode):
    kwargs = {"zero_division": 0}
    if mode == "strict":
        kwargs.update(mode="strict", scheme={"BIO": seqeval_scheme.IOB2,
                                             "BIOES": seqeval_scheme.IOBES}[scheme])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: 100 * getattr(seqeval_metrics, f"{name}_score")(gold, predicted, **kwargs)
                for name in ("precision", "recall", "f1")}


def _random_tags(rng, scheme, sentences, types=("PER", "LOC", "geo-loc")):
    prefixes = "BI" if scheme == "BIO" else "BIES"
    tags = ["O", "O"] + [f"{p}-{t}" for p in prefixes for t in types]
    return [[rng.choice(tags) for _ in range(rng.randint(0, 9))] for _ in range(sentences)]


@pytest.mark.parametrize("scheme", ["BIO", "BIOES"])
@pytest.mark.parametrize("mode", ["default", "strict"])
def test_entity_f1_equals_seqeval_on_the_same_predictions(scheme, mode):
    rng = random.Random(f"{scheme}{mode}")
    for _ in range(300):
        gold = _random_tags(rng, scheme, 4)
        # Predictions: the gold with some tags changed (so some entities match, some not).
        noise = [t for row in _random_tags(rng, scheme, 3) for t in row] or ["O"]
        predicted = [[t if rng.random() < 0.7 else rng.choice(noise) for t in row] for row in gold]
        ours = entity_f1(gold, predicted, scheme, mode)
        reference = _seqeval(gold, predicted, scheme, mode)
        for name in ("precision", "recall", "f1"):
            assert ours[name] == pytest.approx(reference[name], abs=1e-9), (gold, predicted, name)


@pytest.mark.parametrize("tags,scheme,default,strict", [
    # I- without B-: an entity in seqeval's default mode only.
    ("I-PER I-PER O B-LOC", "BIO", [(0, 1, "PER"), (3, 3, "LOC")], [(3, 3, "LOC")]),
    ("B-PER I-LOC", "BIO", [(0, 0, "PER"), (1, 1, "LOC")], [(0, 0, "PER")]),
    # BIOES: S- and E- close; an unclosed B- is no entity in strict mode.
    ("S-LOC B-PER I-PER E-PER", "BIOES", [(0, 0, "LOC"), (1, 3, "PER")],
     [(0, 0, "LOC"), (1, 3, "PER")]),
    ("B-PER I-PER O E-LOC S-LOC", "BIOES", [(0, 1, "PER"), (3, 3, "LOC"), (4, 4, "LOC")],
     [(4, 4, "LOC")]),
    ("B-PER E-PER E-PER", "BIOES", [(0, 1, "PER"), (2, 2, "PER")], [(0, 1, "PER")]),
    ("B-geo-loc I-geo-loc", "BIO", [(0, 1, "geo-loc")], [(0, 1, "geo-loc")]),
])
def test_entity_table_by_hand_and_by_seqeval(tags, scheme, default, strict):
    tags = tags.split()
    assert entities(tags, scheme, "default") == default
    assert entities(tags, scheme, "strict") == strict
    reference = seqeval_metrics.sequence_labeling.get_entities(tags)
    assert sorted((a, b, t) for t, a, b in reference) == sorted(default)
    cls = {"BIO": seqeval_scheme.IOB2, "BIOES": seqeval_scheme.IOBES}[scheme]
    strict_reference = seqeval_scheme.Entities([tags], cls).entities[0]
    assert sorted((e.start, e.end - 1, e.tag) for e in strict_reference) == sorted(strict)


def test_a_sentence_longer_than_max_seq_length_scores_its_cut_words_as_missed(tmp_path, tokenizer):
    words = " ".join(["paris"] * 12)
    train = "".join(f"{w} B-LOC\n" for w in words.split()) + "\n"
    task = _task(tmp_path, tokenizer, "ner", {"train.txt": train, "dev.txt": train},
                 max_seq_length=8)
    eval_set = task.eval_sets()[0]
    tagged = int(eval_set.features["labels_mask"][0].sum())
    assert tagged == 6  # [CLS] + 6 words + [SEP] = 8 pieces: 6 of the 12 words are cut
    gold_id = task.labels.index("B-LOC")
    predictions = np.full_like(eval_set.features["labels"], gold_id)
    context = ScoreContext(str(tmp_path / "results"), 2, False, "ner")
    values = task.score(eval_set, {"predictions": predictions, "loss": np.array([1.0])}, context)
    padded = [["B-LOC"] * tagged + ["O"] * (12 - tagged)]
    with open(tmp_path / "results" / "ner_tagging" / "ner_dev_2.txt", encoding="utf-8") as f:
        assert f.read() == "paris\tB-LOC\tB-LOC\n" * 6 + "paris\tB-LOC\tO\n" * 6 + "\n"
    reference = _seqeval([["B-LOC"] * 12], padded, "BIO", "default")
    assert values["recall"] == pytest.approx(reference["recall"])
    assert values["recall"] == pytest.approx(100 * tagged / 12)
    assert values["precision"] == 100.0 and values["f1"] == pytest.approx(reference["f1"])


# ------------------------------------------------------------------------------------------------
# Serving: entities in-graph and character offsets
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["BIO", "BIOES"])
@pytest.mark.parametrize("mode", ["default", "strict"])
def test_the_graph_decoder_finds_the_metrics_entities(scheme, mode):
    rng = random.Random(f"graph{scheme}{mode}")
    labels = sorted({t for row in _random_tags(rng, scheme, 200) for t in row})
    rows = [[rng.randrange(-1, len(labels)) if rng.random() < 0.1 else rng.randrange(len(labels))
             for _ in range(rng.randint(0, 9))] for _ in range(64)]
    width = max(len(r) for r in rows)
    ids = np.full([len(rows), width], -1, np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    found = EntityDecoder(labels, scheme, mode)(tf.constant(ids))
    for i, row in enumerate(rows):
        expected = entities([labels[t] if t >= 0 else "O" for t in row], scheme, mode)
        n = int(found["num_entities"][i])
        got = list(zip(found["first_words"][i][:n].numpy().tolist(),
                       found["last_words"][i][:n].numpy().tolist(),
                       [t.decode() for t in found["types"][i][:n].numpy()]))
        assert got == expected, (row, got, expected)
    assert decoding_tables(labels, scheme, mode)[0].shape == (len(labels) + 1,) * 2


class _WordModel:
    """A stand-in model: each word's tag is fixed by its first WordPiece (a lookup table)."""

    def __init__(self, vocab, labels, tag_of):
        table = np.full([len(vocab.tokens)], labels.index("O"), np.int32)
        for word, tag in tag_of.items():
            table[vocab.tokens.index(word)] = labels.index(tag)
        self.table = tf.constant(table)
        self.num_labels = len(labels)

    def task_outputs(self, features, task_name, training=False):
        positions = features[f"{task_name}_labeled_positions"]
        first_pieces = tf.gather(features["input_ids"], positions, batch_dims=1)
        predictions = tf.gather(self.table, first_pieces)
        # The head's outputs: serving takes the argmax of the logits.
        return {"logits": tf.one_hot(predictions, self.num_labels), "predictions": predictions}


def test_raw_text_serving_gives_entities_whose_offsets_slice_the_input(tokenizer):
    labels = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
    model = _WordModel(tokenizer.vocab, labels, {
        "angela": "B-PER", "merkel": "I-PER", "cafe": "B-LOC", "zurich": "I-LOC",
        "paris": "B-LOC", "new": "B-LOC", "york": "I-LOC"})
    serving = tagging_serving(model, "ner", tokenizer, labels, 64, raw_text=True,
                              decoder=EntityDecoder(labels, "BIO", "default"))
    texts = ["Angela   Merkel visited Café Zürich, in   Paris.",
             "\tnew  York\u00a0is open",
             "",
             "Ångela Merkel"]
    out = serving.signature_functions["ner"](tf.constant(texts))
    expected = [[("PER", "Angela   Merkel"), ("LOC", "Café Zürich"), ("LOC", "Paris")],
                [("LOC", "new  York")], [], [("PER", "Ångela Merkel")]]
    for i, text in enumerate(texts):
        n = int(out["num_entities"][i])
        starts = out["entity_starts"][i][:n].numpy().tolist()
        ends = out["entity_ends"][i][:n].numpy().tolist()
        types = [t.decode() for t in out["entity_types"][i][:n].numpy()]
        found = [(t, text[s:e]) for t, s, e in zip(types, starts, ends)]
        assert found == expected[i], (text, found)
        assert [t.decode() for t in out["entity_texts"][i][:n].numpy()] == [e for _, e in found]
        assert (out["entity_starts"][i][n:].numpy() == -1).all()
        words = int(out["num_words"][i])
        for k in range(words):
            s, e = int(out["word_starts"][i][k]), int(out["word_ends"][i][k])
            assert text[s:e] == out["words"][i][k].numpy().decode()
    assert [w.decode() for w in out["words"][0][:int(out["num_words"][0])].numpy()] == [
        "Angela", "Merkel", "visited", "Café", "Zürich", ",", "in", "Paris", "."]


# ------------------------------------------------------------------------------------------------
# End to end: fine-tune a tiny model, export, serve raw text
# ------------------------------------------------------------------------------------------------
NER_SENTENCES = [
    ("angela merkel visited paris", "B-PER I-PER O B-LOC"),
    ("john smith lives in london", "B-PER I-PER O O B-LOC"),
    ("the cafe in zurich is open", "O O O B-LOC O O"),
    ("john visited new york in may", "B-PER O B-LOC I-LOC O O"),
]


def _conll(sentences, crlf=False):
    end = "\r\n" if crlf else "\n"
    return "-DOCSTART- O" + end + end + "".join(
        "".join(f"{w}\t{t}{end}" for w, t in zip(words.split(), tags.split())) + end + end
        for words, tags in sentences)


@pytest.mark.slow  # about 95 s on 2 CPU cores: a pretraining export, training, a fine-tuned export
def test_fine_tune_a_tiny_ner_model_export_and_serve_raw_text(tmp_path):
    root = str(tmp_path)
    vocab = write_vocab(os.path.join(root, "src_vocab.txt"), WORDS)
    tiny_pretrained(root, vocab, max_seq_length=32)
    raw = os.path.join(root, "raw")
    _write(os.path.join(raw, "ner"), "train.txt", _conll(NER_SENTENCES * 4))
    _write(os.path.join(raw, "ner"), "dev.txt", _conll(NER_SENTENCES, crlf=True))
    config = FinetuningConfig.create("tiny", root, {
        "task_names": ["ner"], "raw_data_dir": raw, "max_seq_length": 32,
        "train_batch_size": 8, "num_train_epochs": 2, "learning_rate": 1e-3, "log_steps": 1000})
    results = runner.run(config)
    dev = results["trials"][0]["metrics"]["ner"]["dev"]
    assert set(dev) == {"precision", "recall", "f1", "loss"} and np.isfinite(dev["loss"])
    export = results["trials"][0]["export"]
    with open(os.path.join(export, "assets.extra", "labels.json"), encoding="utf-8") as f:
        assert f.read().count("B-PER") == 1
    import tensorflow_text  # noqa: F401  (the tokenizer's ops)

    serve = tf.saved_model.load(export).signatures["ner"]
    text = "Angela  Merkel visited Paris, in May."
    out = serve(text=tf.constant([text]))
    n = int(out["num_words"][0])
    assert [text[s:e] for s, e in zip(out["word_starts"][0][:n].numpy(),
                                      out["word_ends"][0][:n].numpy())] == [
        "Angela", "Merkel", "visited", "Paris", ",", "in", "May", "."]
    for k in range(int(out["num_entities"][0])):
        s, e = int(out["entity_starts"][0][k]), int(out["entity_ends"][0][k])
        assert text[s:e] == out["entity_texts"][0][k].numpy().decode()
        assert out["entity_types"][0][k].numpy().decode() in ("PER", "LOC")
