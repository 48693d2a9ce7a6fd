"""Real faults for reliability tests: a small filesystem that fills up, a read-only one.

Not a test module. `small_filesystem` mounts a tmpfs (root only; a test using it is skipped
with the reason where mounting is not allowed), `fill` leaves a chosen number of free bytes on
it, `read_only` remounts it read-only (so even root gets EROFS; chmod does not stop root).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import subprocess
import time
from typing import Iterator

import pytest

from tests import pretraining_fixtures as fx


@contextlib.contextmanager
def small_filesystem(mount_point: str, size: str = "8m") -> Iterator[str]:
    """A tmpfs of `size` mounted on `mount_point` (created) for the block."""
    os.makedirs(mount_point, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount_point],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        gc.collect()  # close files (trainers, writers) still open on the mount
        if subprocess.run(["umount", mount_point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], check=False)


def fill(directory: str, leave_bytes: int, name: str = "filler") -> str:
    """Fills the filesystem of `directory` up to `leave_bytes` free; returns the filler's path."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b"\0" * max(free - leave_bytes, 0))
    return path


def read_only(mount_point: str) -> None:
    """Remounts a `small_filesystem` read-only."""
    gc.collect()
    subprocess.run(["mount", "-o", "remount,ro", mount_point], check=True, capture_output=True)


def run_main(main, capsys, *argv):
    """(exit status, stderr) of a script's `main(argv)` run in this process."""
    code = main(list(argv))
    return code, capsys.readouterr().err


def one_error_line(code: int, err: str, prog: str = "run_pretraining.py") -> str:
    """The one `PROG: error:` line of a failed command; asserts exit status 2, no traceback."""
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error:")]
    assert code == 2, (code, err[-3000:])
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def flip_tensor_bytes(prefix: str, name: str) -> str:
    """Damages the tensor `name` of the checkpoint `prefix` on disk, as bit rot would: a few
    bytes in the middle of its stored value are inverted (its CRC32C no longer matches).
    Returns `name`."""
    import tensorflow as tf

    value = tf.train.load_checkpoint(prefix).get_tensor(name).tobytes()
    data_path = f"{prefix}.data-00000-of-00001"
    with open(data_path, "rb") as f:
        data = f.read()
    offset = data.find(value)
    assert offset >= 0 and data.find(value, offset + 1) < 0, f"{name} not found once in {data_path}"
    middle = offset + len(value) // 2
    damaged = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    with open(data_path, "r+b") as f:
        f.seek(middle)
        f.write(damaged)
    return name


# A ceiling for a child run, reached only when it hangs (CI machines are loaded).
RUN_TIMEOUT = 600


def wait_for_log(path, pattern, proc, timeout=RUN_TIMEOUT):
    """True once `pattern` is in the file `path` (the log of `proc`); False if `proc` ends or
    `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with open(path, encoding="utf-8", errors="replace") as f:
            if re.search(pattern, f.read()):
                return True
        time.sleep(0.02)
    return False


def sigterm_when(command, env, log_path, pattern):
    """Runs `command` (stderr to `log_path`), sends it SIGTERM once `pattern` is logged and
    waits for it to end; returns (exit status, log)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=env, cwd=fx.REPO_ROOT, stdout=subprocess.DEVNULL,
                                stderr=log, text=True)
        try:
            assert wait_for_log(log_path, pattern, proc), log_path.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=RUN_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, log_path.read_text()
