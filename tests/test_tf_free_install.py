"""The TensorFlow-free install (issue 48, item 3): `pip install --no-deps -r requirements-jax.txt`.

Fast checks of the pin files (offline): no TensorFlow in them, the same versions as
requirements*.txt, pyproject's dependencies and jax's accelerator extras covered, and the list
closed under the requirements of every package installed here at its pinned version.

`test_tf_free_end_to_end` (slow; also a step of `.ci/run`) types the documented command into a
fresh virtualenv, which then holds no TensorFlow, and runs the installed tools there on CPU JAX:
`electra-build-dataset --tokenizer tokenizers` -> `electra-pretrain --backend jax` (a tiny model,
8 steps, eval) -> `electra-finetune --backend jax` (a 2-label TSV task written here, from the
pretrained checkpoint). pip reads the package index (its cache makes it quick): where the index
is unreachable the test skips, except in CI (`CI=true`), where it fails.
"""

import importlib.metadata
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.parse
from typing import Dict, List

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import extras

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIN_FILES = ("requirements-jax.txt", "requirements-jax-cuda12.txt", "requirements-jax-tpu.txt")
# The two requirements the pin files leave out by design (requirements-jax.txt's header says why).
UNMET_BY_DESIGN = {("electra-tf", "tensorflow"), ("electra-tf", "tensorflow-text"),
                   ("keras-hub", "tensorflow-text")}
TIMEOUT = 600


def _pins(name: str) -> Dict[str, str]:
    """{canonical package name: version} of a pin file, following its `-r` includes."""
    pins = {}
    with open(os.path.join(REPO_ROOT, name), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-r "):
                pins.update(_pins(line[3:].strip()))
                continue
            requirement = Requirement(line)
            (specifier,) = requirement.specifier  # every line is one `==` pin
            assert specifier.operator == "==", line
            pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


@pytest.mark.parametrize("name", PIN_FILES)
def test_pin_files_hold_no_tensorflow(name):
    pins = _pins(name)
    assert [p for p in pins if p.startswith("tensorflow") or p == "tf-keras"] == []
    assert "tensorboard" in pins  # TensorBoard itself needs no TensorFlow (training/portable/board.py)


@pytest.mark.parametrize("name", ("requirements.txt", "requirements-test.txt"))
def test_pins_agree_with_the_tested_stack(name):
    tested = {}
    with open(os.path.join(REPO_ROOT, name), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                requirement = Requirement(line)
                tested[canonicalize_name(requirement.name)] = str(requirement.specifier)[2:]
    pins = _pins("requirements-jax.txt")
    assert {p: pins[p] for p in tested if p in pins} == {p: tested[p] for p in tested if p in pins}


def test_pins_cover_the_dependencies_but_tensorflow():
    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11+")

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    names = {canonicalize_name(Requirement(d).name) for d in dependencies}
    pins = _pins("requirements-jax.txt")
    assert names - set(pins) == {"tensorflow", "tensorflow-text"}
    assert {"jax", "jaxlib"} <= set(pins)


@pytest.mark.parametrize("name,extra", [("requirements-jax-cuda12.txt", "cuda12"),
                                        ("requirements-jax-tpu.txt", "tpu")])
def test_accelerator_pins_satisfy_jaxs_extra(name, extra):
    """jax's own `[cuda12]` / `[tpu]` requirements (its metadata, at the pinned version) hold."""
    pins = _pins(name)
    jax_metadata = importlib.metadata.metadata("jax")
    if jax_metadata["Version"] != pins["jax"]:
        pytest.skip(f"jax {jax_metadata['Version']} is installed here, the pins say {pins['jax']}")
    required = [Requirement(r) for r in jax_metadata.get_all("Requires-Dist")
                if Requirement(r).marker is not None
                and Requirement(r).marker.evaluate({"extra": extra})
                and not Requirement(r).marker.evaluate({"extra": ""})]
    assert required
    for requirement in required:
        name_ = canonicalize_name(requirement.name)
        assert name_ in pins, f"{name} lacks {requirement}"
        assert requirement.specifier.contains(pins[name_], prereleases=True), (
            f"{name}: {name_}=={pins[name_]} does not satisfy {requirement}")


def test_pins_are_closed_under_their_requirements():
    """Every requirement of a pinned package (as installed here at the pinned version) is pinned;
    pip installs the list with --no-deps, so a missing one would be missing there."""
    pins = _pins("requirements-jax.txt")
    checked = 0
    for name, version in pins.items():
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if distribution.version != version:
            continue  # another version here: the slow test's `pip check` covers it
        checked += 1
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            needed = canonicalize_name(requirement.name)
            if (name, needed) in UNMET_BY_DESIGN:
                continue
            assert needed in pins, f"{name} {version} requires {requirement}: not pinned"
            assert requirement.specifier.contains(pins[needed], prereleases=True), (
                f"{name} {version} requires {requirement}, pinned {needed}=={pins[needed]}")
    assert checked >= len(pins) // 2  # this environment installs most of them at these versions


def _read(name: str) -> str:
    with open(os.path.join(REPO_ROOT, name), encoding="utf-8") as f:
        return f.read()


def test_the_documented_commands_are_the_tested_ones():
    """README gives the command the end-to-end test types (with the CUDA file); CI runs that test
    after the README's own test command, which it keeps verbatim."""
    readme = _read("README.md")
    cuda = " ".join(INSTALL_ARGS).replace("requirements-jax.txt", "requirements-jax-cuda12.txt")
    assert f"pip {cuda}" in readme
    for name in PIN_FILES:
        assert name in readme
    ci = _read(".ci/run").replace("\\\n", " ").splitlines()  # continued lines joined
    (test_command,) = [line for line in readme.splitlines()
                       if line.startswith(".venv/bin/pip install -q -r requirements-test.txt")]
    assert test_command in ci
    (step,) = [line for line in ci if "test_tf_free_end_to_end" in line]
    assert ci.index(step) > ci.index(test_command)
    assert "-m slow" in step and step.endswith(
        "tests/test_tf_free_install.py::test_tf_free_end_to_end")
    assert any(mark.name == "slow" for mark in test_tf_free_end_to_end.pytestmark)


# ---------------------------------------------------------------------------------------------
# The install, end to end.

# What README tells a user to type (after `pip`), from the clone.
INSTALL_ARGS = ("install", "--no-deps", "-r", "requirements-jax.txt", "-e", ".")

def _index_reachable(timeout: float = 5.0) -> bool:
    """Whether pip's package index answers a TCP connection."""
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return os.path.isdir(parsed.path)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _child_env(tmp: str) -> dict:
    """The environment of the venv's commands: nothing of this process' Python leaks in."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "KERAS_BACKEND", "TF_CONFIG")}
    env["HF_HUB_OFFLINE"] = "1"
    env["TMPDIR"] = tmp
    return env


def _run(argv: List[str], cwd: str, env: dict, what: str) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    print(f"{what}: {time.monotonic() - start:.1f} s")
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc


WORDS = ("the cat dog bird sat on a mat ran fast slow red blue green house tree river walked saw "
         "big small sang song under over near far").split()


def _write_corpus(directory: str, rng: random.Random) -> None:
    """60 documents of 8 sentences, one sentence a line, a blank line between documents."""
    os.makedirs(directory)
    lines = []
    for _ in range(60):
        for _ in range(8):
            lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))) + ".")
        lines.append("")
    with open(os.path.join(directory, "a.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _write_task(directory: str, rng: random.Random) -> None:
    """A generic classification task: `text<TAB>label`, the label an animal or a colour word."""
    os.makedirs(directory)
    animals, colours = ["cat", "dog", "bird"], ["red", "blue", "green"]
    filler = [w for w in WORDS if w not in animals + colours]
    for split, n in (("train", 64), ("dev", 32)):
        rows = ["text\tlabel"]
        for i in range(n):
            words = [rng.choice(filler) for _ in range(6)]
            words.insert(rng.randint(0, 6), rng.choice(animals if i % 2 == 0 else colours))
            rows.append(" ".join(words) + "\t" + ("animal" if i % 2 == 0 else "colour"))
        with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")


@pytest.mark.slow
def test_tf_free_end_to_end(tmp_path):
    if not _index_reachable():
        if extras.in_ci():
            pytest.fail("the package index is unreachable: CI needs it to install "
                        "requirements-jax.txt")
        pytest.skip("the package index is unreachable (pip installs requirements-jax.txt from it)")
    tmp = str(tmp_path)
    env = _child_env(tmp)
    venv = os.path.join(tmp, "venv")
    tool = lambda name: os.path.join(venv, "bin", name)  # noqa: E731

    # The documented command, typed as the user types it (from the clone).
    _run([sys.executable, "-m", "venv", venv], tmp, env, "venv")
    _run([tool("pip"), *INSTALL_ARGS, "-q"], REPO_ROOT, env, "install")
    probe = _run([tool("python"), "-c",
                  "import importlib.util as u, json; print(json.dumps([m for m in "
                  "('tensorflow', 'tensorflow_text', 'tf_keras') if u.find_spec(m)]))"],
                 tmp, env, "probe")
    assert json.loads(probe.stdout) == []
    # The list is closed: pip finds nothing missing but the requirements left out by design.
    check = subprocess.run([tool("pip"), "check"], env=env, capture_output=True, text=True,
                           timeout=TIMEOUT)
    unmet = set(re.findall(r"^(\S+) \S+ requires (\S+), which is not installed\.$",
                           check.stdout, re.M))
    assert unmet == UNMET_BY_DESIGN, check.stdout
    assert len(check.stdout.strip().splitlines()) == len(UNMET_BY_DESIGN), check.stdout

    rng = random.Random(0)
    data = os.path.join(tmp, "data")
    _write_corpus(os.path.join(tmp, "corpus"), rng)
    _write_task(os.path.join(tmp, "raw", "topic"), rng)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + sorted(set(WORDS))
    os.makedirs(data)
    with open(os.path.join(data, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")

    # Build: the TensorFlow-free tokenizer, shards written without TensorFlow.
    _run([tool("electra-build-dataset"), "--tokenizer", "tokenizers", "--corpus-dir",
          os.path.join(tmp, "corpus"), "--vocab-file", os.path.join(data, "vocab.txt"),
          "--output-dir", os.path.join(data, "pretrain_tfrecords"), "--max-seq-length", "32",
          "--num-out-files", "2", "--eval-fraction", "0.1"], tmp, env, "build")
    with open(os.path.join(data, "pretrain_tfrecords", "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["tokenizer"]["name"] == "tokenizers"
    splits = manifest["splits"]
    assert splits["train"]["examples"] > 100 and splits["eval"]["examples"] >= 8, splits
    for split in ("train", "eval"):
        for shard in splits[split]["shards"]:
            assert os.path.getsize(os.path.join(data, "pretrain_tfrecords", shard["file"])) == (
                shard["bytes"])

    # Pretrain on JAX: 8 steps (one compiled call of 8), eval.
    hparams = {"vocab_size": len(vocab), "max_seq_length": 32, "train_batch_size": 8,
               "eval_batch_size": 8, "num_train_steps": 8, "num_warmup_steps": 2,
               "iterations_per_loop": 8, "save_checkpoints_steps": 8, "do_eval": True,
               "num_eval_steps": 1, "do_export": False, "embedding_size": 32,
               "mixed_precision": "float32",
               "model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2,
                                          "num_attention_heads": 2, "intermediate_size": 128}}
    pretrain = _run([tool("electra-pretrain"), "--backend", "jax", "--data-dir", data,
                     "--model-name", "tiny", "--hparams", json.dumps(hparams)],
                    tmp, env, "pretrain")
    (results_line,) = [line for line in pretrain.stderr.splitlines() + pretrain.stdout.splitlines()
                       if " results: {" in line or line.startswith("results: {")]
    results = json.loads(results_line.split("results: ", 1)[1])
    assert results["final"]["global_step"] == 8
    model_dir = os.path.join(data, "models", "tiny")
    assert results["final"]["checkpoint"] == os.path.join(model_dir, "ckpt-8.npz")
    assert os.path.isfile(os.path.join(model_dir, "ckpt-8.npz"))
    assert results["eval"]["global_step"] == 8
    for key in ("loss", "masked_lm_loss", "disc_loss"):
        assert math.isfinite(results["eval"][key]) and results["eval"][key] > 0, results["eval"]
    # Random guessing among the vocab: the generator's loss starts near log(V).
    assert results["eval"]["masked_lm_loss"] < 2 * math.log(len(vocab))

    # Fine-tune on JAX from that checkpoint: 64 examples, batch 16, 2 epochs.
    finetune = {"task_names": ["topic"], "raw_data_dir": os.path.join(tmp, "raw"),
                "max_seq_length": 32, "train_batch_size": 16, "num_train_epochs": 2,
                "learning_rate": 1e-3, "mixed_precision": "float32"}
    _run([tool("electra-finetune"), "--backend", "jax", "--data-dir", data, "--model-name",
          "tiny", "--hparams", json.dumps(finetune)], tmp, env, "fine-tune")
    with open(os.path.join(model_dir, "results", "topic_results.json")) as f:
        finetuned = json.load(f)
    assert finetuned["backend"] == "jax"
    assert finetuned["init"]["source"] == os.path.join(model_dir, "ckpt-8.npz")
    assert finetuned["init"]["step"] == 8
    assert finetuned["data"]["topic"]["labels"] == ["animal", "colour"]
    (trial,) = finetuned["trials"]
    assert trial["steps"] == 8  # 64 / 16 x 2 epochs
    assert math.isfinite(trial["final_loss"])
    dev = trial["metrics"]["topic"]["dev"]
    assert 0 <= dev["accuracy"] <= 100 and math.isfinite(dev["loss"]) and dev["loss"] > 0, dev
    with np.load(trial["export"]) as weights:
        arrays = {k: weights[k] for k in weights.files if weights[k].dtype.kind == "f"}
    assert arrays and all(np.isfinite(a).all() for a in arrays.values())
    assert any(a.shape == (len(vocab), 32) for a in arrays.values())  # the word embeddings
