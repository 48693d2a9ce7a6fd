"""benchmarks/first_step.py: the time to the first step, eager build against deferred, on CPU
JAX with the --tiny model: both builds reach the same first losses, every phase is timed."""

import json
import os
import subprocess
import sys

import pytest

from tests import backends
from tests import pretraining_fixtures as fx

PHASES = ("import_jax_keras", "import_electra_tf", "model_build", "compile_call", "first_step",
          "second_step", "start_to_first_step")


@pytest.mark.slow  # two JAX children, each builds and compiles a model: ~60 s at load 4
def test_eager_and_deferred_builds_reach_the_same_losses(tmp_path):
    backends.require("jax")
    out = tmp_path / "first_step.json"
    proc = subprocess.run([sys.executable,
                           os.path.join(fx.REPO_ROOT, "benchmarks", "first_step.py"),
                           "--size", "tiny", "--batch", "4", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=fx.subprocess_env(),
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["build"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"eager", "deferred"}
    assert rows["eager"]["losses"] == rows["deferred"]["losses"]  # the same weights
    for row in rows.values():
        assert all(row[k] > 0 for k in PHASES), row
