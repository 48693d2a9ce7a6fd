"""Checkpoints and resume of fine-tuning on JAX and PyTorch (issue 48, item 1).

A run is stopped dead (`os._exit`, as a SIGKILL would) right after trial 2 writes its
checkpoint at step 5, mid-epoch and mid-report; the rerun of the same command keeps trial 1's
results, restores trial 2 and ends on the weights (bit for bit) and metrics of a run that was
never stopped. The stop is a condition (that checkpoint written), not a timer.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from electra_tf.finetuning import portable_runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.model import FinetuningModel
from electra_tf.finetuning.runner import make_optimizer
from tests import backends
from tests import pretraining_fixtures as fx
from tests.finetuning_fixtures import REPO_ROOT, TINY_MODEL, corpus_tasks_dir

STOP_TRIAL, STOP_STEP = 2, 5

# Runs run_finetuning.py without TensorFlow; with STOP set, the process ends (no cleanup, no
# results written) right after trial STOP_TRIAL's checkpoint at step STOP_STEP is on disk.
_TOOL = """
import os, runpy, sys
for _n in ("tensorflow", "tensorflow_text"):
    sys.modules[_n] = None
stop = os.environ.get("STOP")
if stop:
    from electra_tf.finetuning import portable_runner
    trial, step = map(int, stop.split(":"))
    save = portable_runner._save

    def _save_then_die(model, optimizer, progress, checkpoints):
        save(model, optimizer, progress, checkpoints)
        if checkpoints.state["trial"] == trial and progress.step == step:
            os._exit(3)

    portable_runner._save = _save_then_die
sys.argv = ["run_finetuning.py"] + sys.argv[1:]
runpy.run_path(os.path.join(os.environ["REPO"], "run_finetuning.py"), run_name="__main__")
"""


def _run_tool(backend, out, raw, stop=None, **extra):
    hparams = dict(TINY_MODEL, task_names=["chunk"], random_init=True, raw_data_dir=raw,
                   max_seq_length=32, num_train_epochs=2, train_batch_size=16, num_trials=2,
                   keep_all_models=True, save_checkpoints_steps=STOP_STEP, log_steps=3,
                   iterations_per_loop=3, model_dir=os.path.join(out, "models"),
                   results_json=os.path.join(out, "r.json"),
                   results_txt=os.path.join(out, "r.txt"), **extra)
    # KERAS_BACKEND: the stop hook imports keras before the command would choose it.
    env = fx.subprocess_env(REPO=REPO_ROOT, KERAS_BACKEND=backend,
                            **({"STOP": stop} if stop else {}))
    return subprocess.run(
        [sys.executable, "-c", _TOOL, "--backend", backend, "--data-dir",
         os.path.join(REPO_ROOT, "pretrain_data"), "--hparams", json.dumps(hparams)],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO_ROOT)


def _weights(out, trial):
    path = os.path.join(out, "models", f"chunk_model_{trial}", "weights.npz")
    with np.load(path) as archive:
        return {k: archive[k] for k in archive.files if k != "meta"}


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_a_stopped_run_resumes_to_the_weights_and_metrics_of_an_unstopped_one(tmp_path,
                                                                             backend):
    backends.require(backend)
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["chunk"], num_train=96, num_dev=32)
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    proc = _run_tool(backend, whole, raw)
    assert proc.returncode == 0, proc.stderr[-3000:]

    proc = _run_tool(backend, stopped, raw, stop=f"{STOP_TRIAL}:{STOP_STEP}")
    assert proc.returncode == 3, proc.stderr[-3000:]
    checkpoints = os.path.join(stopped, "models", "chunk_checkpoints_2")
    assert os.listdir(checkpoints) == [f"ckpt-{STOP_STEP}.npz"]
    assert len(json.load(open(os.path.join(stopped, "r.json")))["trials"]) == 1

    proc = _run_tool(backend, stopped, raw)  # the same command again
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = json.load(open(os.path.join(whole, "r.json")))["trials"]
    resumed = json.load(open(os.path.join(stopped, "r.json")))["trials"]
    assert [t["resumed_from"] for t in resumed] == [0, STOP_STEP]
    assert expected[1]["steps"] == 12 > STOP_STEP  # 96 / 16 x 2 epochs: stopped mid-run
    for mine, theirs in zip(resumed, expected):
        assert mine["metrics"] == theirs["metrics"]
        assert mine["final_loss"] == theirs["final_loss"]
    for trial in (1, 2):
        a, b = _weights(stopped, trial), _weights(whole, trial)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert open(os.path.join(stopped, "r.txt")).read() == open(os.path.join(whole, "r.txt")).read()
    for trial in (1, 2):  # a finished trial's checkpoints go once results_json holds it
        assert os.listdir(os.path.join(stopped, "models", f"chunk_checkpoints_{trial}")) == []

    # A finished run is not resumed: its outputs exist.
    proc = _run_tool(backend, stopped, raw)
    assert proc.returncode == 2
    assert "already exists; pass --overwrite" in proc.stderr.strip().splitlines()[-1]


def test_batches_from_a_step_are_those_an_uninterrupted_order_draws_there():
    table = {"task_id": np.arange(10, dtype=np.int32), "x": np.arange(20).reshape(10, 2)}
    whole = portable_runner.shuffled_batches(table, 3, seed=7)
    expected = [next(whole) for _ in range(8)][5:]  # 3 batches an epoch: into epoch 2
    resumed = portable_runner.shuffled_batches(table, 3, seed=7, start=5)
    for batch in expected:
        got = next(resumed)
        for key in table:
            np.testing.assert_array_equal(got[key], batch[key])


def _trial_setup(tmp_path, **hparams):
    config = FinetuningConfig.create("m", str(tmp_path), dict(
        task_names=["chunk"], random_init=True, **hparams))
    model = FinetuningModel({"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "intermediate_size": 32,
                             "max_position_embeddings": 16},
                            [{"name": "chunk", "family": "tagging", "num_labels": 3}])
    optimizer = make_optimizer(model, config, steps=10)
    state = portable_runner.checkpoint_state(json.loads(json.dumps(config.to_dict())), 1, 0, 64)
    return model, optimizer, portable_runner.TrialCheckpoints(str(tmp_path / "ckpt"), 5, state)


def test_a_checkpoint_of_other_hparams_is_refused_in_one_line_naming_the_first(tmp_path):
    model, optimizer, checkpoints = _trial_setup(tmp_path, learning_rate=1e-4)
    progress = portable_runner.Resumed(5, 1.5, 2.0, 1)
    portable_runner._save(model, optimizer, progress, checkpoints)
    assert portable_runner.resume_step(model, optimizer, checkpoints) == progress

    model, optimizer, other = _trial_setup(tmp_path, learning_rate=3e-4, log_steps=7)
    with pytest.raises(ValueError) as error:
        portable_runner.resume_step(model, optimizer, other)
    path = os.path.join(checkpoints.directory, "ckpt-5.npz")
    assert str(error.value) == (
        f"{path} was written with learning_rate=0.0001, this run has learning_rate=0.0003: "
        "rerun with the same hparams to resume, or pass --overwrite to start over")
