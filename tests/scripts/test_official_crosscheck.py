"""experiments/official_crosscheck.py and official_compat.py: the TF 2.21 stand-ins for what the
official TF 1.15 code imports, the curves' aggregation, and electra-tf's side of a run on CPU.

The official side needs a google-research/electra checkout, which is never fetched by a test:
`ELECTRA_OFFICIAL_DIR=/path/to/electra pytest tests/scripts/test_official_crosscheck.py` runs it.
"""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from experiments import official_compat, official_crosscheck
from tests.pretraining_fixtures import MAX_SEQ_LENGTH, VOCAB_SIZE, write_dataset

OFFICIAL_DIR = os.environ.get("ELECTRA_OFFICIAL_DIR")


def _run_graph(build):
    """Builds `build()` in a fresh compat.v1 graph, initialises, returns (values, variables)."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        outputs = build()
        init = v1.global_variables_initializer()
        variables = v1.global_variables()
    session = v1.Session(graph=graph)
    try:
        session.run(init)
        return session.run(outputs), {v.op.name: session.run(v) for v in variables}
    finally:
        session.close()


def test_layer_norm_names_and_values_are_contribs():
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32) * 5 + 2

    def build():
        return [official_compat.layer_norm(tf.constant(x)),
                official_compat.layer_norm(tf.constant(x))]

    (first, second), variables = _run_graph(build)
    # Default scope uniquified as contrib's: LayerNorm, LayerNorm_1; gamma 1, beta 0.
    assert sorted(variables) == ["LayerNorm/beta", "LayerNorm/gamma", "LayerNorm_1/beta",
                                 "LayerNorm_1/gamma"]
    np.testing.assert_array_equal(variables["LayerNorm/gamma"], np.ones(8, np.float32))
    np.testing.assert_array_equal(variables["LayerNorm/beta"], np.zeros(8, np.float32))
    mean = x.mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(first, second)
    with pytest.raises(NotImplementedError):
        official_compat.layer_norm(tf.constant(x), begin_norm_axis=1)


def test_dense_names_initialisers_and_rank_3_inputs():
    x = np.random.default_rng(1).normal(size=(2, 5, 6)).astype(np.float32)
    v1 = tf.compat.v1

    def build():
        with v1.variable_scope("head"):
            hidden = official_compat.dense(tf.constant(x), 4, activation=tf.nn.relu,
                                           kernel_initializer=v1.truncated_normal_initializer(
                                               stddev=0.02))
            logits = official_compat.dense(hidden, 1)
        named = official_compat.dense(tf.constant(x[0]), 3, name="query")
        return [hidden, logits, named]

    (hidden, logits, named), variables = _run_graph(build)
    assert sorted(variables) == ["head/dense/bias", "head/dense/kernel", "head/dense_1/bias",
                                 "head/dense_1/kernel", "query/bias", "query/kernel"]
    kernel, bias = variables["head/dense/kernel"], variables["head/dense/bias"]
    assert kernel.shape == (6, 4) and np.abs(kernel).max() <= 0.04  # truncated at 2 sigma
    np.testing.assert_array_equal(bias, np.zeros(4, np.float32))
    np.testing.assert_allclose(hidden, np.maximum(x @ kernel + bias, 0), rtol=1e-5, atol=1e-6)
    # No initializer: Glorot-uniform, bound sqrt(6 / (fan_in + fan_out)).
    glorot = variables["head/dense_1/kernel"]
    assert glorot.shape == (4, 1) and np.abs(glorot).max() <= math.sqrt(6 / 5)
    assert np.abs(glorot).max() > 0.05  # not the 0.02 truncated normal
    np.testing.assert_allclose(logits, hidden @ glorot, rtol=1e-5, atol=1e-6)
    assert named.shape == (5, 3)


def test_install_provides_what_the_official_code_imports():
    official_compat.install()
    from tensorflow.contrib import layers as contrib_layers  # noqa: the official import line

    assert contrib_layers.layer_norm is official_compat.layer_norm
    assert tf.compat.v1.layers.dense is official_compat.dense
    assert isinstance(tf.compat.v1.estimator.SessionRunHook, type)


def test_a_directory_that_is_not_the_official_checkout_is_refused_naming_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match=r"missing run_pretraining.py.*git clone"):
        official_compat.check_official_dir(str(tmp_path))


def _run(impl, setting, seed, points):
    return {"implementation": impl, "setting": setting, "seed": seed, "seconds": 1.0,
            "curve": [{"step": s, "disc_auc": v, "disc_loss": 1 - v} for s, v in points]}


def test_aggregate_and_compare_report_mean_seed_std_and_late_difference():
    runs = [_run("official", "hot", 0, [(100, 0.50), (200, 0.60), (300, 0.70)]),
            _run("official", "hot", 1, [(100, 0.52), (200, 0.62), (300, 0.72)]),
            _run("electra_tf", "hot", 0, [(100, 0.50), (200, 0.64), (300, 0.76)]),
            _run("electra_tf", "hot", 1, [(100, 0.50), (200, 0.64), (300, 0.76)])]
    aggregated = official_crosscheck.aggregate(runs)
    auc = aggregated["hot"]["official"]["disc_auc"]
    assert [row[0] for row in auc] == [100, 200, 300]
    np.testing.assert_allclose([row[1] for row in auc], [0.51, 0.61, 0.71])
    np.testing.assert_allclose([row[2] for row in auc], [0.02 / math.sqrt(2)] * 3)
    assert [row[3] for row in auc] == [2, 2, 2]
    late = official_crosscheck.compare(aggregated)["hot"]["electra_tf"]["disc_auc"]
    assert late["steps"] == [200, 300]  # the second half
    np.testing.assert_allclose(late["minus_official"], (0.03 + 0.05) / 2)
    np.testing.assert_allclose(late["seed_std"], 0.02 / math.sqrt(2))
    summary = official_crosscheck.summary_markdown(
        {"model": {}, "vocab_size": 1, "steps": 300, "every": 100, "seeds": [0, 1],
         "comparison": official_crosscheck.compare(aggregated)})
    assert "## hot (learning_rate 0.005, warmup 1% of the steps): electra_tf against official" \
        in summary
    assert "| disc_auc | 0.6600 | 0.7000 | +0.0400 | 0.0141 |" in summary


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("crosscheck"))
    write_dataset(path, examples_per_shard=64)
    return path


def test_electra_tf_side_writes_a_curve_point_per_window(data_dir, tmp_path):
    work = str(tmp_path)
    assert official_crosscheck.main(["_run", "--impl", "electra_tf", "--setting", "hot",
                                     "--seed", "0", "--steps", "4", "--every", "2",
                                     "--work-dir", work, "--data-dir", data_dir]) == 0
    with open(os.path.join(work, "runs", "electra_tf_hot_seed0.json")) as f:
        record = json.load(f)
    assert record["hparams"]["vocab_size"] == VOCAB_SIZE
    assert record["hparams"]["max_seq_length"] == MAX_SEQ_LENGTH  # read from the manifest
    assert record["hparams"]["learning_rate"] == official_crosscheck.SETTINGS["hot"][0]
    assert [p["step"] for p in record["curve"]] == [2, 4]
    for point in record["curve"]:
        assert 0.0 <= point["disc_auc"] <= 1.0 and point["disc_loss"] > 0
        assert 0.0 <= point["masked_lm_accuracy"] <= 1.0


def test_the_cpu_clip_variant_trains_with_the_official_gpu_clip_norm(data_dir, tmp_path):
    work = str(tmp_path)
    assert official_crosscheck.main(["_run", "--impl", "electra_tf_cpu_clip", "--setting", "hot",
                                     "--seed", "0", "--steps", "2", "--every", "2",
                                     "--work-dir", work, "--data-dir", data_dir]) == 0
    with open(os.path.join(work, "models", "electra_tf_cpu_clip_hot_seed0", "config.json")) as f:
        assert json.load(f)["official_gpu_clip_norm"] is True


def test_missing_data_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(SystemExit, match=r"vocab.txt not found: --data-dir needs"):
        official_crosscheck.dataset_shape(str(tmp_path))


@pytest.mark.skipif(not OFFICIAL_DIR, reason="set ELECTRA_OFFICIAL_DIR to a google-research/"
                                             "electra checkout (never fetched by the tests)")
def test_official_side_trains_and_reports_the_same_metrics(data_dir, tmp_path):
    work = str(tmp_path)
    assert official_crosscheck.main(["_run", "--impl", "official", "--setting", "official",
                                     "--seed", "0", "--steps", "4", "--every", "2",
                                     "--work-dir", work, "--data-dir", data_dir,
                                     "--official-dir", OFFICIAL_DIR]) == 0
    with open(os.path.join(work, "runs", "official_official_seed0.json")) as f:
        record = json.load(f)
    assert [p["step"] for p in record["curve"]] == [2, 4]
    assert set(official_crosscheck.TAGS) <= set(record["curve"][-1])
