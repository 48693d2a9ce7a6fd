"""Fine-tuning on JAX keeps its compiled programs in XLA's persistent cache (as pretraining
does): each trial builds a new model and compiles its step and forward anew, so the second
trial of a run (and any later run of the same shapes) loads them from the cache instead. The
tool runs as a user types it (`run_finetuning.py --backend jax`, TensorFlow unimportable,
re-executing itself with its malloc tunables), counting JAX's cache-hit events."""

import json
import os
import subprocess
import sys

from tests import backends
from tests import pretraining_fixtures as fx
from tests.finetuning_fixtures import REPO_ROOT, TINY_MODEL, corpus_tasks_dir

_TOOL = """
import atexit, os, runpy, sys
for _n in ("tensorflow", "tensorflow_text"):
    sys.modules[_n] = None
import jax
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event)
    if event == "/jax/compilation_cache/cache_hits" else None)
atexit.register(lambda: print("cache hits", len(hits), flush=True))
sys.argv = ["run_finetuning.py"] + sys.argv[1:]
runpy.run_path(os.path.join(os.environ["REPO"], "run_finetuning.py"), run_name="__main__")
"""


def test_the_second_trial_loads_the_first_trials_compiled_programs(tmp_path):
    backends.require("jax")
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["chunk"], num_train=32, num_dev=16)
    cache = str(tmp_path / "cache")
    hparams = dict(TINY_MODEL, task_names=["chunk"], random_init=True, raw_data_dir=raw,
                   max_seq_length=32, num_train_epochs=1, train_batch_size=16, num_trials=2,
                   model_dir=str(tmp_path / "models"), results_json=str(tmp_path / "r.json"),
                   results_txt=str(tmp_path / "r.txt"))
    # The session's own cache (conftest) unset: the runner chooses, here the directory named.
    env = fx.subprocess_env(REPO=REPO_ROOT, JAX_COMPILATION_CACHE_DIR="",
                            ELECTRA_TF_JAX_COMPILATION_CACHE=cache)
    proc = subprocess.run(
        [sys.executable, "-c", _TOOL, "--backend", "jax", "--data-dir",
         os.path.join(REPO_ROOT, "pretrain_data"), "--hparams", json.dumps(hparams)],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"compiled programs cached in {cache}" in proc.stderr
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*"))
    hits = int(proc.stdout.split("cache hits ")[-1].split()[0])
    # Trial 2's training step and its evaluation forward, at least.
    assert hits >= 2, proc.stdout
    assert len(json.load(open(tmp_path / "r.json"))["trials"]) == 2
