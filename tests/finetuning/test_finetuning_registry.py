"""Fine-tuning registry, config resolution and the shared training table (parity items CFG-1..7,
SH-1, SH-2, SH-12; docs/parity.md)."""

import json
import logging
import os
import re

import numpy as np
import pytest

from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.registry import OFFICIAL_TASKS, build_task, task_family
from electra_tf.finetuning.task import FeatureSpec, FinetuningTask
from electra_tf.finetuning.task_files import DataFileError
from electra_tf.config.hparams import ConfigError


def _config(tmp_path, **hparams):
    return FinetuningConfig.create("m", str(tmp_path), hparams)


# ------------------------------------------------------------------------------------------------
# CFG
# ------------------------------------------------------------------------------------------------
def test_cfg1_every_official_task_name_has_a_family_and_others_are_refused(tmp_path):
    assert sorted(OFFICIAL_TASKS) == sorted([
        "cola", "mrpc", "mnli", "sst", "rte", "qnli", "qqp", "sts", "squad", "squadv1", "newsqa",
        "naturalqs", "triviaqa", "searchqa", "chunk"])
    families = {name: task_family(name) for name in OFFICIAL_TASKS}
    assert families["sts"] == "regression" and families["chunk"] == "tagging"
    assert {n for n, f in families.items() if f == "qa"} == {
        "squad", "squadv1", "newsqa", "naturalqs", "triviaqa", "searchqa"}
    config = _config(tmp_path, task_names=["nonsense"])
    with pytest.raises(DataFileError, match=r"Unknown task 'nonsense': not a named task"):
        build_task("nonsense", config, None, None, None)
    # An MRQA-style directory under a name that is not an official MRQA task: a pointed error.
    os.makedirs(tmp_path / "finetuning_data" / "hotpotqa")
    (tmp_path / "finetuning_data" / "hotpotqa" / "train.jsonl").write_text("{}\n")
    with pytest.raises(DataFileError, match=r"the MRQA tasks are newsqa, naturalqs"):
        build_task("hotpotqa", _config(tmp_path, task_names=["hotpotqa"]), None, None, None)


@pytest.mark.parametrize("task,length,epochs", [
    ("sts", 128, 10.0), ("rte", 128, 10.0), ("squad", 512, 2.0), ("squadv1", 512, 2.0),
    ("newsqa", 512, 2.0), ("triviaqa", 512, 2.0), ("searchqa", 512, 2.0), ("chunk", 256, 3.0),
    ("naturalqs", 128, 3.0), ("mnli", 128, 3.0), ("cola", 128, 3.0)])
def test_cfg2_single_task_defaults(tmp_path, task, length, epochs):
    config = _config(tmp_path, task_names=[task])
    assert (config.max_seq_length, config.num_train_epochs) == (length, epochs)
    if length == 512:
        assert config.write_test_outputs is False


def test_cfg2_naturalqs_keeps_the_glue_defaults_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        _config(tmp_path, task_names=["naturalqs"])
    assert "naturalqs gets no QA defaults" in caplog.text


def test_cfg3_several_tasks_get_no_single_task_defaults_and_user_values_win(tmp_path):
    config = _config(tmp_path, task_names=["squad", "chunk"])
    assert (config.max_seq_length, config.num_train_epochs) == (128, 3.0)
    config = _config(tmp_path, task_names=["squad"], max_seq_length=384, num_train_epochs=1)
    assert (config.max_seq_length, config.num_train_epochs) == (384, 1.0)


def test_cfg4_size_presets_and_overrides(tmp_path):
    large = _config(tmp_path, task_names=["squad"], model_size="large")
    assert (large.learning_rate, large.layerwise_lr_decay) == (5e-5, 0.9)
    assert _config(tmp_path, model_size="small").embedding_size == 128
    assert _config(tmp_path, model_size="small", embedding_size=64).embedding_size == 64
    assert _config(tmp_path, model_size="large", layerwise_lr_decay=0.7).layerwise_lr_decay == 0.7


def test_cfg5_unknown_hparam_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"Unknown hparam 'doc_strid'; did you mean 'doc_stride'"):
        _config(tmp_path, doc_strid=64)


def test_cfg6_qa_defaults(tmp_path):
    config = _config(tmp_path, task_names=["squad"])
    assert (config.max_query_length, config.doc_stride, config.n_best_size,
            config.max_answer_length, config.beam_size, config.answerable_weight,
            config.qa_na_threshold) == (64, 128, 20, 30, 20, 0.5, -2.75)
    assert config.joint_prediction and config.answerable_classifier
    assert config.answerable_uses_start_logits
    from electra_tf.finetuning.qa.task import QATask
    for hparams, message in (({"beam_size": 600}, r"beam_size \(600\) must be <= max_seq_length"),
                             ({"max_seq_length": 64}, r"max_query_length \(64\) must leave room")):
        with pytest.raises(ConfigError, match=message):
            QATask("squad", _config(tmp_path, task_names=["squad"], **hparams), None)


def test_cfg7_debug_reads_the_official_subsets(tmp_path):
    """squad: <split>-debug.json; MRQA: 11 lines; STS/GLUE: 100 lines; chunk: 101 sentences."""
    from electra_tf.finetuning.qa.data import DEBUG_MRQA_LINES, read_mrqa
    from electra_tf.finetuning.qa.task import QATask
    from electra_tf.finetuning.regression.sts import STSTask
    from electra_tf.finetuning.tagging.chunk import ChunkingTask
    from tests.finetuning_fixtures import squad_file, tokenizer_for

    raw = tmp_path / "finetuning_data"
    (raw / "sts").mkdir(parents=True)
    rows = "".join(f"{i}\ta b\tc d\t{i % 6}.0\n" for i in range(150))
    for split in ("train", "dev"):
        (raw / "sts" / f"{split}.tsv").write_text("index\ts1\ts2\tscore\n" + rows)
    (raw / "chunk").mkdir()
    (raw / "chunk" / "train.txt").write_text("the X B-NP\n\n" * 150)
    (raw / "chunk" / "dev.txt").write_text("the X B-NP\n\n" * 150)
    squad_file(raw / "squad" / "train-debug.json", ["q1", "q2"], answerable=True)
    squad_file(raw / "squad" / "dev-debug.json", ["q3"], answerable=True)
    assert DEBUG_MRQA_LINES == 11
    mrqa = raw / "newsqa" / "train.jsonl"
    mrqa.parent.mkdir()
    lines = [json.dumps({"header": {}})] + [json.dumps({"context": "a b c", "qas": [{
        "qid": f"m{i}", "question": "a", "answers": ["b"],
        "detected_answers": [{"text": "b", "char_spans": [[2, 2]]}]}]}) for i in range(20)]
    mrqa.write_text("\n".join(lines) + "\n")
    assert len(read_mrqa(str(mrqa), "train", max_lines=11).examples) == 10

    config = _config(tmp_path, task_names=["sts"], debug=True)
    tokenizer, encoder = tokenizer_for(tmp_path, ["a", "b", "c", "d", "the", "what"])
    sts = STSTask("sts", config, encoder)
    assert len(sts.examples["dev"]) == 99  # 100 physical lines, the header included
    assert len(sts.examples["train"]) == 2 * 99  # + the swapped copies
    pretrained = type("P", (), {"vocab": tokenizer.vocab, "do_lower_case": True,
                                "strip_accents": True})()
    chunk = ChunkingTask("chunk", _config(tmp_path, task_names=["chunk"], debug=True), pretrained)
    assert len(chunk.sentences["train"]) == 101 and len(chunk.sentences["dev"]) == 101
    squad = QATask("squad", _config(tmp_path, task_names=["squad"], debug=True,
                                    max_seq_length=64, max_query_length=16), tokenizer)
    assert squad.split_path("train").endswith("train-debug.json")
    assert [e.qid for e in squad.splits["train"].examples] == ["q1", "q2"]


# ------------------------------------------------------------------------------------------------
# SH-1, SH-2: the training table and the step count
# ------------------------------------------------------------------------------------------------
def test_sh1_steps_for_sts_b_are_3600(tmp_path):
    config = _config(tmp_path, task_names=["sts"])
    assert config.num_train_epochs == 10.0 and config.train_batch_size == 32
    # 5,749 STS-B pairs, doubled to 11,498 records, padded to 11,520 = 360 batches x 10 epochs.
    assert runner.num_train_steps(11_498, config) == 3600
    assert runner.num_train_steps(11_520, config) == 3600
    chunk = _config(tmp_path, task_names=["chunk"])
    assert runner.num_train_steps(8_936, chunk) == 840  # CoNLL-2000: 8,960 / 32 x 3


class _Fake(FinetuningTask):
    family = "fake"

    def __init__(self, name, n, specs, seq):
        super().__init__(name, None)
        self.n, self.specs, self.seq = n, specs, seq

    def feature_specs(self):
        return self.specs

    def train_features(self):
        out = {k: np.full([self.n, self.seq], 7, np.int32)
               for k in ("input_ids", "input_mask", "segment_ids")}
        for key, spec in self.specs.items():
            out[key] = np.ones([self.n, *spec.shape], spec.dtype)
        return out


def test_sh2_training_table_pads_with_task_id_t_and_zeros():
    a = _Fake("a", 5, {"label_ids": FeatureSpec((), "int32")}, 4)
    b = _Fake("b", 6, {"labels": FeatureSpec((4,), "int32"),
                       "labels_mask": FeatureSpec((4,), "float32")}, 4)
    table = runner.training_table([a, b], batch_size=8, max_seq_length=4)
    assert sorted(table) == ["a_label_ids", "b_labels", "b_labels_mask", "input_ids", "input_mask",
                             "segment_ids", "task_id"]
    assert len(table["task_id"]) == 16  # 11 records padded to a multiple of 8
    np.testing.assert_array_equal(table["task_id"], [0] * 5 + [1] * 6 + [2] * 5)
    # Every record carries every task's features; another task's are zeros.
    np.testing.assert_array_equal(table["a_label_ids"], [1] * 5 + [0] * 11)
    np.testing.assert_array_equal(table["b_labels"][:, 0], [0] * 5 + [1] * 6 + [0] * 5)
    assert table["b_labels_mask"].dtype == np.float32
    for key in ("input_ids", "input_mask", "segment_ids"):
        assert not table[key][11:].any()  # padding records: zeros everywhere but the task id


# ------------------------------------------------------------------------------------------------
# SH-12: results.txt
# ------------------------------------------------------------------------------------------------
def test_sh12_results_txt_official_lines_rewritten_after_every_trial(tmp_path, monkeypatch):
    config = _config(tmp_path, task_names=["sts"], num_trials=2)
    trials = [{"trial": 1, "metrics": {"sts": {"dev": {"pearson": 88.123, "spearman": 87.5,
                                                       "mse": 0.0312, "loss": 0.0311}}}},
              {"trial": 2, "metrics": {"sts": {"dev": {"pearson": 89.0, "spearman": 88.0,
                                                       "mse": 0.03, "loss": 0.03},
                                               "test": {"pearson": 80.0}}}}]
    results = {"trials": trials[:1], "summary": runner.summarize(trials[:1])}
    runner._write_results(config, results)
    first = open(config.results_txt).read().splitlines()
    assert first[0] == "sts: pearson: 88.12 - spearman: 87.50 - mse: 0.03 - loss: 0.03"
    results = {"trials": trials, "summary": runner.summarize(trials[:1])}
    runner._write_results(config, results)
    lines = open(config.results_txt).read().splitlines()
    assert lines[:3] == [first[0], "sts: pearson: 89.00 - spearman: 88.00 - mse: 0.03 - loss: 0.03",
                         "sts test: pearson: 80.00"]
    assert json.load(open(config.results_json))["trials"][1]["trial"] == 2


@pytest.mark.parametrize("task,files,message", [
    ("squad", {"train.json": '{"data": [{"paragraphs": [{"context": "I drank milk", "qas": [{"id": '
                             '"q7", "question": "what", "is_impossible": false, "answers": [{"text": '
                             '"tea", "answer_start": 8}]}]}]}]}'},
     r"squad/train.json: article 0, paragraph 0, question 'q7': the answer text 'tea' is not at "
     r"character 8"),
    ("chunk", {"train.txt": "The DT B-NP\ndog B-NP\n\n"}, r"chunk/train.txt:2: expected 3 fields"),
    ("sts", {"train.tsv": "h1\th2\th3\na\tb\t7\n"}, r"sts/train.tsv:2: label 7.0 is outside"),
    ("ner", {"train.txt": "the B-PER\ndog O\n\n", "dev.txt": "\n\nthe O\ndog B-LOC\n\n"},
     r"ner/dev.txt:4: label 'B-LOC' does not occur in the training file .*ner/train.txt"),
    ("ner", {"train.txt": "the X B-PER\ndog X S-PER\n\n"},
     r"ner/train.txt:2: tag 'S-PER' is not 'O' nor a BIO tag .*set tagging_scheme to BIOES"),
    ("pos", {"train.txt": "the DT\ndog NN\n\n", "dev.txt": "the DT\ndog VB\n\n"},
     r"pos/dev.txt:2: label 'VB' does not occur in the training file"),
])
def test_cli_bad_task_files_are_one_line_naming_file_and_record(tmp_path, capsys, task, files,
                                                                 message):
    import run_finetuning
    from tests.finetuning_fixtures import write_vocab

    write_vocab(str(tmp_path / "vocab.txt"), ["a", "b", "the", "dog", "milk"])
    for name, text in files.items():
        path = tmp_path / "finetuning_data" / task / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    hparams = json.dumps({"task_names": [task], "random_init": True, "vocab_size": 40,
                          "model_hparam_overrides": {"hidden_size": 8, "num_hidden_layers": 1,
                                                     "num_attention_heads": 1,
                                                     "intermediate_size": 8},
                          "embedding_size": 8, "max_seq_length": 32, "max_query_length": 8})
    logger = logging.getLogger("electra_tf")
    level = logger.level
    try:
        code = run_finetuning.main(["--data-dir", str(tmp_path), "--model-name", "m", "--hparams",
                                    hparams, "--quiet"])
    finally:
        logger.setLevel(level)  # main() sets the package's log level
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("run_finetuning.py: error: ")
    assert re.search(message, err[0]), err[0]
