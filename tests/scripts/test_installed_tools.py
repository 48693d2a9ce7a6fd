"""The package as a user installs it: build the wheel, install it into a fresh virtualenv outside
the checkout, and run the installed console scripts through fetch -> build -> a few pretraining
steps -> export -> fine-tuning -> Hugging Face conversion, from a directory where the checkout is not
importable.

Offline and quick: the wheel is built without build isolation and installed with `--no-index`;
the new virtualenv sees this environment's already-installed packages through a `.pth` file
(so pip checks the wheel's dependency ranges against the tested pins, and nothing is
downloaded); the fetch runs `--offline` from a download cache prepared from the real one
(ELECTRA_TF_CACHE), so it needs no registry. Skipped when that cache lacks the required
artifacts (fetch the default data once first).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from electra_tf.sources import downloads, source_list
from tests import pretraining_fixtures as fx

STEP_TIMEOUT = 600
TOOLS = ("electra-fetch", "electra-build-dataset", "electra-pretrain", "electra-finetune",
         "electra-convert")
# Start-up and per-function lines TensorFlow prints unless told otherwise (issue 18).
NOISE = ("oneDNN", "cuda", "absl::InitializeLog", "Sharding callback", "contains input name",
         "parallel_iterations")


def _run(command, cwd, env, timeout=STEP_TIMEOUT):
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _prepared_cache(tmp_path):
    """A download cache holding (links to) the real cache's verified artifacts."""
    spec = source_list.load_sources()
    real = os.path.join(downloads.default_cache_dir(), "downloads")
    needed = {spec["vocab"]["artifact"]} | {s["artifact"] for s in spec["sources"]
                                            if s.get("required", True)}
    files = [spec["artifacts"][key]["filename"] for key in needed]
    if not all(os.path.isfile(os.path.join(real, name)) for name in files):
        pytest.skip(f"the download cache {real} lacks the default data's artifacts: run "
                    "`python pretrain_data/fetch.py` once")
    cache = tmp_path / "cache"
    (cache / "downloads").mkdir(parents=True)
    for name in os.listdir(real):
        if not name.startswith("."):
            os.symlink(os.path.join(real, name), cache / "downloads" / name)
    return str(cache)


def _build_wheel(tmp_path):
    from importlib import metadata

    version = metadata.version("setuptools")
    if int(version.split(".")[0]) < 77:
        pytest.skip(f"setuptools {version} cannot build the wheel offline (pyproject's SPDX "
                    "license needs 77+): pip install -r requirements-test.txt")
    source = tmp_path / "src"  # a copy: building in place would leave build/ in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(fx.REPO_ROOT, name), source / name)
    shutil.copytree(os.path.join(fx.REPO_ROOT, "electra_tf"), source / "electra_tf",
                    ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", str(dist), str(source)], str(tmp_path), os.environ.copy())
    wheels = list(dist.glob("electra_tf-*.whl"))
    assert len(wheels) == 1
    return str(wheels[0])


def _make_venv(tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], str(tmp_path),
         os.environ.copy())
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # This environment's packages (TensorFlow, pip, ...), after the venv's own: a path line in a
    # .pth file does not run that directory's .pth files, so a development (editable) install
    # of electra-tf there stays invisible.
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    with open(os.path.join(site, "_test_reuse_packages.pth"), "w") as f:
        f.write("\n".join(paths) + "\n")
    return venv


@pytest.mark.slow
def test_installed_tools_fetch_build_pretrain_export_convert(tmp_path):
    cache = _prepared_cache(tmp_path)
    wheel = _build_wheel(tmp_path)
    venv = _make_venv(tmp_path)
    bin_dir = venv / "bin"
    work = tmp_path / "work"  # outside the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")}
    env.update(ELECTRA_TF_CACHE=cache, HF_HUB_OFFLINE="1", PATH=f"{bin_dir}{os.pathsep}"
               + env.get("PATH", ""))
    env.pop("TF_CONFIG", None)
    python = str(bin_dir / "python")
    _run([python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "-q", wheel],
         str(work), env)
    where = _run([python, "-c", "import electra_tf, sys; print(electra_tf.__file__)"],
                 str(work), env).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout
    for tool in TOOLS:
        assert _run([str(bin_dir / tool), "--help"], str(work), env).stdout.startswith(
            f"usage: {tool}")

    # fetch: the packaged sources.json, the cache only.
    fetched = _run([str(bin_dir / "electra-fetch"), "--offline"], str(work), env)
    assert "progress: 3/5 steps" in fetched.stderr and "ETA" in fetched.stderr
    assert os.path.isfile(work / "pretrain_data" / "vocab.txt")
    assert len(os.listdir(work / "pretrain_data" / "corpus")) >= 5

    built = _run([str(bin_dir / "electra-build-dataset"), "--max-seq-length", "64"], str(work), env)
    assert "done:" in built.stderr
    manifest = json.load(open(work / "pretrain_data" / "pretrain_tfrecords" / "manifest.json"))
    assert manifest["splits"]["train"]["examples"] > 1000

    hparams = {"max_seq_length": 64, "train_batch_size": 8, "num_train_steps": 3,
               "iterations_per_loop": 3, "save_checkpoints_steps": 3, "embedding_size": 32,
               "model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 1},
               "do_export": True}
    trained = _run([str(bin_dir / "electra-pretrain"), "--model-name", "tiny", "--hparams",
                    json.dumps(hparams)], str(work), env)
    log = trained.stderr
    assert "step 3/3" in log and "ETA" in log, log[-3000:]
    noise = [line for line in log.splitlines() if any(n in line for n in NOISE)]
    assert noise == [], noise  # quiet by default
    export = work / "pretrain_data" / "models" / "tiny" / "export" / "discriminator" / "3"
    assert (export / "saved_model.pb").is_file()

    # fine-tune the run on a task built from the fetched text (the installed corpus_tasks).
    _run([python, "-m", "electra_tf.commands.build_corpus_tasks", "--output-dir",
          str(work / "pretrain_data" / "finetuning_data"), "--corpus-dir",
          str(work / "pretrain_data" / "corpus"), "--tasks", "source", "--num-train", "64",
          "--num-dev", "32"], str(work), env)
    tuned = _run([str(bin_dir / "electra-finetune"), "--model-name", "tiny", "--hparams",
                  json.dumps({"task_names": ["source"], "max_seq_length": 64,
                              "train_batch_size": 16, "num_train_epochs": 1, "log_steps": 2})],
                 str(work), env)
    assert re.search(r"step (\d+)/\1 loss \S+ .*records/s, ETA", tuned.stderr), tuned.stderr[-3000:]
    noise = [line for line in tuned.stderr.splitlines() if any(n in line for n in NOISE)]
    assert noise == [], noise  # quiet by default, also while exporting the fine-tuned model
    assert "corrupted" not in tuned.stderr, tuned.stderr[-3000:]  # a relative DATA_DIR
    assert "results: " in tuned.stdout and "model (trial 1): " in tuned.stdout, tuned.stdout
    assert (work / "pretrain_data" / "models" / "tiny" / "results" /
            "source_results.json").is_file()

    converted = _run([str(bin_dir / "electra-convert"), "to-hf", "--model-dir",
                      str(work / "pretrain_data" / "models" / "tiny"), "--output-dir", "hf"],
                     str(work), env)
    assert not converted.stdout.strip() or "error" not in converted.stdout
    assert {"tokenizer.json", "README.md", "model.safetensors"} <= set(os.listdir(work / "hf"))

    # The export loads with TensorFlow alone in the installed environment, and fine-tunes.
    load = ("import tensorflow as tf, tensorflow_text  # serve_text's ops\n"
            f"m = tf.saved_model.load({str(export)!r})\n"
            "x = {k: tf.ones([1, 5], tf.int32) for k in ('input_ids', 'input_mask', 'segment_ids')}\n"
            "print(m(x)['replaced_probs'].shape, len(m.trainable_variables))\n")
    out = _run([python, "-c", load], str(work), env).stdout
    assert out.startswith("(1, 5)")
