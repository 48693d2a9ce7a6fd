"""Preemption: SIGTERM stops a run at the next step boundary, saves, exits 42, and the same
command resumes exactly; under MultiWorkerMirroredStrategy a SIGTERM to one worker stops both at
the same step.

In process: a stop requested while a long compiled loop runs stops it mid-loop (the loop reads
the request before every step). In subprocesses: a real SIGTERM, like the SIGKILL test.
"""

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from electra_tf import cli
from electra_tf.errors import Preempted
from electra_tf.training import checkpoint_files
from electra_tf.training.tf import trainer as trainer_lib
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx

pytestmark = pytest.mark.usefixtures("float32_policy")

RUN_TIMEOUT = 600  # a ceiling, reached only when a run hangs (CI machines are loaded)
LOSS_TAGS = ("total_loss", "masked_lm_loss", "disc_loss", "learning_rate")
STOPPED = re.compile(r"stopped by SIGTERM at step (\d+) of (\d+); saved (\S+)\.")


def test_stop_request_stops_a_compiled_loop_at_the_next_step(data_dir):
    long_chunk = 2000
    config = fx.tiny_config(data_dir, "stop_in_loop", num_train_steps=long_chunk + 2,
                            iterations_per_loop=long_chunk, save_checkpoints_steps=long_chunk + 2)
    trainer = trainer_lib.Trainer(config)
    trainer.train(stop_at_step=2)  # traces the loop

    def request_once_running():
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline and int(trainer.optimizer.iterations.numpy()) <= 3:
            time.sleep(0.005)
        trainer.stop.request()

    thread = threading.Thread(target=request_once_running)
    thread.start()
    with pytest.raises(Preempted, match=STOPPED.pattern) as raised:
        trainer.train()
    thread.join()
    step = int(STOPPED.search(str(raised.value)).group(1))
    assert 3 < step < long_chunk + 2  # inside the 2000-step compiled loop, not at its end
    assert trainer.step == step
    assert checkpoint_files.checkpoint_number(trainer.checkpointer.latest) == step
    # A stop requested before the loop starts: no step is run, the step is saved.
    with pytest.raises(Preempted):
        trainer.train()
    assert trainer.step == step


def _hparams(**extra):
    return fx.tiny_hparams(num_train_steps=48, iterations_per_loop=4, save_checkpoints_steps=1000,
                           **extra)


@pytest.mark.slow
def test_sigterm_saves_exits_42_and_the_same_command_resumes_exactly(data_dir, tmp_path):
    env = fx.subprocess_env()
    reference = subprocess.Popen(fx.run_pretraining_command(data_dir, "ref", _hparams()), env=env,
                                 cwd=fx.REPO_ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    command = fx.run_pretraining_command(data_dir, "term", _hparams())
    log_path = tmp_path / "term.log"
    try:
        returncode, first = faults.sigterm_when(command, env, log_path, r"step 8/48")
        assert returncode == cli.EXIT_PREEMPTED == 42, first[-3000:]
        assert "Traceback" not in first
        step = int(STOPPED.search(first).group(1))
        assert 8 <= step < 48
        model_dir = os.path.join(data_dir, "models", "term")
        assert fx.latest_step(model_dir) == step  # saved at the stop, not at a periodic save
        resumed = subprocess.run(command, env=env, cwd=fx.REPO_ROOT, capture_output=True,
                                 text=True, timeout=RUN_TIMEOUT)
        ref_err = reference.communicate(timeout=RUN_TIMEOUT)[1]
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(rf"training from step {step} to 48", resumed.stderr), resumed.stderr[-3000:]
    assert "holds no data position" not in resumed.stderr
    assert fx.final_fingerprint(resumed.stderr) == fx.final_fingerprint(ref_err)
    # Bit-identical weights, optimizer slots and RNG states at the end (the line above); the
    # per-loop summaries of the chunks both runs ran whole are equal too (the stopped run's
    # summaries then follow its own chunk boundaries: step, step + 4, ...).
    ref_scalars = fx.read_scalars(os.path.join(data_dir, "models", "ref"), LOSS_TAGS)
    got_scalars = fx.read_scalars(model_dir, LOSS_TAGS)
    for tag in LOSS_TAGS:
        whole = [s for s in sorted(ref_scalars[tag]) if s < step]
        assert whole and all(s in got_scalars[tag] for s in whole), tag
        np.testing.assert_allclose([got_scalars[tag][s] for s in whole],
                                   [ref_scalars[tag][s] for s in whole], rtol=1e-6, atol=0)
        assert step in got_scalars[tag] and 48 in got_scalars[tag], tag


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_both_at_the_same_step_and_both_resume(data_dir, tmp_path):
    hparams = _hparams(strategy="multi_worker")
    paths = [tmp_path / f"worker{i}.log" for i in range(2)]
    outputs = [open(path, "w") for path in paths]
    procs = fx.start_workers(data_dir, "mw_term", hparams, outputs=outputs)
    try:
        # Both workers past set-up: each logs this line inside the SIGTERM handler's scope.
        for path, proc in zip(paths, procs):
            assert faults.wait_for_log(path, r"training from step 0 to 48", proc), path.read_text()[-3000:]
        procs[1].send_signal(signal.SIGTERM)  # the non-chief only
        for p in procs:
            p.wait(timeout=RUN_TIMEOUT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for output in outputs:
            output.close()
    logs = [path.read_text() for path in paths]
    for index, p in enumerate(procs):
        assert p.returncode == cli.EXIT_PREEMPTED, f"worker {index}:\n{logs[index][-3000:]}"
    steps = [int(STOPPED.search(log).group(1)) for log in logs]
    assert steps[0] == steps[1] < 48, steps
    model_dir = os.path.join(data_dir, "models", "mw_term")
    assert fx.latest_step(model_dir) == steps[0]

    procs, logs = fx.run_workers_to_end(data_dir, "mw_term", hparams, RUN_TIMEOUT)
    fingerprints = []
    for index, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {index} failed on restart:\n{log[-3000:]}"
        assert re.search(rf"restored \S+ckpt-{steps[0]} \(step {steps[0]}\)", log), log[-3000:]
        fingerprints.append(fx.final_fingerprint(log))
    assert fingerprints[0] == fingerprints[1] and fingerprints[0][0] == 48


# ------------------------------------------------------------------------------------------------
# SIGTERM outside training: the evaluation and the export stop cleanly too (issue 31)
# ------------------------------------------------------------------------------------------------
def _trained_run(data_dir, name, **extra):
    """Trains a tiny run of 2 steps in this process; returns (hparams, model_dir)."""
    hparams = fx.tiny_hparams(num_train_steps=2, iterations_per_loop=2, save_checkpoints_steps=2,
                              **extra)
    trainer_lib.run(trainer_lib.PretrainingConfig.create(name, data_dir,
                                                         json.loads(json.dumps(hparams))))
    return hparams, os.path.join(data_dir, "models", name)


def _checkpoint_digests(model_dir):
    return {n: hashlib.sha256(open(os.path.join(model_dir, n), "rb").read()).hexdigest()
            for n in os.listdir(model_dir) if n.startswith("ckpt-") or n == "checkpoint"}


def _stop_line(log):
    lines = [line for line in log.splitlines() if line.startswith("run_pretraining.py: ")
             and "stopped by SIGTERM" in line]
    assert len(lines) == 1 and "Traceback" not in log, log[-3000:]
    return lines[0]


@pytest.mark.slow  # a training, an eval-only run stopped by SIGTERM, its rerun
def test_sigterm_during_an_eval_only_run_exits_42_and_writes_nothing(data_dir, tmp_path):
    hparams, model_dir = _trained_run(data_dir, "term_eval")
    before = _checkpoint_digests(model_dir)
    # An evaluation far longer than the test: only the SIGTERM ends it.
    command = fx.run_pretraining_command(data_dir, "term_eval", dict(
        hparams, do_train=False, do_eval=True, num_eval_steps=10_000_000))
    returncode, log = faults.sigterm_when(command, fx.subprocess_env(), tmp_path / "eval.log",
                                    r"restored \S+ckpt-2 \(step 2\)")
    assert returncode == cli.EXIT_PREEMPTED, log[-3000:]
    line = _stop_line(log)
    assert "stopped by SIGTERM during the evaluation at step 2; nothing is lost" in line, line
    assert "no eval results were written" in line, line
    assert not os.path.exists(os.path.join(model_dir, "eval_results.txt"))
    assert _checkpoint_digests(model_dir) == before
    rerun = subprocess.run(fx.run_pretraining_command(data_dir, "term_eval", dict(
        hparams, do_train=False, do_eval=True)), env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
        capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert os.path.exists(os.path.join(model_dir, "eval_results.txt"))


@pytest.mark.slow  # a training, export runs stopped by SIGTERM (retried if the export wins)
def test_sigterm_while_the_export_is_staged_exits_42_and_removes_the_staging(data_dir,
                                                                            tmp_path):
    from tests.training.test_reliability_leftovers import _export_staging, _kill_when

    # A large (unused) vocab makes the SavedModel's variables ~60 MB: a wide staging window.
    hparams, model_dir = _trained_run(data_dir, "term_export", vocab_size=60000,
                                      embedding_size=128)
    before = _checkpoint_digests(model_dir)
    command = fx.run_pretraining_command(data_dir, "term_export", dict(
        hparams, do_train=False, do_eval=False, do_export=True))
    for attempt in range(4):  # the export may end between two looks on a loaded machine
        log_path = tmp_path / f"export-{attempt}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                                    stdout=subprocess.DEVNULL, stderr=log, text=True)
            seen = _kill_when(proc, model_dir, _export_staging, "export staging directory",
                              signal.SIGTERM)
        if seen and proc.returncode == cli.EXIT_PREEMPTED:
            break
        assert proc.returncode in (0, cli.EXIT_PREEMPTED), log_path.read_text()[-3000:]
    else:
        pytest.fail("no SIGTERM of 4 landed while the export was staged")
    line = _stop_line(log_path.read_text())
    assert "stopped by SIGTERM during the export at step 2; nothing is lost" in line, line
    assert _export_staging(model_dir) == []  # removed at once, not left for the next start
    assert _checkpoint_digests(model_dir) == before
    rerun = subprocess.run(command, env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                           capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert os.path.isfile(os.path.join(model_dir, "export", "discriminator", "2",
                                       "saved_model.pb"))
