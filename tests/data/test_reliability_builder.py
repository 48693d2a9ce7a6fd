"""Fault injection on the dataset builder: SIGKILL mid-build, then rerun; a second builder on
the same output directory; a disk that fills up mid-build.

A real `build_pretraining_dataset.py` process over a corpus that takes a few seconds is killed
once its temporary files (the shuffle's bucket files) hold data. The rerun must not mix the killed build's files with its own:
without --overwrite it refuses naming the interrupted build; the trainer refuses the directory
too; with --overwrite it starts clean and produces exactly what an uninterrupted build does.
"""

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from electra_tf.errors import DataError
from electra_tf import locking
from electra_tf.data.records import integrity
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx
from tests.test_locking import wait_for_holder

SCRIPT = os.path.join(fx.REPO_ROOT, "build_pretraining_dataset.py")
TIMEOUT = 240
NUM_WORDS = 500


def _corpus(directory, num_files=4, docs_per_file=1500, seed=0):
    rng = random.Random(seed)
    os.makedirs(directory)
    for f in range(num_files):
        docs = ["\n".join(" ".join(f"w{rng.randrange(NUM_WORDS)}" for _ in range(rng.randint(3, 15)))
                          for _ in range(rng.randint(2, 8))) for _ in range(docs_per_file)]
        with open(os.path.join(directory, f"part{f}.txt"), "w") as out:
            out.write("\n\n".join(docs) + "\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("builder_kill")
    _corpus(str(root / "corpus"))
    vocab = fx.write_vocab(str(root / "vocab.txt"), fx.vocab_tokens(NUM_WORDS))
    return {"root": root, "corpus": str(root / "corpus"), "vocab": vocab}


def _command(inputs, out, *flags):
    return [sys.executable, SCRIPT, "--corpus-dir", inputs["corpus"], "--vocab-file", inputs["vocab"],
            "--output-dir", out, "--max-seq-length", "32", "--num-out-files", "4",
            "--num-processes", "1", "--seed", "3", *flags]


def _digests(out):
    return {name: hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(out)) if name != "manifest.json"}


def _partial_data(out):
    """Whether a temporary file of the build (in the output dir or its shuffle dir) has data."""
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            hidden = os.path.relpath(path, out).startswith(".partial-")
            try:
                if hidden and os.path.getsize(path) > 0:
                    return True
            except OSError:  # renamed or removed meanwhile
                pass
    return False


@pytest.mark.slow  # a kill and a rerun of the builder (~60 s)
def test_sigkill_mid_build_then_rerun_never_mixes_shards(inputs):
    killed_out = str(inputs["root"] / "killed")
    proc = subprocess.Popen(_command(inputs, killed_out), env=fx.subprocess_env(),
                            cwd=fx.REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    killed = False
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            if _partial_data(killed_out):
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None and not killed:
            proc.kill()
        err = proc.communicate(timeout=60)[1]
    assert killed and proc.returncode == -signal.SIGKILL, f"build ended before the kill:\n{err[-2000:]}"
    leftovers = os.listdir(killed_out)
    assert "manifest.json" not in leftovers
    assert any(n.startswith(".partial-") for n in leftovers), leftovers
    assert locking.read_holder(killed_out)["pid"] == proc.pid  # its lock file, now stale

    # The trainer refuses the half-built directory.
    with pytest.raises(DataError, match="interrupted dataset build"):
        integrity.validate_dataset(os.path.join(killed_out, "pretrain_data.tfrecord*") + ","
                                  + os.path.join(killed_out, ".partial-*"),
                                  max_seq_length=32, vocab_sha256="", vocab_size=100)

    # A rerun without --overwrite refuses, naming the interrupted build, and touches nothing.
    rerun = subprocess.run(_command(inputs, killed_out), env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert rerun.returncode == 2
    assert "holds an interrupted build" in rerun.stderr and "--overwrite" in rerun.stderr
    assert "Traceback" not in rerun.stderr
    # It took over the killed build's stale lock (and released it): nothing else changed.
    assert f"taking over a stale lock of pid {proc.pid}" in rerun.stderr, rerun.stderr
    assert sorted(os.listdir(killed_out)) == sorted(n for n in leftovers
                                                     if n != locking.LOCK_NAME)

    # With --overwrite the rerun starts clean: the result equals an uninterrupted build.
    rerun = subprocess.run(_command(inputs, killed_out, "--overwrite"), env=fx.subprocess_env(),
                           cwd=fx.REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    clean_out = str(inputs["root"] / "clean")
    clean = subprocess.run(_command(inputs, clean_out), env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert not any(n.startswith(".partial-") for n in os.listdir(killed_out))
    assert _digests(killed_out) == _digests(clean_out)
    manifest = json.load(open(os.path.join(killed_out, "manifest.json")))
    listed = sorted(s["file"] for split in manifest["splits"].values() for s in split["shards"])
    assert sorted(listed + ["inputs.jsonl"]) == sorted(_digests(killed_out))


def test_second_builder_on_the_same_output_dir_stops_naming_the_first(inputs):
    """Two builders on one --output-dir: the second (even with --overwrite) stops at once with
    one line naming the first, which finishes undisturbed; the trainer refuses the directory
    while the first is writing it."""
    out = str(inputs["root"] / "contended")
    first = subprocess.Popen(_command(inputs, out), env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_holder(out, first.pid, first, timeout=TIMEOUT)
        first.send_signal(signal.SIGSTOP)  # holds its lock, mid-build, until SIGCONT
        second = subprocess.run(_command(inputs, out, "--overwrite"), env=fx.subprocess_env(),
                                cwd=fx.REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT)
        with pytest.raises(DataError, match=f"being written right now by pid {first.pid}"):
            integrity.validate_dataset(os.path.join(out, "pretrain_data.tfrecord*") + ","
                                      + os.path.join(out, ".partial-*"),
                                      max_seq_length=32, vocab_sha256="", vocab_size=100)
    finally:
        first.send_signal(signal.SIGCONT)
    err = first.communicate(timeout=TIMEOUT)[1]
    errors = [line for line in second.stderr.splitlines()
              if line.startswith("build_pretraining_dataset.py: error:")]
    assert second.returncode == 2 and len(errors) == 1, second.stderr
    assert f"--output-dir {out} is in use by pid {first.pid} on host" in errors[0], errors[0]
    assert first.returncode == 0, err[-3000:]
    assert " done: " in err
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    listed = sorted(s["file"] for split in manifest["splits"].values() for s in split["shards"])
    assert sorted(listed + ["inputs.jsonl", "manifest.json"]) == sorted(os.listdir(out))


@pytest.mark.slow  # two builds, ~50 s on 2 shared cores
def test_disk_full_mid_build_is_one_line_and_leaves_no_temporaries(inputs, tmp_path):
    """A real full filesystem (a tmpfs with 96 KiB free, far less than the dataset): one line
    naming the directory and ENOSPC, exit 2, the build's temporary files removed; the directory
    was new, so nothing is left there and the line does not advise --overwrite; with space
    again the same command builds the dataset."""
    with faults.small_filesystem(str(tmp_path / "disk"), size="4m") as disk:
        out = os.path.join(disk, "out")
        filler = faults.fill(disk, 96 << 10)
        full = subprocess.run(_command(inputs, out), env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                              capture_output=True, text=True, timeout=TIMEOUT)
        errors = [line for line in full.stderr.splitlines()
                  if line.startswith("build_pretraining_dataset.py: error:")]
        assert full.returncode == 2 and len(errors) == 1, full.stderr[-3000:]
        assert "Traceback" not in full.stderr, full.stderr[-3000:]
        assert "cannot write" in errors[0] and out in errors[0], errors[0]
        assert "No space left on device" in errors[0], errors[0]
        assert not os.path.exists(out)  # the directory it created, temporaries and all
        assert "--overwrite" not in errors[0], errors[0]  # a rerun has nothing to replace
        os.remove(filler)
        rerun = subprocess.run(_command(inputs, out), env=fx.subprocess_env(),
                               cwd=fx.REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert os.path.isfile(os.path.join(out, "manifest.json"))
