"""benchmarks/gpu_finetune.sh (issue 48's GPU trial): its refusals, and (slow) its --dry-run on
CPU JAX with TensorFlow unimportable, as on the GPU machine."""

import json
import os
import subprocess
import tarfile

import pytest

from tests import backends
from tests import pretraining_fixtures as fx
from tests.finetuning_fixtures import corpus_tasks_dir

SCRIPT = os.path.join(fx.REPO_ROOT, "benchmarks", "gpu_finetune.sh")


def _run(*args, **env):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=900,
                          env=fx.subprocess_env(**env))


def test_an_unknown_argument_prints_the_usage():
    proc = _run("--bogus")
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "--prepare DATA_DIR" in proc.stderr


def test_prepare_names_the_missing_task_directory(tmp_path):
    proc = _run("--prepare", str(tmp_path))
    assert proc.returncode == 2
    assert f"no {tmp_path}/finetuning_data/bbc_news" in proc.stderr
    assert "fetch_labelled" in proc.stderr


@pytest.mark.slow  # one CPU JAX fine-tuning run of the tiny encoder (~30 s)
def test_dry_run_fine_tunes_on_jax_without_tensorflow_and_returns_one_tar(tmp_path):
    backends.require("jax")
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["source"], num_train=64, num_dev=32)
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nfor _n in %r:\n    sys.modules[_n] = None\n" % (backends.BLOCKED,))
    out = tmp_path / "out"
    proc = _run("--dry-run", raw, "source", OUT=str(out), PYTHONPATH=str(blocker))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "gpu_finetune.tar.gz") as tar:
        names = set(tar.getnames())
        summary = tar.extractfile("gpu_finetune/summary.txt").read().decode()
        results = json.load(tar.extractfile("gpu_finetune/results.json"))
        log = tar.extractfile("gpu_finetune/finetune.log").read().decode()
    assert {"gpu_finetune/info.txt", "gpu_finetune/finetune.log"} <= names
    assert summary.startswith("exit 0; command wall ")
    assert "trial 1 (seed 0): 4 steps in " in summary  # ceil(64 / 16) x 1 epoch
    assert "no target verdict" in summary  # the tiny encoder on CPU says nothing of the GPU
    assert results["backend"] == "jax" and len(results["trials"]) == 1
    assert "oneDNN custom operations" not in log  # TensorFlow's start-up line: it never loaded
