"""`run_pretraining.py --backend jax|torch` end to end, with TensorFlow unimportable (issue 33).

Every JAX / PyTorch run here is the whole command in a child process where `import tensorflow`
fails. They all start from the same step-0 weights: the TensorFlow trainer's, saved as a
portable checkpoint (Keras initializers draw from each backend's own RNG, so the backends'
fresh weights differ; everything after the start is the backends' own). Checked:

- 30 JAX steps give the TensorFlow trainer's losses (rtol 1e-4), and the same held-out eval;
- PyTorch too;
- SIGTERM (exit 42, "stopped by SIGTERM", a save), then SIGKILL mid-run, then the same command:
  the final weights and losses of the uninterrupted run, bit for bit;
- 5 steps per compiled call (steps_per_execution): a SIGTERM stops at a call's end, and the
  rerun ends on the weights of one step per call, bit for bit;
- 2 JAX CPU devices (`keras.distribution.DataParallel`) give the 1-device run's losses;
- unsupported combinations are one-line errors naming the flag.
"""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from electra_tf.training import npz_checkpoint
from electra_tf.training.tf import trainer as trainer_lib
from tests import backends
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("float32_policy")]

STEPS = 30
HPARAMS = fx.tiny_hparams(num_train_steps=STEPS, iterations_per_loop=1,
                          save_checkpoints_steps=10, do_eval=True, num_eval_steps=2)
LOSSES = ("total_loss", "masked_lm_loss", "disc_loss")
EVAL_KEYS = ("loss", "masked_lm_loss", "disc_loss", "disc_accuracy", "masked_lm_accuracy")
TIMEOUT = 600


def _model_dir(data_dir, name):
    return os.path.join(data_dir, "models", name)


@pytest.fixture(scope="module")
def reference(data_dir):
    """The TensorFlow trainer's run, and its step-0 weights as a portable checkpoint."""
    backends.require("jax")
    config = fx.tiny_config(data_dir, "tf", **HPARAMS)
    start = os.path.join(data_dir, "start")
    with trainer_lib.Trainer(config) as trainer:
        npz_checkpoint.save(start, 0, trainer.model, trainer.optimizer, None, None)
        trainer.train()
        eval_results = trainer.evaluate()
        fingerprint = trainer.weights_fingerprint()
    scalars = fx.read_scalars(config.model_dir, LOSSES)
    return {"start": os.path.join(start, "ckpt-0.npz"), "scalars": scalars,
            "eval": eval_results, "fingerprint": fingerprint}


def _command(data_dir, name, backend="jax", hparams=None):
    return backends.blocked_tool_command(
        "run_pretraining.py", "--data-dir", data_dir, "--model-name", name,
        "--hparams", json.dumps(hparams or HPARAMS), "--backend", backend)


def _seed(data_dir, name, reference):
    model_dir = _model_dir(data_dir, name)
    os.makedirs(model_dir, exist_ok=True)
    shutil.copy(reference["start"], os.path.join(model_dir, "ckpt-0.npz"))


def _run(data_dir, name, reference, backend="jax", seed=True, **env):
    if seed:
        _seed(data_dir, name, reference)
    proc = subprocess.run(_command(data_dir, name, backend), env=fx.subprocess_env(**env),
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=fx.REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def _eval_results(model_dir):
    with open(os.path.join(model_dir, "eval_results.txt")) as f:
        return {k.strip(): float(v) for k, v in (line.split("=") for line in f)}


def _assert_losses_equal(model_dir, reference, rtol=1e-4):
    got = fx.read_scalars(model_dir, LOSSES)
    for tag in LOSSES:
        want = reference["scalars"][tag]
        assert sorted(got[tag]) == sorted(want) == list(range(1, STEPS + 1)), tag
        np.testing.assert_allclose([got[tag][s] for s in sorted(want)],
                                   [want[s] for s in sorted(want)], rtol=rtol, err_msg=tag)


@pytest.fixture(scope="module")
def jax_run(data_dir, reference):
    log = _run(data_dir, "jax", reference)
    return {"log": log, "fingerprint": fx.final_fingerprint(log)}


def test_jax_trains_as_the_tensorflow_trainer(data_dir, reference, jax_run):
    assert "backend jax" in jax_run["log"]
    _assert_losses_equal(_model_dir(data_dir, "jax"), reference)
    results = _eval_results(_model_dir(data_dir, "jax"))
    assert results["global_step"] == STEPS
    for key in EVAL_KEYS:
        assert results[key] == pytest.approx(reference["eval"][key], rel=1e-4), key
    # Checkpoints every 10 steps; the run directory holds what the TensorFlow one does.
    names = set(os.listdir(_model_dir(data_dir, "jax")))
    assert {"ckpt-0.npz", "ckpt-10.npz", "ckpt-20.npz", "ckpt-30.npz", "config.json",
            "vocab.txt", "eval_results.txt", "eval"} <= names
    with open(os.path.join(_model_dir(data_dir, "jax"), "config.json")) as f:
        assert json.load(f)["backend"] == "jax"


def test_torch_trains_as_the_tensorflow_trainer(data_dir, reference):
    backends.require("torch")
    _run(data_dir, "torch", reference, backend="torch")
    _assert_losses_equal(_model_dir(data_dir, "torch"), reference)


def test_two_devices_equal_one_with_the_global_batch(data_dir, reference, jax_run):
    log = _run(data_dir, "jax2", reference,
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert "data-parallel over 2 devices" in log
    _assert_losses_equal(_model_dir(data_dir, "jax2"), reference)


def _wait_for(condition, proc, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sigterm_then_sigkill_then_rerun_ends_on_the_uninterrupted_weights(data_dir, reference,
                                                                             jax_run, tmp_path):
    """SIGTERM at step 3: a save, exit 42, "stopped by SIGTERM"; the same command resumes; a
    SIGKILL once it has saved step 20; the same command again ends on the uninterrupted run's
    weights and losses, bit for bit."""
    name = "jax_stopped"
    model_dir = _model_dir(data_dir, name)
    _seed(data_dir, name, reference)
    returncode, log = faults.sigterm_when(_command(data_dir, name), fx.subprocess_env(),
                                          tmp_path / "sigterm.log", r"step 3/30")
    assert returncode == 42, log[-3000:]
    step = int(re.search(r"stopped by SIGTERM at step (\d+) of 30; saved \S+ckpt-\1\.npz", log)
               .group(1))
    assert 3 <= step < 20 and os.path.exists(os.path.join(model_dir, f"ckpt-{step}.npz"))
    proc = subprocess.Popen(_command(data_dir, name), env=fx.subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=fx.REPO_ROOT)
    try:
        ckpt = os.path.join(model_dir, "ckpt-20.npz")
        _wait_for(lambda: os.path.exists(ckpt), proc, "the step-20 checkpoint")
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    log = _run(data_dir, name, reference, seed=False)
    assert re.search(r"restored \S+ckpt-(2\d|30)\.npz", log), log[-3000:]
    assert fx.final_fingerprint(log) == jax_run["fingerprint"]
    _assert_losses_equal(model_dir, reference)


def test_several_steps_per_call_stop_at_a_call_end_and_end_on_the_same_weights(
        data_dir, reference, jax_run, tmp_path):
    """steps_per_execution 5 in loops of 10 (issue 45): a SIGTERM stops at a call's end (a
    multiple of 5), the rerun ends on the weights of the run with one step per call, bit for bit,
    and each loop's mean losses are the means of the TensorFlow trainer's per-step losses."""
    name = "jax_k5"
    hparams = dict(HPARAMS, iterations_per_loop=10, steps_per_execution=5)
    model_dir = _model_dir(data_dir, name)
    _seed(data_dir, name, reference)
    command = _command(data_dir, name, hparams=hparams)
    returncode, log = faults.sigterm_when(command, fx.subprocess_env(), tmp_path / "k5.log",
                                          r"step 10/30")
    assert returncode == 42, log[-3000:]
    assert "5 step(s) per call" in log
    # within a loop, between loops, or (a late signal) in the held-out eval after step 30
    step = int(re.search(r"stopped by SIGTERM (?:during the evaluation )?at step (\d+)", log)
               .group(1))
    assert step % 5 == 0 and 10 <= step <= 30, step
    proc = subprocess.run(command, env=fx.subprocess_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=fx.REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert fx.final_fingerprint(proc.stderr) == jax_run["fingerprint"]
    # the held-out eval runs one batch per call: num_eval_steps (2) batches, not a call's 5
    assert _eval_results(model_dir) == _eval_results(_model_dir(data_dir, "jax"))
    got = fx.read_scalars(model_dir, LOSSES)
    assert {10, 20, 30} <= set(got["total_loss"]) <= {10, 15, 20, 25, 30}
    for tag in LOSSES:
        logged = sorted(got[tag])
        for start, end in zip([0] + logged, logged):  # each loop's steps (start, end]
            want = np.mean([reference["scalars"][tag][s] for s in range(start + 1, end + 1)])
            np.testing.assert_allclose(got[tag][end], want, rtol=1e-4, err_msg=f"{tag} {end}")


@pytest.mark.parametrize("backend, hparams, flag", [
    ("torch", {"strategy": "mirrored"}, "strategy='mirrored' with --backend torch"),
    ("torch", {"strategy": "multi_worker"}, "strategy='multi_worker' with --backend torch"),
    ("jax", {"strategy": "multi_worker"}, "strategy multi_worker with --backend jax: cannot "
                                          "join the other hosts (coordinator_address"),
    ("jax", {"strategy": "tpu"}, "strategy='tpu' with --backend jax, but JAX sees no TPU"),
    ("jax", {"mixed_precision": "mixed_float16"}, "mixed_precision mixed_float16"),
])
def test_unsupported_combinations_are_one_line_errors(data_dir, backend, hparams, flag):
    backends.require(backend)
    proc = subprocess.run(_command(data_dir, f"bad_{backend}", backend,
                                   dict(HPARAMS, **hparams)),
                          env=fx.subprocess_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=fx.REPO_ROOT)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and flag in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_run_resumes_only_on_its_own_backend(data_dir, reference, jax_run):
    config = fx.tiny_config(data_dir, "jax", **HPARAMS)  # the JAX run's directory
    with pytest.raises(Exception, match="--backend jax"):
        trainer_lib.Trainer(config)


def test_the_converters_read_a_jax_run(data_dir, jax_run, tmp_path):
    from electra_tf.convert.__main__ import main as convert
    from electra_tf.training import run_dir

    model_dir = _model_dir(data_dir, "jax")
    loaded = run_dir.load_run(model_dir)
    assert loaded.step == STEPS and loaded.checkpoint.endswith("ckpt-30.npz")
    with np.load(loaded.checkpoint) as archive:
        for i, variable in enumerate(loaded.model.trainable_variables):
            np.testing.assert_array_equal(variable.numpy(), archive[f"model/{i}"])
    for command in ("to-hf", "to-keras-hub", "to-google"):
        out = tmp_path / command
        assert convert(["--quiet", command, "--model-dir", model_dir,
                        "--output-dir", str(out)]) == 0, command
        assert any(out.iterdir()), command


def test_the_tensorflow_tools_evaluate_and_export_a_jax_run(data_dir, jax_run, caplog):
    """On a machine with TensorFlow: `--backend tensorflow` with do_train false reads the JAX
    run's checkpoint, evaluates it as the JAX run did and writes the SavedModels."""
    jax_eval = _eval_results(_model_dir(data_dir, "jax"))
    config = fx.tiny_config(data_dir, "jax", **dict(HPARAMS, do_train=False, do_export=True))
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        results = trainer_lib.run(config)
    assert f"(step {STEPS}), a checkpoint of the jax backend" in caplog.text
    assert results["final"]["global_step"] == STEPS
    for key in EVAL_KEYS:
        assert results["eval"][key] == pytest.approx(jax_eval[key], rel=1e-4), key
    assert os.path.isdir(results["export"]["discriminator"])
    assert results["export"]["discriminator"].endswith(str(STEPS))
