"""Fine-tuning units: config, layer-wise learning rates, data reading, pair encoding, metrics."""

import math
import os
import random

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.finetuning import metrics
from electra_tf.finetuning.classification.data import load_task
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.encoding import (TextEncoder, truncate_seq_pair_reference,
                                            truncated_pair_lengths)
from electra_tf.finetuning.model import FinetuningModel, summed_loss
from electra_tf.finetuning.optimization import check_covered, layerwise_lr_multipliers
from electra_tf.finetuning.task_files import DataFileError, read_rows
from electra_tf.config.hparams import ConfigError
from electra_tf.training.optimizers import AdamWeightDecay
from electra_tf.vocab import REQUIRED_TOKENS, load_vocab

TINY_ENCODER = dict(vocab_size=30, hidden_size=8, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=16, embedding_size=4)


# ------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------
def test_config_has_the_official_defaults_and_paths(tmp_path):
    config = FinetuningConfig.create("electra_small", str(tmp_path), {"task_names": ["sst"]})
    assert (config.learning_rate, config.layerwise_lr_decay, config.num_train_epochs,
            config.train_batch_size, config.max_seq_length, config.warmup_proportion,
            config.weight_decay_rate, config.embedding_size) == (1e-4, 0.8, 3.0, 32, 128, 0.1, 0.01, 128)
    assert config.layerwise_lr_decay_fix is False
    model = os.path.join(str(tmp_path), "models", "electra_small")
    assert config.init_checkpoint == model
    assert config.trial_model_dir(2) == os.path.join(model, "finetuning_models", "sst_model_2")
    assert config.results_txt == os.path.join(model, "results", "sst_results.txt")
    assert config.raw_data_dir == os.path.join(str(tmp_path), "finetuning_data")


def test_config_presets_apply_only_to_keys_the_user_left_alone(tmp_path):
    rte = FinetuningConfig.create("m", str(tmp_path), {"task_names": ["rte"]})
    assert rte.num_train_epochs == 10.0
    assert FinetuningConfig.create("m", str(tmp_path), {"task_names": ["rte"],
                                                        "num_train_epochs": 2}).num_train_epochs == 2.0
    large = FinetuningConfig.create("m", str(tmp_path), {"task_names": "mnli,qqp", "model_size": "large"})
    assert (large.learning_rate, large.layerwise_lr_decay, large.task_names) == (5e-5, 0.9, ("mnli", "qqp"))
    assert FinetuningConfig.create("m", str(tmp_path), {"model_size": "large",
                                                        "learning_rate": 1e-3}).learning_rate == 1e-3


def test_official_tpu_hparams_are_accepted_and_dropped(tmp_path):
    official = {"use_tpu": True, "num_tpu_cores": 8, "tpu_job_name": "worker",
                "tpu_name": "t", "tpu_zone": "z", "gcp_project": "p"}
    config = FinetuningConfig.create("m", str(tmp_path), {"task_names": ["sst"], **official})
    saved = config.to_dict()
    assert not set(official) & set(saved)
    # A config.json written by an older version (which stored them) still loads.
    assert FinetuningConfig.from_dict({**saved, **official}).to_dict() == saved
    with pytest.raises(ConfigError, match=r"Unknown hparam 'use_tpus'"):
        FinetuningConfig.create("m", str(tmp_path), {"use_tpus": True})


def test_unknown_or_mistyped_hparam_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"Unknown hparam 'layerwise_lr_decy'; did you mean 'layerwise_lr_decay'"):
        FinetuningConfig.create("m", str(tmp_path), {"layerwise_lr_decy": 0.8})
    with pytest.raises(ConfigError, match=r"hparam 'num_trials' must be int"):
        FinetuningConfig.create("m", str(tmp_path), {"num_trials": "3"})
    with pytest.raises(ConfigError, match=r"hparam 'task_names' must be a list"):
        FinetuningConfig.create("m", str(tmp_path), {"task_names": [1]})


# ------------------------------------------------------------------------------------------------
# Layer-wise learning rate (parity item 33 and the issue #51 fix)
# ------------------------------------------------------------------------------------------------
def _multipliers_by_depth(fix):
    model = FinetuningModel(TINY_ENCODER, [{"name": "sst", "num_labels": 2}])
    multipliers = layerwise_lr_multipliers(3, 0.8, fix_depth_gap=fix)
    check_covered(model.trainable_variables, multipliers)
    optimizer = AdamWeightDecay(1e-4, lr_multipliers=multipliers)
    out = {}
    for variable in model.trainable_variables:
        path = variable.path
        group = ("emb" if "/embeddings" in path else "head" if path.startswith("task_specific/")
                 else path.split("/")[1])
        out.setdefault(group, set()).add(optimizer.lr_multiplier(variable))
    return out


def test_layerwise_multipliers_are_exactly_the_official_ones_with_the_depth_gap():
    # L = 3: depth(emb) = 0, layer i -> i + 1, head -> L + 2 = 5; multiplier 0.8^(5 - depth).
    groups = _multipliers_by_depth(fix=False)
    assert set(groups) == {"emb", "layer_0", "layer_1", "layer_2", "head"}
    expected = {"emb": 0.8 ** 5, "layer_0": 0.8 ** 4, "layer_1": 0.8 ** 3, "layer_2": 0.8 ** 2, "head": 1.0}
    for group, value in expected.items():
        assert len(groups[group]) == 1 and groups[group].pop() == pytest.approx(value, rel=1e-12), group


def test_layerwise_fix_puts_the_head_at_depth_l_plus_1():
    groups = _multipliers_by_depth(fix=True)
    expected = {"emb": 0.8 ** 4, "layer_0": 0.8 ** 3, "layer_1": 0.8 ** 2, "layer_2": 0.8, "head": 1.0}
    for group, value in expected.items():
        assert len(groups[group]) == 1 and groups[group].pop() == pytest.approx(value, rel=1e-12), group


def test_layer_1_pattern_does_not_catch_layer_10_and_uncovered_variables_fail():
    multipliers = layerwise_lr_multipliers(12, 0.5)
    optimizer = AdamWeightDecay(1e-4, lr_multipliers=multipliers)
    layer_10 = tf.Variable(0.0, name="x")
    layer_10_path = type("V", (), {"path": "electra/layer_10/ffn/kernel"})()
    layer_1_path = type("V", (), {"path": "electra/layer_1/ffn/kernel"})()
    assert optimizer.lr_multiplier(layer_10_path) == 0.5 ** (14 - 11)
    assert optimizer.lr_multiplier(layer_1_path) == 0.5 ** (14 - 2)
    with pytest.raises(ValueError, match="variable 'x' matches no layer key"):
        check_covered([layer_10], multipliers)
    assert layerwise_lr_multipliers(12, 0.0) == {}


def test_summed_loss_is_a_sum_over_the_batch_under_each_examples_task():
    # Each head computes a loss on every record (official); the total takes each record's own
    # task's, and a padding record (task id 2 = number of tasks) adds nothing.
    logits = {"a": tf.constant([[2.0, 0.0], [0.0, 1.0], [5.0, 5.0], [9.0, 0.0]]),
              "b": tf.constant([[0.0, 0.0, 3.0], [1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0.0, 9.0, 0.0]])}
    features = {"a_label_ids": tf.constant([0, 0, 1, 0]), "b_label_ids": tf.constant([0, 2, 0, 0])}
    outputs = {}
    for name in ("a", "b"):
        labels = features[f"{name}_label_ids"]
        outputs[name] = {"loss": tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits[name])}
    tasks = tf.constant([0, 1, 0, 2])
    loss = float(summed_loss(outputs, tasks, ["a", "b"]))

    def ce(row, label):
        row = np.asarray(row, np.float64)
        return math.log(np.exp(row).sum()) - row[label]

    expected = ce([2, 0], 0) + ce([1, 2, 3], 2) + ce([5, 5], 1)
    assert loss == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------------------------------------
# Data files
# ------------------------------------------------------------------------------------------------
def _write(path, text, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(text)
    return str(path)


def _task_dir(tmp_path, name="toy", **files):
    for split, text in files.items():
        _write(os.path.join(tmp_path, name, split), text)
    return str(tmp_path)


def test_generic_tsv_and_csv_tasks_read_text_text_b_and_labels(tmp_path):
    raw = _task_dir(tmp_path, **{"train.tsv": "id\ttext\tlabel\n1\tgood film\tpos\n2\tbad\tneg\n",
                                 "dev.tsv": "text\tlabel\nok\tpos\n",
                                 "test.tsv": "text\nunlabelled one\n"})
    data = load_task("toy", raw)
    assert data.task.labels == ("neg", "pos") and not data.task.is_pair
    assert [(e.text_a, e.label) for e in data.train] == [("good film", "pos"), ("bad", "neg")]
    assert data.labelled == {"train": True, "dev": True, "test": False}
    assert data.train[1].source.endswith("train.tsv:3")
    raw = _task_dir(tmp_path / "csv", name="pairs",
                    **{"train.csv": 'text,text_b,label\n"a, quoted",b,yes\nc,d,no\n'})
    pairs = load_task("pairs", raw)
    assert pairs.task.is_pair and pairs.train[0].text_a == "a, quoted" and pairs.train[0].text_b == "b"


@pytest.mark.parametrize("files, message", [
    ({"train.tsv": "sentence\tlabel\nx\t1\n"}, r"train.tsv:1: missing column 'text'"),
    ({"train.tsv": "text\tlabel\nx\t1\n\ny\t0\n"}, r"train.tsv:3: empty line"),
    ({"train.tsv": "text\tlabel\nx\t1\ny\n"}, r"train.tsv:3: expected 2 fields"),
    ({"train.tsv": "text\tlabel\nx\t1\n \t0\n"}, r"train.tsv:3: empty 'text'"),
    ({"train.tsv": "text\tlabel\nx\t1\ny\t0\n", "test.tsv": "text\tlabel\nz\t1\nw\t2\n"},
     r"test.tsv:3: label '2' is not one of the training labels \['0', '1'\]"),
    ({"train.tsv": "text\tlabel\nx\t1\ny\t0\n", "dev.tsv": "text\tlabel\ntext_b\n"},
     r"dev.tsv:2: expected 2 fields"),
    ({"train.tsv": "text\tlabel\nx\t1\ny\t0\n", "dev.tsv": "text\ttext_b\tlabel\na\tb\t1\n"},
     r"dev.tsv:1: has column 'text_b' but .*train.tsv does not"),
    ({"train.csv": 'text,label\n"x,1\n'}, r"train.csv:\d+: .*"),
])
def test_bad_data_files_get_errors_naming_file_and_line(tmp_path, files, message):
    raw = _task_dir(tmp_path, **files)
    with pytest.raises(DataFileError, match=message):
        load_task("toy", raw)


def test_undecodable_bytes_name_the_line(tmp_path):
    path = _write(tmp_path / "toy" / "train.tsv", b"text\tlabel\nok\t1\nbad \xff\t0\n", "wb")
    with pytest.raises(DataFileError, match=r"train.tsv:3: not valid UTF-8"):
        read_rows(path)


def test_missing_task_directory_and_unsupported_tasks(tmp_path):
    with pytest.raises(DataFileError, match=r"task 'nope': no data directory"):
        load_task("nope", str(tmp_path))
    with pytest.raises(DataFileError, match="is not a classification task"):
        load_task("squad", str(tmp_path))


def test_glue_layouts_cola_mrpc_mnli(tmp_path):
    raw = str(tmp_path)
    # CoLA: no header in train/dev; test has one.
    _write(tmp_path / "CoLA" / "train.tsv", "gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode the.\n")
    _write(tmp_path / "CoLA" / "dev.tsv", "gj04\t1\t\tA fine one.\n")
    _write(tmp_path / "CoLA" / "test.tsv", "index\tsentence\n0\tHello there.\n")
    cola = load_task("cola", raw)
    assert [(e.text_a, e.label) for e in cola.train] == [("The sailors rode.", "1"), ("Rode the.", "0")]
    assert cola.test[0].text_a == "Hello there." and cola.labelled["test"] is False
    # MRPC: label first; training pairs doubled in both orders (double_unordered).
    _write(tmp_path / "mrpc" / "train.tsv",
           "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b.\tC d.\n")
    mrpc = load_task("mrpc", raw)
    assert [(e.text_a, e.text_b, e.label) for e in mrpc.train] == [("A b.", "C d.", "1"),
                                                                    ("C d.", "A b.", "1")]
    assert len(load_task("mrpc", raw, double_unordered=False).train) == 1
    # MNLI: sentences in columns 8/9, label last, dev file dev_matched.tsv.
    header = "\t".join(f"c{i}" for i in range(12)) + "\n"
    row = "\t".join(["0"] * 8 + ["Premise.", "Hypothesis.", "x", "neutral"]) + "\n"
    _write(tmp_path / "MNLI" / "train.tsv", header + row)
    _write(tmp_path / "MNLI" / "dev_matched.tsv", header + row.replace("neutral", "entailment"))
    mnli = load_task("mnli", raw)
    assert mnli.task.labels == ("contradiction", "entailment", "neutral")
    assert (mnli.dev[0].text_a, mnli.dev[0].text_b, mnli.dev[0].label) == ("Premise.", "Hypothesis.",
                                                                          "entailment")
    _write(tmp_path / "RTE" / "train.tsv", "index\ts1\ts2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(DataFileError, match=r"train.tsv:2: label 'maybe' is not one of"):
        load_task("rte", raw)


# ------------------------------------------------------------------------------------------------
# Pair encoding
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_encoder(tmp_path_factory):
    words = [f"w{i}" for i in range(20)]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(list(REQUIRED_TOKENS) + words) + "\n")
    vocab = load_vocab(str(path))
    return TextEncoder(Tokenizer(vocab), max_seq_length=12), vocab


def test_truncation_closed_form_equals_berts_loop_on_every_small_case():
    for budget in range(0, 14):
        for la in range(0, 16):
            for lb in range(0, 16):
                a, b = list(range(la)), list(range(lb))
                truncate_seq_pair_reference(a, b, budget)
                got = truncated_pair_lengths(np.array([la]), np.array([lb]), budget)
                assert (int(got[0][0]), int(got[1][0])) == (len(a), len(b)), (budget, la, lb)


def test_pair_encoding_layout_segments_and_longest_first_truncation(text_encoder):
    encoder, vocab = text_encoder
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    cls, sep = vocab.special.cls_id, vocab.special.sep_id
    rng = random.Random(0)
    texts_a, texts_b, expected = [], [], []
    for la, lb in [(2, 3), (9, 1), (1, 9), (6, 6), (7, 5), (0 + 1, 1), (12, 12)]:
        a = [f"w{rng.randrange(20)}" for _ in range(la)]
        b = [f"w{rng.randrange(20)}" for _ in range(lb)]
        texts_a.append(" ".join(a))
        texts_b.append(" ".join(b))
        ta, tb = list(a), list(b)
        truncate_seq_pair_reference(ta, tb, 12 - 3)
        expected.append(([cls] + [ids[t] for t in ta] + [sep] + [ids[t] for t in tb] + [sep],
                         [0] * (len(ta) + 2) + [1] * (len(tb) + 1)))
    features = encoder.encode_examples(texts_a, texts_b)
    for row, (want_ids, want_segments) in enumerate(expected):
        n = len(want_ids)
        assert features["input_ids"][row].tolist() == want_ids + [0] * (12 - n)
        assert features["segment_ids"][row].tolist() == want_segments + [0] * (12 - n)
        assert features["input_mask"][row].tolist() == [1] * n + [0] * (12 - n)
    single = encoder.encode_examples([" ".join(f"w{i}" for i in range(15))])
    assert single["input_ids"][0].tolist() == [cls] + [ids[f"w{i}"] for i in range(10)] + [sep]
    assert single["segment_ids"][0].sum() == 0
    # Serving pads to the longest row instead of max_seq_length, with the same content.
    served = encoder.encode(tf.constant(texts_a[:1]), tf.constant(texts_b[:1]))
    assert served["input_ids"].numpy()[0].tolist() == expected[0][0]


# ------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------
def test_binary_metrics_match_a_hand_computation():
    labels = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 1])
    preds = np.array([1, 1, 1, 0, 0, 0, 1, 0, 0, 0])
    # tp=3 fn=2 fp=1 tn=4
    m = metrics.classification_metrics(labels, preds, 2)
    assert m["accuracy"] == pytest.approx(0.7)
    assert m["f1"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 2))
    f1_negative = 2 * 4 / (2 * 4 + 2 + 1)
    assert m["macro_f1"] == pytest.approx((m["f1"] + f1_negative) / 2)
    assert m["mcc"] == pytest.approx((3 * 4 - 1 * 2) / math.sqrt(4 * 5 * 5 * 6))
    assert metrics.classification_metrics(np.array([0, 1]), np.array([1, 1]), 2)["mcc"] == 0.0


def test_multiclass_mcc_and_macro_f1_match_a_hand_computation():
    labels = np.array([0, 0, 1, 1, 2, 2])
    preds = np.array([0, 1, 1, 1, 2, 0])
    m = metrics.classification_metrics(labels, preds, 4)  # class 3 never occurs: left out of macro
    # confusion: t=[2,2,2], p=[2,3,1], c=4, s=6
    assert m["mcc"] == pytest.approx((4 * 6 - (2 * 2 + 3 * 2 + 1 * 2)) / math.sqrt((36 - 14) * (36 - 12)))
    f1 = [2 * 1 / (2 + 1 + 1), 2 * 2 / (4 + 1 + 0), 2 * 1 / (2 + 0 + 1)]
    assert m["macro_f1"] == pytest.approx(sum(f1) / 3)
    assert "f1" not in m and m["accuracy"] == pytest.approx(4 / 6)
    assert metrics.mean_and_std([0.5, 0.7, 0.9]) == {"mean": pytest.approx(0.7), "std": pytest.approx(0.2)}
