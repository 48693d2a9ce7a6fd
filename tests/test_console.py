"""Quiet by default: a tool's process prints electra-tf's lines, not TensorFlow's start-up lines
or its Python loggers' chatter; `--verbose` shows them. Also the progress helpers."""

import subprocess
import sys

import pytest

from electra_tf.progress import RateEta, eta_seconds, format_duration
from tests import pretraining_fixtures as fx

SCRIPT = r"""
import logging, sys
from electra_tf import console
console.setup(verbose=sys.argv[1] == "verbose")
tf = console.import_tensorflow()
print(int(tf.constant(1) + 1), file=sys.stderr)
logging.getLogger("tensorflow").warning("tensorflow chatter")
logging.getLogger("absl").info("absl chatter")
logging.getLogger("electra_tf").info("our line")
"""


def _run(mode):
    env = fx.subprocess_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "our line" in proc.stderr and "2" in proc.stderr.splitlines()
    return proc.stderr


def test_tensorflow_start_up_lines_only_with_verbose():
    quiet, verbose = _run("quiet"), _run("verbose")
    assert "tensorflow chatter" in verbose and "absl chatter" in verbose
    assert "tensorflow chatter" not in quiet and "absl chatter" not in quiet
    # TensorFlow's C++ start-up lines (this build prints oneDNN / CUDA probing lines): shown
    # with --verbose, never by default.
    start_up = [line for line in verbose.splitlines() if "I0000" in line or "E0000" in line
                or "absl::InitializeLog" in line]
    assert [line for line in quiet.splitlines() if "I0000" in line or "E0000" in line
            or "absl::InitializeLog" in line] == []
    print(f"{len(start_up)} start-up lines hidden by default")


def test_format_duration_and_eta():
    assert format_duration(3723.9) == "1h02m03s"
    assert format_duration(float("inf")) == "?" and format_duration(float("nan")) == "?"
    assert eta_seconds(0, 10, 5.0) == float("inf")
    assert eta_seconds(2, 10, 4.0) == pytest.approx(16.0)
    clock = iter([0.0, 10.0]).__next__
    rate = RateEta("MB", scale=1e6, clock=clock)
    assert rate.describe(5e6, 20e6) == "0.5 MB/s, ETA 0h00m30s"
