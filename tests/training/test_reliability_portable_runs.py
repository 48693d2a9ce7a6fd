"""JAX runs that used to go wrong silently or noisily (issue 47): strategy "tpu" on a machine
without a TPU trained on the CPU; two hosts started with different hparams trained apart, both
exiting 0; a host killed mid-run left the other aborting ~78 s later with 110 lines.

The first two are refused in one line before anything is written; the lost host is named in one
line at once. The JAX side runs in child processes
(this process runs Keras on TensorFlow); the two-host runs are real processes on 127.0.0.1.
"""

import os
import subprocess
import time

import pytest

from tests import backends
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx


def test_strategy_tpu_on_jax_without_a_tpu_is_refused(data_dir):
    backends.require("jax")
    out = backends.run_on_backend("jax", f"""
        from electra_tf.errors import TrainingError
        from electra_tf.training.portable import support as portable_support
        from tests import pretraining_fixtures as fx

        config = fx.tiny_config({data_dir!r}, "tpu", backend="jax", strategy="tpu")
        try:
            portable_support.check_supported(config)
            out["error"] = ""
        except TrainingError as e:
            out["error"] = str(e)
        """)
    error = str(out["error"])
    assert error.startswith("strategy='tpu' with --backend jax, but JAX sees no TPU here "
                            "(its devices: cpu)"), error
    assert "strategy auto" in error and "\n" not in error


@pytest.mark.slow  # two JAX processes joining on 127.0.0.1: ~35 s
def test_hosts_started_with_different_hparams_refuse_in_one_line(data_dir, tmp_path):
    """Host 1's learning_rate differs: both hosts stop at the start, naming the hparam and both
    values (they used to train apart, both exiting 0 with different weights); nothing written."""
    backends.require("jax")
    from tests.training import test_portable_multihost as multihost

    port = fx.free_ports(1)[0]
    procs, paths = [], []
    for index, hparams in enumerate((multihost.HPARAMS,  # the default learning_rate, 5e-4
                                     dict(multihost.HPARAMS, learning_rate=1e-3))):
        paths.append(str(tmp_path / f"host-{index}.log"))
        with open(paths[-1], "w") as log:
            procs.append(subprocess.Popen(multihost._command(data_dir, "apart", hparams),
                                          env=multihost._host_env(port, index),
                                          cwd=fx.REPO_ROOT, stdout=subprocess.DEVNULL,
                                          stderr=log))
    for code, log in multihost._wait_all(procs, paths):
        error = faults.one_error_line(code, log)
        assert ("the hosts were started with different hparams: learning_rate is 0.0005 on "
                "host 0, 0.001 on host 1: start every host with the same command") in error, error
    assert not os.path.exists(os.path.join(data_dir, "models", "apart"))


@pytest.mark.parametrize("error", [
    RuntimeError("INTERNAL: Error dispatching computation: Gloo all-reduce failed: [external/gloo/"
                 "gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:48265: Connection reset "
                 "by peer"),  # JaxRuntimeError, a RuntimeError, from a step
    ValueError("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] "
               "Read error [127.0.0.1]:1750: Connection reset by peer"),  # process_allgather
])
def test_a_collective_failing_on_a_lost_peer_is_one_line(data_dir, monkeypatch, error):
    import jax

    from electra_tf.training.portable import hosts

    monkeypatch.setattr(hosts, "_lost", False)
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    config = fx.tiny_config(data_dir, "lost", backend="jax", strategy="multi_worker")
    with pytest.raises(hosts.HostLost) as raised:
        with hosts.stop_if_lost(config):
            raise error
    assert str(raised.value).startswith("host 1 of 2 was lost (a collective with it failed: ")
    assert hosts.lost()
    monkeypatch.setattr(hosts, "_lost", False)
    with pytest.raises(ValueError, match="shapes"):  # anything else keeps its type
        with hosts.stop_if_lost(config):
            raise ValueError("shapes (2,) and (3,) differ")
    assert not hosts.lost()


@pytest.mark.slow  # two JAX processes on 127.0.0.1, one killed: ~1-5 min (compiling)
def test_a_host_killed_mid_run_stops_the_other_in_one_line_at_once(data_dir, tmp_path):
    """SIGKILL of host 1 once training runs: host 0's next collective fails (gloo: connection
    reset), and it exits 2 with one line naming host 1 and the remedy within seconds (was exit
    134 ~78 s later: a Gloo traceback, then JAX's shutdown barrier waiting out the heartbeat
    timeout and a C++ stack dump)."""
    backends.require("jax")
    from tests.training import test_portable_multihost as multihost

    hparams = dict(multihost.HPARAMS, num_train_steps=100_000)  # still training at the kill
    procs, paths = multihost._start_hosts([data_dir, data_dir], "lost", str(tmp_path), hparams)
    try:
        assert faults.wait_for_log(paths[0], r"saved checkpoint \S+ckpt-4\.npz", procs[0]), \
            open(paths[0]).read()[-3000:]
        procs[1].kill()
        procs[1].wait()
        killed = time.monotonic()
        procs[0].wait(timeout=faults.RUN_TIMEOUT)
        waited = time.monotonic() - killed
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = open(paths[0]).read()
    error = faults.one_error_line(procs[0].returncode, log)
    assert error.startswith("run_pretraining.py: error: host 1 of 2 was lost (a collective with "
                            "it failed: "), error
    assert error.endswith("host 0 stops too; rerun every host (the run resumes from its last "
                          "checkpoint)"), error
    assert "Check failure" not in log and "Terminating process" not in log, log[-3000:]
    assert waited < 60, waited  # not the coordination service's 100 s heartbeat timeout
