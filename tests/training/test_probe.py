"""The learning probe (issue 34): the linear classifier, the `probe` hparam, the task checks, and
a tiny pretraining run that logs the probe beside its losses without changing its training."""

import json
import os

import numpy as np
import pytest

from electra_tf.config import PretrainingConfig, probe_settings
from electra_tf.config.hparams import ConfigError
from electra_tf.finetuning import linear_probe, probe
from electra_tf.finetuning.task_files import DataFileError
from electra_tf.training.tf import trainer as trainer_lib
from tests import backends, pretraining_fixtures as fx

pytestmark = pytest.mark.usefixtures("float32_policy")

PROBE_TAGS = ("probe/dev_accuracy", "probe/train_accuracy", "probe/seconds")


# --- The classifier ------------------------------------------------------------------------------
def _clusters(num: int, num_labels: int, dim: int, rng: np.random.Generator):
    """Gaussian points around one far-apart centre per label: linearly separable."""
    labels = rng.integers(0, num_labels, num)
    points = rng.normal(size=(num, dim))
    points[np.arange(num), labels] += 12.0  # label i: +12 along axis i, noise std 1
    return points, labels


def test_a_separable_toy_set_scores_one():
    rng = np.random.default_rng(0)
    train, dev = _clusters(300, 3, 8, rng), _clusters(300, 3, 8, rng)
    result = linear_probe.probe_accuracy(*train, *dev, num_labels=3, l2=1e-3)
    assert result.train_accuracy == 1.0 and result.dev_accuracy == 1.0
    assert result.majority_accuracy < 0.5


def test_shuffled_labels_score_chance():
    """Labels independent of the features: the dev accuracy is Binomial(n, 1/k) / n, whose
    standard deviation at n = 4000, k = 4 is 0.0068; the tolerance is 0.03 (4.4 sd)."""
    rng = np.random.default_rng(1)
    (train_x, train_y), (dev_x, dev_y) = _clusters(4000, 4, 16, rng), _clusters(4000, 4, 16, rng)
    result = linear_probe.probe_accuracy(train_x, rng.permutation(train_y), dev_x,
                                         rng.permutation(dev_y), num_labels=4, l2=1e-3)
    assert abs(result.dev_accuracy - 0.25) < 0.03
    # Unshuffled, the same points are separable: the shuffle alone made it chance.
    assert linear_probe.probe_accuracy(train_x, train_y, dev_x, dev_y, 4, 1e-3).dev_accuracy == 1.0


def test_the_fit_is_deterministic_and_its_gradient_exact():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(200, 10)), rng.integers(0, 3, 200)
    assert (linear_probe.probe_accuracy(x, y, x[:50], y[:50], 3, 1e-2)
            == linear_probe.probe_accuracy(x, y, x[:50], y[:50], 3, 1e-2))
    import scipy.optimize

    one_hot = np.eye(3)[y]
    error = scipy.optimize.check_grad(
        lambda p: linear_probe._objective(p, x, one_hot, 0.1)[0],
        lambda p: linear_probe._objective(p, x, one_hot, 0.1)[1], rng.normal(size=33))
    assert error < 1e-5


def test_constant_features_are_not_divided_by_zero():
    train, dev = linear_probe.standardise(np.ones((4, 2)), np.ones((2, 2)))
    assert np.all(train == 0.0) and np.all(dev == 0.0)


def test_pooled_features_average_real_tokens_or_take_cls():
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 0], [0, 0, 0]], np.int32)
    mean = np.asarray(probe.pooled_features(hidden, mask, "mean"))
    np.testing.assert_allclose(mean, [[1.0, 2.0], [0.0, 0.0]])  # a padded row: zeros, not NaN
    np.testing.assert_allclose(np.asarray(probe.pooled_features(hidden, mask, "cls")),
                               hidden[:, 0])


# --- The hparam ----------------------------------------------------------------------------------
def test_the_probe_hparam_is_a_plain_dict_resolved_with_its_defaults(tmp_path):
    config = PretrainingConfig.create("x", str(tmp_path), {"probe": {"task_dir": "t/bbc_news",
                                                                     "every_n_steps": 50}})
    assert config.probe == {"task_dir": "t/bbc_news", "every_n_steps": 50,
                            "max_train_examples": 1000, "max_dev_examples": 500,
                            "pooling": "mean", "l2": 1e-3}
    path = str(tmp_path / "config.json")
    config.save(path)
    assert PretrainingConfig.load(path).probe == config.probe
    assert PretrainingConfig.create("x", str(tmp_path)).probe is None  # off by default


@pytest.mark.parametrize("value, message", [
    ({"task_dir": "t", "every_n_step": 5}, "Unknown key 'probe.every_n_step'; did you mean "
                                           "'every_n_steps'?"),
    ({"every_n_steps": 5}, "hparam 'probe' needs 'task_dir'"),
    ({"task_dir": "t", "every_n_steps": 0}, "probe.every_n_steps must be in [1,"),
    ({"task_dir": "t", "every_n_steps": 2.5}, "hparam 'probe.every_n_steps' must be int"),
    ({"task_dir": "t", "pooling": "max"}, "probe.pooling must be one of mean, cls"),
    ({"task_dir": "t", "l2": 0}, "probe.l2 must be > 0"),
    ({"task_dir": "t", "max_train_examples": 1}, "probe.max_train_examples must be >= 2"),
    ({"task_dir": ""}, "probe.task_dir must name a directory"),
    ("t", "hparam 'probe' must be Mapping or null"),
])
def test_bad_probe_settings_are_one_line_errors_naming_the_key(tmp_path, value, message):
    with pytest.raises(ConfigError) as raised:
        PretrainingConfig.create("x", str(tmp_path), {"probe": value})
    assert message in str(raised.value) and "\n" not in str(raised.value)


# --- The task directory --------------------------------------------------------------------------
def write_task(root: str, name: str, rows_per_label: int = 12, labels=("a", "b"),
               dev: bool = True) -> str:
    """A generic classification task of the fixture vocab's words: label i's texts use words
    w(10 i) .. w(10 i + 9) only, so mean-pooled embeddings separate the labels."""
    directory = os.path.join(root, name)
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(len(name))
    splits = {"train": rows_per_label, **({"dev": rows_per_label // 2} if dev else {})}
    for split, count in splits.items():
        rows = ["text\tlabel"]
        for i, label in enumerate(labels):
            for _ in range(count):
                words = rng.integers(10 * i, 10 * i + 10, int(rng.integers(4, 12)))
                rows.append(" ".join(f"w{w}" for w in words) + f"\t{label}")
        with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
    return directory


def _settings(task_dir: str, **kwargs) -> probe_settings.ProbeSettings:
    return probe_settings.parse({"task_dir": task_dir, **kwargs})


def test_the_task_is_read_by_the_finetuning_readers_and_subsampled(tmp_path):
    directory = write_task(str(tmp_path), "topics", rows_per_label=30, labels=("x", "y", "z"))
    task, train, dev = probe.read_task(_settings(directory, max_train_examples=40,
                                                 max_dev_examples=7))
    assert task.labels == ("x", "y", "z") and len(train) == 40 and len(dev) == 7
    # A fixed subset (the same whatever the run), in file order.
    assert [e.guid for e in train] == [e.guid for e in probe.read_task(
        _settings(directory, max_train_examples=40))[1]]
    assert [int(e.guid.rsplit("-", 1)[1]) for e in train] == sorted(
        int(e.guid.rsplit("-", 1)[1]) for e in train)


@pytest.mark.parametrize("case, message", [
    ("missing", "no such directory"),
    ("sts", "task 'sts' is a regression task; the probe needs a classification task"),
    ("one_label", "needs at least 2 distinct labels"),
    ("no_dev", "no labelled dev file"),
])
def test_an_unusable_task_directory_is_a_one_line_error_naming_it(tmp_path, case, message):
    root = str(tmp_path)
    if case == "sts":
        write_task(root, "sts")
    elif case == "one_label":
        write_task(root, case, labels=("a",))
    elif case == "no_dev":
        write_task(root, case, dev=False)
    with pytest.raises(DataFileError) as raised:
        probe.read_task(_settings(os.path.join(root, case)))
    text = str(raised.value)
    assert message in text and "\n" not in text and (case in text or "train.tsv" in text)


def test_without_tensorflow_text_the_probe_is_a_one_line_error(tmp_path, monkeypatch):
    """The JAX / PyTorch trainer may run without TensorFlow; the probe's encoder needs it."""
    config = PretrainingConfig.create("x", str(tmp_path), {"probe": {"task_dir": "t"}})
    monkeypatch.setattr(probe.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(probe.TrainingError, match="needs tensorflow and tensorflow-text"):
        probe.Probe.for_run(config, vocab=None)
    with pytest.raises(probe.TrainingError, match="runs on one host"):
        probe.Probe.for_run(config, vocab=None, several_hosts=True)


def test_due_at_the_start_each_multiple_and_the_end():
    schedule = probe.Probe(_settings("t", every_n_steps=10), data=None)
    assert schedule.due(0, 0, 35) and not schedule.due(3, 3, 35)  # resumed at 3: not again
    assert not schedule.due(0, 8, 35) and schedule.due(8, 12, 35) and schedule.due(30, 35, 35)
    schedule.history[12] = {}
    assert not schedule.due(8, 12, 35)  # never twice at one step


# --- A pretraining run ---------------------------------------------------------------------------
# Dropout on: the probe's forward passes must not draw from the dropout streams either.
RUN = fx.tiny_hparams(num_train_steps=4, iterations_per_loop=2, save_checkpoints_steps=4)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return write_task(str(tmp_path_factory.mktemp("tasks")), "topics")


@pytest.fixture(scope="module")
def runs(data_dir, task_dir):
    """The tiny run with the probe every 2 steps, and without it."""
    hparams = dict(RUN, probe={"task_dir": task_dir, "every_n_steps": 2, "max_dev_examples": 8})
    with_probe = trainer_lib.run(fx.tiny_config(data_dir, "with_probe", **hparams),
                                 observers=probe.for_run)
    without = trainer_lib.run(fx.tiny_config(data_dir, "without_probe", **RUN))
    return {"with": with_probe, "without": without,
            "model_dir": os.path.join(data_dir, "models", "with_probe")}


@pytest.mark.slow  # the module's two tiny runs: ~26 s on 2 loaded cores
def test_a_run_logs_the_probe_beside_its_losses(runs):
    scalars = fx.read_scalars(runs["model_dir"], PROBE_TAGS + ("total_loss",))
    assert sorted(scalars["probe/dev_accuracy"]) == [0, 2, 4]  # the start, every 2 steps
    assert sorted(scalars["total_loss"]) == [2, 4]  # the same event files, the same steps
    # Words of disjoint ranges per label: separable on the embeddings from the first step.
    assert all(v == 1.0 for v in scalars["probe/dev_accuracy"].values())
    assert all(v > 0 for v in scalars["probe/seconds"].values())
    assert [r["step"] for r in runs["with"]["probe"]] == [0, 2, 4]
    assert runs["with"]["probe"][-1]["dev_accuracy"] == scalars["probe/dev_accuracy"][4]
    with open(os.path.join(runs["model_dir"], "config.json"), encoding="utf-8") as f:
        assert json.load(f)["probe"]["every_n_steps"] == 2


@pytest.mark.slow
def test_the_probe_does_not_change_training(runs):
    assert runs["with"]["final"]["weights_sha256"] == runs["without"]["final"]["weights_sha256"]
    assert runs["with"]["train"]["total_loss"] == runs["without"]["train"]["total_loss"]
    assert "probe" not in runs["without"]


def test_a_bad_task_directory_stops_the_run_before_anything_is_written(data_dir, tmp_path):
    config = fx.tiny_config(data_dir, "bad_probe", **dict(
        RUN, probe={"task_dir": str(tmp_path / "nowhere")}))
    with pytest.raises(DataFileError, match="no such directory"):
        trainer_lib.run(config, observers=probe.for_run)
    assert not os.path.exists(config.model_dir)


def test_a_run_given_no_probe_refuses_the_probe_hparam(data_dir, task_dir):
    """The pretraining command hands the run its probe; a run without one does not drop the
    hparam silently."""
    config = fx.tiny_config(data_dir, "no_probe_given", **dict(RUN, probe={"task_dir": task_dir}))
    with pytest.raises(probe.TrainingError, match="hparam probe: this run was given no"):
        trainer_lib.run(config)
    assert not os.path.exists(config.model_dir)


@pytest.mark.slow
def test_under_mirrored_strategy_the_chief_probes_the_mirrored_weights(data_dir, task_dir,
                                                                        mirrored_strategy):
    hparams = dict(RUN, num_train_steps=2, probe={"task_dir": task_dir, "every_n_steps": 2})
    results = trainer_lib.run(fx.tiny_config(data_dir, "mirrored_probe", **hparams),
                              strategy=mirrored_strategy, observers=probe.for_run)
    assert [(r["step"], r["dev_accuracy"]) for r in results["probe"]] == [(0, 1.0), (2, 1.0)]


@pytest.mark.slow
def test_the_jax_trainer_logs_the_probe_too(data_dir, task_dir):
    """`--backend jax` (the portable trainer): features by the same Keras model's predict on JAX
    (tensorflow-text stays importable: the task's encoder needs it)."""
    backends.require("jax")
    config = fx.tiny_config(data_dir, "jax_probe", **dict(
        RUN, num_train_steps=2, backend="jax",
        probe={"task_dir": task_dir, "every_n_steps": 2}))
    out = backends.run_on_backend("jax", f"""
        import json
        from electra_tf.config import PretrainingConfig
        from electra_tf.finetuning import probe
        from electra_tf.training.portable import trainer as portable_trainer
        results = portable_trainer.run(PretrainingConfig.from_dict(json.loads({config.to_json()!r})),
                                       observers=probe.for_run)
        out["steps"] = [r["step"] for r in results["probe"]]
        out["dev_accuracy"] = [r["dev_accuracy"] for r in results["probe"]]
        """, block_tensorflow=False)
    # JAX draws its own initial weights (Keras initializers use each backend's RNG): not the
    # TensorFlow run's 1.0 exactly, but far above the 0.5 of two balanced labels.
    assert out["steps"].tolist() == [0, 2] and min(out["dev_accuracy"]) > 0.75
    scalars = fx.read_scalars(config.model_dir, ("probe/dev_accuracy", "total_loss"))
    assert sorted(scalars["probe/dev_accuracy"]) == [0, 2] and sorted(scalars["total_loss"]) == [2]
