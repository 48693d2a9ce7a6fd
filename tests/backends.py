"""Running a piece of electra-tf under another Keras backend (JAX, PyTorch) from a test.

Keras picks its backend once per process (`KERAS_BACKEND`), and the test process runs on
TensorFlow, so the other backends run in child processes: `run_on_backend(backend, code)` runs
`code` in a fresh Python with that backend, TensorFlow and tensorflow_text made unimportable (the
JAX and PyTorch paths must not need them), and returns the numpy arrays the code stored in the
dict `out`. Arrays go in with `inputs=` the same way (`inp` in the code).
"""

import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Dict, Optional

import numpy as np
import pytest

from tests import extras
from tests import pretraining_fixtures as fx

BACKENDS = ("jax", "torch")
BLOCKED = ("tensorflow", "tensorflow_text")

_PRELUDE = """
import os, sys
import numpy as np


if {block}:
    # TensorFlow must stay out of the JAX and PyTorch paths: `import tensorflow` raises
    # ImportError and importlib.util.find_spec says it is not installed (as a probe expects).
    for _name in {blocked!r}:
        sys.modules[_name] = None
inp = dict(np.load(sys.argv[1])) if sys.argv[1] else {{}}
out = {{}}
"""

_EPILOGUE = """
np.savez(sys.argv[2], **{k: np.asarray(v) for k, v in out.items()})
"""


def require(backend: str) -> None:
    """Skips the calling test where `backend` is not installed (an error in CI: the README's
    test command installs the [jax] extra)."""
    extras.import_extra({"jax": "jax", "torch": "torch"}[backend], "jax")


def run_on_backend(backend: str, code: str, inputs: Optional[Dict[str, np.ndarray]] = None,
                   block_tensorflow: bool = True, timeout: float = 600,
                   env: Optional[dict] = None) -> Dict[str, np.ndarray]:
    """Runs `code` under `KERAS_BACKEND=backend` in a child process; returns its `out` dict.

    Args:
        backend: "tensorflow", "jax" or "torch".
        code: Python source; reads `inp` (a dict of numpy arrays), fills `out`.
        inputs: arrays for `inp`.
        block_tensorflow: make `tensorflow` and `tensorflow_text` unimportable in the child.
        timeout: seconds before the child is killed (the test then fails).
        env: extra environment variables.
    """
    with tempfile.TemporaryDirectory(dir=fx.CHILD_TMPDIR) as tmp:
        in_path = ""
        if inputs:
            in_path = os.path.join(tmp, "in.npz")
            np.savez(in_path, **inputs)
        out_path = os.path.join(tmp, "out.npz")
        script = (_PRELUDE.format(blocked=BLOCKED, block=block_tensorflow and backend != "tensorflow")
                  + textwrap.dedent(code) + _EPILOGUE)
        child_env = fx.subprocess_env(KERAS_BACKEND=backend, **(env or {}))
        proc = subprocess.run([sys.executable, "-c", script, in_path, out_path], env=child_env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            pytest.fail(f"{backend} child failed (exit {proc.returncode}):\n"
                        f"{proc.stderr[-4000:]}")
        with np.load(out_path) as data:
            return {k: data[k] for k in data.files}


def blocked_tool_command(script: str, *args: str) -> list:
    """argv running the repo's tool `script` (e.g. "run_pretraining.py") with `args`, in a
    Python where TensorFlow and tensorflow_text cannot be imported (the JAX / PyTorch path of
    the whole command must not need them)."""
    code = (f"import sys, runpy\nfor _n in {BLOCKED!r}:\n    sys.modules[_n] = None\n"
            f"sys.argv = [{script!r}] + sys.argv[1:]\n"
            f"runpy.run_path({os.path.join(fx.REPO_ROOT, script)!r}, run_name='__main__')\n")
    return [sys.executable, "-c", code, *args]
