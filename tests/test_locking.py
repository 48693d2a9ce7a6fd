"""electra_tf.locking against real concurrent processes: a holder in another process, a holder
killed with SIGKILL (stale lock taken over), re-entry within one process, a read-only
directory."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from electra_tf import locking
from tests.pretraining_fixtures import REPO_ROOT, subprocess_env

HOLD = ("import sys; from electra_tf.locking import DirectoryLock; "
        "lock = DirectoryLock(sys.argv[1], 'test dir').acquire(); print('locked', flush=True); "
        "sys.stdin.read(); lock.release()")


def wait_for_holder(directory, pid, process, timeout=120):
    """Waits until `directory`'s lock file names `pid` (polling the file; fails if `process`
    ends first or the deadline passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holder = locking.read_holder(directory)
        if holder and holder.get("pid") == pid:
            return holder
        assert process.poll() is None, f"process {pid} ended ({process.returncode}) before locking"
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not lock {directory} within {timeout} s")


@pytest.fixture
def holder(tmp_path):
    """A process holding tmp_path/locked's lock until its stdin closes."""
    directory = tmp_path / "locked"
    directory.mkdir()
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=subprocess_env(), cwd=REPO_ROOT)
    assert process.stdout.readline().strip() == b"locked"
    yield str(directory), process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=60)


def test_a_second_writer_is_refused_naming_the_holder(holder):
    directory, process = holder
    with pytest.raises(locking.LockError) as info:
        locking.DirectoryLock(directory, "test dir").acquire()
    message = str(info.value)
    assert f"test dir {directory} is in use by pid {process.pid} on host {socket.gethostname()}" \
        in message and "\n" not in message, message
    assert locking.current_holder(directory)["pid"] == process.pid
    process.stdin.close()  # a clean release deletes the lock file
    assert process.wait(timeout=60) == 0
    assert not os.path.exists(locking.lock_path(directory))
    assert locking.current_holder(directory) is None
    with locking.DirectoryLock(directory, "test dir"):
        assert locking.read_holder(directory)["pid"] == os.getpid()


def test_stale_lock_of_a_killed_holder_is_taken_over(holder, caplog):
    directory, process = holder
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert locking.read_holder(directory)["pid"] == process.pid  # the file stays behind
    assert locking.current_holder(directory) is None  # but no one holds it
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        lock = locking.DirectoryLock(directory, "test dir").acquire()
    try:
        assert any(f"taking over a stale lock of pid {process.pid}" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        assert locking.read_holder(directory)["pid"] == os.getpid()
    finally:
        lock.release()


def test_lock_is_reentrant_within_a_process(tmp_path):
    first = locking.DirectoryLock(str(tmp_path)).acquire()
    second = locking.DirectoryLock(str(tmp_path)).acquire()
    first.release()
    assert locking.read_holder(str(tmp_path))["pid"] == os.getpid()  # still held by `second`
    second.release()
    assert not os.path.exists(locking.lock_path(str(tmp_path)))


def test_holder_record_is_one_json_line(tmp_path):
    with locking.DirectoryLock(str(tmp_path)):
        with open(locking.lock_path(str(tmp_path)), encoding="utf-8") as f:
            lines = f.read().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert set(record) == {"pid", "host", "started", "command"}


def test_the_trainer_names_a_builder_that_has_not_written_a_file_yet(holder):
    """A locked directory with no shards yet: the trainer's data check names the writer instead
    of sending the user to build data that is being built; once released, "no files match"."""
    from electra_tf.data import pipeline
    directory, process = holder
    pattern = os.path.join(directory, "pretrain_data.tfrecord*") + "," + os.path.join(directory,
                                                                                      ".partial-*")
    check = dict(max_seq_length=32, vocab_sha256="", vocab_size=100)
    with pytest.raises(pipeline.DataError, match=f"being written right now by pid {process.pid}"):
        pipeline.validate_dataset(pattern, **check)
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    with pytest.raises(pipeline.DataError, match="no TFRecord files match"):
        pipeline.validate_dataset(pattern, **check)
