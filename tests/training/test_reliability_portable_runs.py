"""JAX runs that used to go wrong silently (issue 47): strategy "tpu" on a machine without a TPU
trained on the CPU; two hosts started with different hparams trained apart, both exiting 0.

Each is refused in one line before anything is written. The JAX side runs in child processes
(this process runs Keras on TensorFlow); the two-host runs are real processes on 127.0.0.1.
"""

import os
import subprocess

import pytest

from tests import backends
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx


def test_strategy_tpu_on_jax_without_a_tpu_is_refused(data_dir):
    backends.require("jax")
    out = backends.run_on_backend("jax", f"""
        from electra_tf.errors import TrainingError
        from electra_tf.training import portable_support
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


@pytest.mark.slow  # two JAX processes joining on 127.0.0.1: ~20-40 s
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
