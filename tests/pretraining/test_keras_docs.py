"""docs/keras.md: the examples run as written (tiny sizes, synthetic batches, no downloads)."""

import math
import os
import re
import runpy

import pytest

from electra_tf.pretraining.metrics import METRIC_NAMES
from tests.pretraining_fixtures import REPO_ROOT

DOC = os.path.join(REPO_ROOT, "docs", "keras.md")
FIRST_RUNNABLE_SECTION = "## The objective around keras-hub backbones"
BACKENDS_SECTION = "## On JAX and PyTorch"


def _section(start: str, end=None) -> str:
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    text = text[text.index(start):]
    return text[:text.index(end)] if end else text


def runnable_code() -> str:
    """The doc's TensorFlow Python blocks from the keras-hub section on, in order (one
    program)."""
    blocks = re.findall(r"```python\n(.*?)```", _section(FIRST_RUNNABLE_SECTION, BACKENDS_SECTION),
                        flags=re.S)
    assert len(blocks) == 2, "docs/keras.md changed: update this test"
    return "\n".join(blocks)


def backends_code() -> str:
    """The self-contained block of the JAX / PyTorch section."""
    blocks = re.findall(r"```python\n(.*?)```", _section(BACKENDS_SECTION), flags=re.S)
    assert len(blocks) == 1, "docs/keras.md changed: update this test"
    return blocks[0]


@pytest.mark.slow  # ~45 s on a loaded 2-core machine (tracing two small models)
@pytest.mark.usefixtures("float32_policy")
def test_docs_examples_run(tmp_path):
    # A real file: autograph reads the source of the example's tf.function from it.
    script = tmp_path / "keras_docs_example.py"
    script.write_text(runnable_code(), encoding="utf-8")
    namespace = runpy.run_path(str(script), run_name="keras_docs_example")

    # The objective around keras-hub backbones trained three steps with finite losses.
    outputs = {k: float(v) for k, v in namespace["outputs"].items()}
    assert all(math.isfinite(v) for v in outputs.values()), outputs
    assert outputs["loss"] == pytest.approx(outputs["mlm_loss"] + 50.0 * outputs["disc_loss"],
                                            rel=1e-5)
    assert int(namespace["optimizer"].iterations) == 3

    # ElectraPretrainer.fit logged the total loss and every official metric.
    history = namespace["history"].history
    assert set(history) == {"loss", *METRIC_NAMES}
    assert all(math.isfinite(v[-1]) for v in history.values()), history
    assert int(namespace["pretrainer"].optimizer.iterations) == 3


@pytest.mark.slow
def test_backends_example_runs_as_written_on_every_backend():
    """The JAX block, run as a script in a fresh process under each backend (TensorFlow made
    unimportable on JAX and PyTorch): it trains (finite losses, the second epoch's below the
    first's) and evaluates. The backends' curves are not compared here: Keras' initialisers
    draw from each backend's own generator (tests/training/test_backends_equal.py hands the
    same weights to all three)."""
    import ast
    import subprocess
    import sys

    from tests import backends, pretraining_fixtures as fx

    losses = {}
    for backend in ("tensorflow",) + backends.BACKENDS:
        if backend != "tensorflow":
            backends.require(backend)
        guard = ("import sys\nfor _n in ('tensorflow', 'tensorflow_text'):\n"
                 "    sys.modules[_n] = None\n") if backend != "tensorflow" else ""
        proc = subprocess.run([sys.executable, "-c", guard + backends_code()],
                              env=fx.subprocess_env(KERAS_BACKEND=backend), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        first, second = proc.stdout.strip().splitlines()[-2:]
        name, curve = first.split(" ", 1)
        assert name == backend
        losses[backend] = ast.literal_eval(curve)
        logs = ast.literal_eval(second)
        assert set(logs) == {"loss", *METRIC_NAMES} and all(math.isfinite(v) for v in logs.values())
    for backend, curve in losses.items():
        assert len(curve) == 2 and all(math.isfinite(v) for v in curve), (backend, curve)
        assert curve[1] < curve[0], (backend, curve)
