"""Preemption: SIGTERM stops a run at the next step boundary, saves, exits 42, and the same
command resumes exactly; under MultiWorkerMirroredStrategy a SIGTERM to one worker stops both at
the same step.

In process: a stop requested while a long compiled loop runs stops it mid-loop (the loop reads
the request before every step). In subprocesses: a real SIGTERM, like the SIGKILL test.
"""

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
from electra_tf.training import run_dir
from electra_tf.training import trainer as trainer_lib
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
    assert run_dir.checkpoint_number(trainer.checkpointer.latest) == step
    # A stop requested before the loop starts: no step is run, the step is saved.
    with pytest.raises(Preempted):
        trainer.train()
    assert trainer.step == step


def _wait_for(path, pattern, proc, timeout=RUN_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with open(path, encoding="utf-8", errors="replace") as f:
            if re.search(pattern, f.read()):
                return True
        time.sleep(0.02)
    return False


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
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, env=env, cwd=fx.REPO_ROOT, stdout=subprocess.DEVNULL,
                                    stderr=log, text=True)
            try:
                assert _wait_for(log_path, r"step 8/48", proc), log_path.read_text()[-3000:]
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=RUN_TIMEOUT)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        first = log_path.read_text()
        assert proc.returncode == cli.EXIT_PREEMPTED == 42, first[-3000:]
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
            assert _wait_for(path, r"training from step 0 to 48", proc), path.read_text()[-3000:]
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
