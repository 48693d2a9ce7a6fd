"""The Trainer on one device: checkpoints, exact resume, NaN stop, TensorBoard, eval, precision.

A tiny model (hidden 64, 2 layers, embedding 32, vocab 100, seq 32, batch 8) on random shards.
One uninterrupted run ("run A": 8 steps, checkpoint every 3, loops of 2, keep 2, then eval) is
shared by several tests; the resume test repeats it in two halves and compares bit for bit.
"""

import dataclasses
import logging
import os
import re
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.data.records import pipeline
from electra_tf.pretraining.metrics import METRIC_NAMES
from electra_tf.training import run_dir
from electra_tf.training.tf import trainer as trainer_lib
from tests import pretraining_fixtures as fx

RUN_A = dict(num_train_steps=8, save_checkpoints_steps=3, iterations_per_loop=2,
             keep_checkpoint_max=2, do_eval=True)
# Loops stop at checkpoint boundaries: 0->2, 2->3 | 3->5, 5->6 | 6->8.
RUN_A_LOGGED_STEPS = [2, 3, 5, 6, 8]
RUN_A_SAVED_STEPS = [0, 3, 6, 8]
TRAIN_SCALARS = ("total_loss", "masked_lm_loss", "disc_loss", "masked_lm_accuracy",
                 "sampled_masked_lm_accuracy", "disc_accuracy", "disc_precision", "disc_recall",
                 "disc_auc", "learning_rate", "grad_norm", "examples_per_second",
                 "tokens_per_second")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


def _state(trainer):
    return {"weights": [v.numpy().copy() for v in trainer.model.trainable_variables
                        + trainer.model.non_trainable_variables],
            "optimizer": [v.numpy().copy() for v in trainer.optimizer.variables],
            "fingerprint": trainer.weights_fingerprint(), "step": trainer.step}


@pytest.fixture(scope="module")
def run_a(data_dir):
    config = fx.tiny_config(data_dir, "run_a", **RUN_A)
    records = _Records()
    logger = logging.getLogger("electra_tf")
    logger.addHandler(records)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        trainer = trainer_lib.Trainer(config)
        before = {"config_exists": os.path.exists(os.path.join(config.model_dir, "config.json")),
                  "checkpoint": tf.train.latest_checkpoint(config.model_dir),
                  "step": trainer.step}
        scalars = trainer.train()
        state = _state(trainer)
        eval_results = trainer.evaluate()
    finally:
        logger.removeHandler(records)
        logger.setLevel(old_level)
    return {"config": config, "trainer": trainer, "before": before, "scalars": scalars,
            "state": state, "eval": eval_results, "log": records.messages}


def _saved_steps(messages):
    return [int(m.rsplit("-", 1)[1]) for m in messages if m.startswith("saved checkpoint")]


# ------------------------------------------------------------------------------------------------
# Training and checkpoints
# ------------------------------------------------------------------------------------------------
def test_config_json_is_written_before_step_0(run_a):
    before = run_a["before"]
    assert before["config_exists"] and before["step"] == 0 and before["checkpoint"] is None
    saved = PretrainingConfig.load(os.path.join(run_a["config"].model_dir, "config.json"))
    # The user's config, plus what the run recorded of its device (mixed_precision resolved).
    assert saved == run_a["trainer"].config
    assert saved == dataclasses.replace(run_a["config"], resolved_mixed_precision="float32",
                                        resolved_mixed_precision_reason="set explicitly")
    with open(os.path.join(run_a["config"].model_dir, "vocab.txt"), "rb") as f:
        assert f.read() == open(os.path.join(run_a["config"].data_dir, "vocab.txt"), "rb").read()


def test_checkpoints_every_save_checkpoints_steps_and_at_the_end(run_a):
    assert run_a["trainer"].step == 8
    assert _saved_steps(run_a["log"]) == RUN_A_SAVED_STEPS


def test_keep_checkpoint_max_is_honoured(run_a):
    model_dir = run_a["config"].model_dir
    kept = sorted(int(f.split("-")[1].split(".")[0]) for f in os.listdir(model_dir)
                  if f.startswith("ckpt-") and f.endswith(".index"))
    assert kept == [6, 8]
    state = tf.train.get_checkpoint_state(model_dir)
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-6", "ckpt-8"]
    assert os.path.basename(state.model_checkpoint_path) == "ckpt-8"


def test_training_loss_is_finite_and_scalars_complete(run_a):
    scalars = run_a["scalars"]
    assert set(TRAIN_SCALARS) <= set(scalars)
    assert all(np.isfinite(v) for v in scalars.values())
    # The official weighting, total = 1 * mlm + 50 * disc, holds for the loop averages.
    assert scalars["total_loss"] == pytest.approx(
        scalars["masked_lm_loss"] + 50.0 * scalars["disc_loss"], rel=1e-4)


# ------------------------------------------------------------------------------------------------
# Resume
# ------------------------------------------------------------------------------------------------
def test_resume_continues_exactly_like_an_uninterrupted_run(run_a, data_dir):
    config = fx.tiny_config(data_dir, "run_b", **RUN_A)
    first = trainer_lib.Trainer(config)
    first.train(stop_at_step=3)
    assert first.step == 3
    halfway = _state(first)
    del first

    second = trainer_lib.Trainer(config)
    assert second.restored_from.endswith("ckpt-3")
    # Same step counter, optimizer slots and learning-rate position as when it stopped.
    assert second.step == 3
    for saved, restored in zip(halfway["optimizer"], second.optimizer.variables):
        np.testing.assert_array_equal(saved, restored.numpy())
    assert float(second.schedule(second.optimizer.iterations)) == float(second.schedule(3))
    second.train()
    resumed = _state(second)
    uninterrupted = run_a["state"]
    assert resumed["step"] == uninterrupted["step"] == 8
    for a, b in zip(uninterrupted["weights"], resumed["weights"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(uninterrupted["optimizer"], resumed["optimizer"]):
        np.testing.assert_array_equal(a, b)
    assert resumed["fingerprint"] == uninterrupted["fingerprint"]
    del second

    # Raising num_train_steps continues the same run (the official way to train longer); a new
    # global batch size is allowed too: the saved data position belongs to the old batching, so
    # the data restarts (reshuffled) while weights, optimizer and step carry on.
    longer = fx.tiny_config(data_dir, "run_b", **dict(RUN_A, num_train_steps=10, train_batch_size=4))
    third = trainer_lib.Trainer(longer)
    assert third.step == 8
    for a, b in zip(resumed["weights"], third.model.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())
    third.train()
    assert third.step == 10
    assert PretrainingConfig.load(os.path.join(longer.model_dir, "config.json")).num_train_steps == 10
    assert tf.train.latest_checkpoint(longer.model_dir).endswith("ckpt-10")


def test_resume_at_num_train_steps_trains_nothing(run_a, data_dir):
    config = fx.tiny_config(data_dir, "run_a", **RUN_A)
    again = trainer_lib.Trainer(config)
    assert again.step == 8
    assert again.train() == {}
    assert again.weights_fingerprint() == run_a["state"]["fingerprint"]


def _incompatible(data_dir, tmp_path, run_a, **overrides):
    """A config resuming run A's directory with other settings (data made to match them)."""
    other_data = str(tmp_path / "other_data")
    vocab = overrides.pop("vocab", None)
    max_seq_length = overrides.get("max_seq_length", fx.MAX_SEQ_LENGTH)
    fx.write_dataset(other_data, examples_per_shard=10, max_seq_length=max_seq_length, vocab=vocab)
    return fx.tiny_config(other_data, "run_a", **dict(RUN_A, model_dir=run_a["config"].model_dir,
                                                     **overrides))


@pytest.mark.parametrize("overrides,key", [
    ({"model_hparam_overrides": {"hidden_size": 128}}, "model_hparam_overrides"),
    ({"max_seq_length": 64}, "max_seq_length"),
    ({"embedding_size": 16}, "embedding_size"),
    ({"vocab": fx.vocab_tokens(prefix="x")}, "vocab"),
], ids=["hidden_size", "max_seq_length", "embedding_size", "vocab"])
def test_resume_with_incompatible_config_is_a_clear_error(run_a, data_dir, tmp_path, overrides, key):
    config_path = os.path.join(run_a["config"].model_dir, "config.json")
    before = open(config_path, "rb").read()
    config = _incompatible(data_dir, tmp_path, run_a, **overrides)
    with pytest.raises(trainer_lib.TrainingError) as err:
        trainer_lib.Trainer(config)
    message = str(err.value)
    assert key in message and run_a["config"].model_dir in message and "\n" not in message
    assert open(config_path, "rb").read() == before  # the run is left as it was


def test_checkpoint_of_another_model_without_config_is_a_clear_error(run_a, data_dir, tmp_path):
    model_dir = str(tmp_path / "no_config")
    shutil.copytree(run_a["config"].model_dir, model_dir)
    os.remove(os.path.join(model_dir, "config.json"))
    config = fx.tiny_config(data_dir, "x", **dict(RUN_A, model_dir=model_dir,
                                                  model_hparam_overrides={"hidden_size": 128}))
    with pytest.raises(trainer_lib.TrainingError, match="cannot resume from .*ckpt-8"):
        trainer_lib.Trainer(config)


# ------------------------------------------------------------------------------------------------
# Non-finite loss
# ------------------------------------------------------------------------------------------------
def test_non_finite_loss_stops_naming_step_and_term_and_keeps_last_good_checkpoint(data_dir):
    config = fx.tiny_config(data_dir, "nan", num_train_steps=6, save_checkpoints_steps=2,
                            iterations_per_loop=2)
    trainer = trainer_lib.Trainer(config)
    trainer.train(stop_at_step=2)
    good = _state(trainer)
    # Poison the discriminator head only: the generator's MLM loss stays finite.
    head = [v for v in trainer.model.trainable_variables if "discriminator_predictions" in v.path]
    head[0].assign(tf.fill(head[0].shape, np.nan))
    with pytest.raises(trainer_lib.TrainingError) as err:
        trainer.train()
    message = str(err.value)
    assert re.search(r"\bstep 2\b", message), message
    assert "disc_loss" in message and "masked_lm_loss" not in message
    assert "ckpt-2" in message
    assert tf.train.latest_checkpoint(config.model_dir).endswith("ckpt-2")
    assert not any(f.startswith("ckpt-3") or f.startswith("ckpt-4")
                   for f in os.listdir(config.model_dir))
    del trainer

    restored = trainer_lib.Trainer(config)
    assert restored.step == 2
    for a, b in zip(good["weights"], restored.model.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())
    assert all(np.isfinite(v.numpy()).all() for v in restored.model.trainable_variables)


# ------------------------------------------------------------------------------------------------
# TensorBoard
# ------------------------------------------------------------------------------------------------
def _read_scalars(directory):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(directory, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = {}
    for tag in acc.Tags()["tensors"]:
        values = {e.step: tf.make_ndarray(e.tensor_proto) for e in acc.Tensors(tag)}
        # Scalars only: the same logdir holds the config as text and the hparams.
        if all(v.ndim == 0 and v.dtype.kind == "f" for v in values.values()):
            scalars[tag] = {step: float(v) for step, v in values.items()}
    for tag in acc.Tags()["scalars"]:
        scalars[tag] = {e.step: e.value for e in acc.Scalars(tag)}
    return scalars


def test_tensorboard_scalars_present_at_each_loop_end(run_a):
    scalars = _read_scalars(run_a["config"].model_dir)
    for name in TRAIN_SCALARS:
        assert name in scalars, f"missing scalar {name}: {sorted(scalars)}"
        assert sorted(scalars[name]) == RUN_A_LOGGED_STEPS, name
        assert all(np.isfinite(v) for v in scalars[name].values()), name
    assert all(v > 0 for v in scalars["examples_per_second"].values())
    # Up to 32 tokens per example and at least 8.
    for step in RUN_A_LOGGED_STEPS:
        ratio = scalars["tokens_per_second"][step] / scalars["examples_per_second"][step]
        assert 8 <= ratio <= 32
    assert scalars["total_loss"][8] == pytest.approx(run_a["scalars"]["total_loss"], rel=1e-6)


def test_tensorboard_learning_rate_is_the_schedule(run_a):
    scalars = _read_scalars(run_a["config"].model_dir)
    schedule = run_a["trainer"].schedule
    # Logged at step s: the rate of the update that completed step s, i.e. lr(s - 1).
    for step, value in scalars["learning_rate"].items():
        assert value == pytest.approx(float(schedule(step - 1)), rel=1e-6, abs=1e-12)
    # The official formula: lr0 * (1 - t/T) * min(1, t/W), lr0 5e-4, T 8, W 2.
    assert scalars["learning_rate"][2] == pytest.approx(5e-4 * (1 - 1 / 8) * 0.5, rel=1e-6)
    assert scalars["learning_rate"][8] == pytest.approx(5e-4 * (1 - 7 / 8), rel=1e-6)


# ------------------------------------------------------------------------------------------------
# Eval
# ------------------------------------------------------------------------------------------------
def _read_eval_results(model_dir):
    results = {}
    with open(os.path.join(model_dir, "eval_results.txt"), encoding="utf-8") as f:
        for line in f:
            key, value = line.strip().split(" = ")
            results[key] = float(value)
    return results


def test_eval_results_file_has_official_metric_names(run_a):
    written = _read_eval_results(run_a["config"].model_dir)
    # disc_collapsed: the collapse guard's verdict (0 here: step 8 is early), not official
    assert set(written) == set(METRIC_NAMES) | {"loss", "global_step", "disc_collapsed"}
    assert written["disc_collapsed"] == 0.0
    assert written["global_step"] == 8
    for key, value in run_a["eval"].items():
        assert written[key] == pytest.approx(value, rel=1e-7)
    assert all(np.isfinite(v) for v in written.values())
    eval_scalars = _read_scalars(os.path.join(run_a["config"].model_dir, "eval"))
    assert eval_scalars["disc_auc"] == {8: pytest.approx(run_a["eval"]["disc_auc"], rel=1e-6)}


def test_eval_reads_the_held_out_split_and_is_deterministic(run_a, data_dir, monkeypatch):
    calls = []
    real = pipeline.make_dataset

    def spy(patterns, **kwargs):
        calls.append((patterns, kwargs["is_training"]))
        return real(patterns, **kwargs)

    monkeypatch.setattr(pipeline, "make_dataset", spy)
    # Same trainer, evaluated again: identical.
    again = run_a["trainer"].evaluate()
    assert again == run_a["eval"]
    assert calls == [(run_a["config"].eval_tfrecords, False)]
    assert "eval_data.tfrecord" in run_a["config"].eval_tfrecords
    # A fresh eval-only run restored from the same checkpoint: identical, and the saved config
    # is left alone.
    config_path = os.path.join(run_a["config"].model_dir, "config.json")
    before = open(config_path, "rb").read()
    eval_only = fx.tiny_config(data_dir, "run_a", **dict(RUN_A, do_train=False))
    fresh = trainer_lib.Trainer(eval_only)
    assert fresh.step == 8 and fresh.train_iterator is None
    assert fresh.evaluate() == run_a["eval"]
    assert open(config_path, "rb").read() == before


def test_eval_or_export_without_a_checkpoint_is_an_error(data_dir):
    config = fx.tiny_config(data_dir, "never_trained", do_train=False, do_eval=True)
    with pytest.raises(trainer_lib.TrainingError, match="no checkpoint"):
        trainer_lib.Trainer(config)
    assert not os.path.exists(config.model_dir)


# ------------------------------------------------------------------------------------------------
# Precision and XLA
# ------------------------------------------------------------------------------------------------
ONE_LAYER = {"num_hidden_layers": 1}  # quicker to trace; enough to exercise the precision paths


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_with_finite_float32_losses(data_dir, policy):
    config = fx.tiny_config(data_dir, policy, num_train_steps=2, iterations_per_loop=2,
                            save_checkpoints_steps=2, mixed_precision=policy,
                            model_hparam_overrides=ONE_LAYER)
    trainer = trainer_lib.Trainer(config)
    compute = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}[policy]
    assert trainer.model.discriminator.compute_dtype == compute
    assert all(v.dtype == "float32" for v in trainer.model.trainable_variables)
    if policy == "mixed_float16":
        assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    # The train loop records the losses in float32 TensorArrays: a bfloat16/float16 loss would
    # fail the trace, so finishing the loop proves they are float32.
    scalars = trainer.train()
    assert trainer.step == 2
    for key in ("total_loss", "masked_lm_loss", "disc_loss", "grad_norm"):
        assert np.isfinite(scalars[key]), (key, scalars)


def test_jit_compile_trains(data_dir):
    config = fx.tiny_config(data_dir, "jit", num_train_steps=2, iterations_per_loop=2,
                            save_checkpoints_steps=2, jit_compile=True,
                            model_hparam_overrides=ONE_LAYER)
    trainer = trainer_lib.Trainer(config)
    scalars = trainer.train()
    assert trainer.step == 2
    assert all(np.isfinite(scalars[k]) for k in ("total_loss", "masked_lm_loss", "disc_loss"))


# ------------------------------------------------------------------------------------------------
# Model directory helpers
# ------------------------------------------------------------------------------------------------
def test_remove_run_refuses_a_directory_that_is_not_a_run(tmp_path):
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("keep me")
    with pytest.raises(trainer_lib.TrainingError, match="refusing to delete"):
        run_dir.remove_run(str(user_dir))
    assert (user_dir / "notes.txt").read_text() == "keep me"
    (user_dir / "config.json").write_text('{"not": "ours"}')
    with pytest.raises(trainer_lib.TrainingError):
        run_dir.remove_run(str(user_dir))
    assert run_dir.remove_run(str(tmp_path / "absent")) is False


def test_remove_run_deletes_a_run(run_a, tmp_path):
    model_dir = str(tmp_path / "copy")
    shutil.copytree(run_a["config"].model_dir, model_dir)
    assert run_dir.remove_run(model_dir) is True
    assert not os.path.exists(model_dir)
