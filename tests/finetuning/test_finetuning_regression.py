"""STS-B regression: reader, targets, metrics, test outputs (parity items REG-1..4, REG-7, REG-8;
docs/parity.md) and a learning test on pairs built from the default corpus."""

import os

import numpy as np
import pytest

from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.regression.metrics import average_ranks, regression_metrics
from electra_tf.finetuning.regression.sts import STSTask, read_sts
from electra_tf.finetuning.task import ScoreContext
from electra_tf.finetuning.task_files import DataFileError
from tests.finetuning_fixtures import (REPO_ROOT, TINY_MODEL, corpus_tasks_dir, tokenizer_for)

HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


def _row(i, a, b, score=None):
    lead = f"{i}\tmain-news\tf\t2012\t{i}\tnone\tnone"
    return f"{lead}\t{a}\t{b}" + (f"\t{score}" if score is not None else "") + "\n"


@pytest.fixture
def sts_dir(tmp_path):
    raw = tmp_path / "finetuning_data" / "sts"
    raw.mkdir(parents=True)
    (raw / "train.tsv").write_text(HEADER + _row(0, 'a "quoted" cat', "a dog", "3.800")
                                   + _row(1, "the cat", "the mat", "0"))
    (raw / "dev.tsv").write_text(HEADER + _row(0, "the cat", "a cat", "5.000"))
    (raw / "test.tsv").write_text(HEADER.rsplit("\t", 1)[0] + "\n" + _row(0, "a cat", "a dog"))
    return tmp_path


def _task(root, **hparams):
    config = FinetuningConfig.create("m", str(root), dict(task_names=["sts"], max_seq_length=16,
                                                          **hparams))
    _, encoder = tokenizer_for(root, ["a", "the", "cat", "dog", "mat", "quoted"], 16)
    return STSTask("sts", config, encoder)


def test_reg1_columns_header_quotes_and_test_file(sts_dir):
    task = _task(sts_dir, double_unordered=False)
    train = task.examples["train"]
    assert [(e.text_a, e.text_b, e.label) for e in train] == [
        ('a "quoted" cat', "a dog", 3.8), ("the cat", "the mat", 0.0)]  # quotes kept literally
    assert [(e.text_a, e.text_b, e.label) for e in task.examples["test"]] == [("a cat", "a dog", None)]
    assert [s.split for s in task.eval_sets()] == ["dev", "test"]
    assert [s.labelled for s in task.eval_sets()] == [True, False]


def test_reg2_double_unordered_appends_swapped_pairs_with_continuing_ids(sts_dir):
    train = _task(sts_dir).examples["train"]
    assert [(e.eid, e.text_a, e.text_b) for e in train] == [
        (0, 'a "quoted" cat', "a dog"), (1, "the cat", "the mat"),
        (2, "a dog", 'a "quoted" cat'), (3, "the mat", "the cat")]
    assert len(_task(sts_dir).train_features()["input_ids"]) == 4


def test_reg3_target_is_label_over_5_and_a_bad_label_is_an_error(sts_dir, tmp_path):
    features = _task(sts_dir).train_features()
    np.testing.assert_allclose(features["targets"], [0.76, 0.0, 0.76, 0.0])
    path = tmp_path / "bad.tsv"
    path.write_text(HEADER + _row(0, "a", "b", "1.0") + _row(1, "a", "b", "5.5"))
    with pytest.raises(DataFileError, match=r"bad.tsv:3: label 5.5 is outside the STS range \[0, 5\]"):
        read_sts(str(path), "train")
    path.write_text(HEADER + _row(0, "a", "b", "high"))
    with pytest.raises(DataFileError, match=r"bad.tsv:2: label 'high' is not a number"):
        read_sts(str(path), "train")
    path.write_text(HEADER + "a\tb\n")
    with pytest.raises(DataFileError, match=r"bad.tsv:2: expected at least 3 tab-separated fields"):
        read_sts(str(path), "train")


def test_reg7_metrics_match_hand_computed_values():
    targets = np.array([0.0, 0.2, 0.4, 0.4, 1.0])
    predictions = np.array([0.1, 0.1, 0.3, 0.5, 0.9])
    result = regression_metrics(targets, predictions, [0.01, 0.01, 0.01, 0.01, 0.01])
    assert list(result) == ["pearson", "spearman", "mse", "loss"]
    # Pearson by hand: means 0.4 and 0.38; sum dx dy = 0.4.22... computed exactly here.
    dx, dy = targets - 0.4, predictions - 0.38
    r = (dx @ dy) / np.sqrt((dx @ dx) * (dy @ dy))
    assert result["pearson"] == pytest.approx(100 * r)
    # Ranks with ties averaged: targets [1, 2, 3.5, 3.5, 5], predictions [1.5, 1.5, 3, 4, 5].
    np.testing.assert_array_equal(average_ranks(targets), [1, 2, 3.5, 3.5, 5])
    np.testing.assert_array_equal(average_ranks(predictions), [1.5, 1.5, 3, 4, 5])
    rt, rp = np.array([1, 2, 3.5, 3.5, 5]) - 3, np.array([1.5, 1.5, 3, 4, 5]) - 3
    assert result["spearman"] == pytest.approx(100 * (rt @ rp) / np.sqrt((rt @ rt) * (rp @ rp)))
    assert result["mse"] == pytest.approx(np.mean((targets - predictions) ** 2))
    assert result["loss"] == pytest.approx(0.01)
    # Both correlations are unchanged on the 0-5 scale.
    scaled = regression_metrics(5 * targets, predictions, [0.0] * 5)
    assert scaled["pearson"] == pytest.approx(result["pearson"])
    assert scaled["spearman"] == pytest.approx(result["spearman"])


def test_reg8_test_predictions_are_written_on_the_training_scale_with_the_0_5_score(sts_dir, tmp_path):
    task = _task(sts_dir)
    test_set = task.eval_sets()[1]
    context = ScoreContext(str(tmp_path / "results"), 2, True, "sts")
    assert task.score(test_set, {"predictions": np.array([0.5], np.float32),
                                 "loss": np.zeros(1)}, context) is None
    path = tmp_path / "results" / "test_predictions" / "sts_test_2_predictions.tsv"
    assert path.read_text() == "index\tprediction\tscore\n0\t0.500000\t2.500000\n"


def test_learning_sts_pairs_from_the_corpus_beat_a_constant_baseline(tmp_path):
    """Pairs (a sentence, a prefix of it) scored 5 x the fraction kept, from real sentences."""
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["sts"], num_train=1000, num_dev=200)
    config = FinetuningConfig.create("m", os.path.join(REPO_ROOT, "pretrain_data"), dict(
        TINY_MODEL, task_names=["sts"], random_init=True, raw_data_dir=raw, max_seq_length=64,
        learning_rate=1e-3, num_train_epochs=2, do_export=False, log_steps=1000,
        results_json=str(tmp_path / "r.json"), results_txt=str(tmp_path / "r.txt")))
    results = runner.run(config)
    dev = results["trials"][0]["metrics"]["sts"]["dev"]
    # A constant prediction has no correlation (and an MSE of the targets' variance).
    targets = [row.split("\t")[-1] for row in open(os.path.join(raw, "sts", "dev.tsv"))][1:]
    variance = float(np.var(np.array(targets, float) / 5))
    assert dev["spearman"] > 50 and dev["pearson"] > 50, dev
    assert dev["mse"] < 0.8 * variance, (dev, variance)
