"""Fault injection under MultiWorkerMirroredStrategy: two workers on 127.0.0.1, SIGKILL one
mid-run. The survivor must fail fast (not hang in a collective); restarting both resumes from the
last checkpoint to num_train_steps with bit-identical weights on both workers (the `final:` line
of each worker's log carries a sha256 of its variables)."""

import os
import re
import signal
import subprocess
import time

import pytest

from tests import pretraining_fixtures as fx

STEPS = 40
RUN_TIMEOUT = 240
# The survivor must exit within this long after its peer died (TF's coordination service
# heartbeat notices a dead task in ~10 s; a hang would run into RUN_TIMEOUT instead).
FAIL_FAST_SECONDS = 90


@pytest.mark.slow
def test_killing_one_worker_fails_the_other_fast_and_both_resume(data_dir):
    hparams = fx.tiny_hparams(num_train_steps=STEPS, iterations_per_loop=1, save_checkpoints_steps=2,
                              strategy="multi_worker")
    model_dir = os.path.join(data_dir, "models", "mw_kill")
    procs = fx.start_workers(data_dir, "mw_kill", hparams)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            step = fx.latest_step(model_dir)
            if step is not None and step >= 4:
                break
            time.sleep(0.05)
        assert all(p.poll() is None for p in procs), "a worker ended before the kill"
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        try:
            log0 = procs[0].communicate(timeout=FAIL_FAST_SECONDS)[0]
        except subprocess.TimeoutExpired:
            pytest.fail(f"the surviving worker still runs {FAIL_FAST_SECONDS} s after its peer died")
        survivor_seconds = time.monotonic() - killed_at
        procs[1].communicate(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode != 0, log0[-3000:]
    assert procs[1].returncode == -signal.SIGKILL
    print(f"survivor exited {survivor_seconds:.1f} s after the kill (code {procs[0].returncode})")
    step_at_kill = fx.latest_step(model_dir)
    assert step_at_kill is not None and step_at_kill < STEPS

    procs = fx.start_workers(data_dir, "mw_kill", hparams)
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=RUN_TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    fingerprints = []
    for index, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {index} failed on restart:\n{log[-3000:]}"
        assert re.search(rf"restored \S+ckpt-{step_at_kill} \(step {step_at_kill}\)", log), log[-3000:]
        step, fingerprint = fx.final_fingerprint(log)
        assert step == STEPS, log[-3000:]
        fingerprints.append(fingerprint)
    assert fingerprints[0] == fingerprints[1]
