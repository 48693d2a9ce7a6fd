"""JAX runs that used to go wrong silently (issue 47): strategy "tpu" on a machine without a TPU
trained on the CPU; two hosts started with different hparams trained apart, both exiting 0.

Each is refused in one line before anything is written. The JAX side runs in child processes
(this process runs Keras on TensorFlow); the two-host runs are real processes on 127.0.0.1.
"""

import json
import os
import subprocess

import pytest

from tests import backends
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
