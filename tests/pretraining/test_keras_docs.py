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


def runnable_code() -> str:
    """The doc's Python blocks from the keras-hub section on, in order (one program)."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    text = text[text.index(FIRST_RUNNABLE_SECTION):]
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 2, "docs/keras.md changed: update this test"
    return "\n".join(blocks)


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
