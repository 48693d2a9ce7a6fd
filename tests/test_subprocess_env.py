"""The test suite's child processes keep their temp files out of /tmp."""

import os
import subprocess
import sys

from tests import pretraining_fixtures as fx


def test_children_write_temp_files_under_pytests_basetemp(tmp_path_factory):
    env = fx.subprocess_env()
    basetemp = str(tmp_path_factory.getbasetemp())
    assert os.path.commonpath([env["TMPDIR"], basetemp]) == basetemp
    assert os.path.isdir(env["TMPDIR"])
    child = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
        env=env, capture_output=True, text=True, timeout=120, check=True)
    assert child.stdout.strip() == env["TMPDIR"]
