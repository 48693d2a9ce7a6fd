"""electra_tf.locking against real concurrent processes: a holder in another process, a holder
killed with SIGKILL (stale lock taken over), re-entry within one process, a read-only
directory, and a writer whose lock lands inside another process's momentary probe."""

import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from electra_tf.errors import DataError
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


def never_pause(seconds):
    raise AssertionError("the writer waited although a live holder is recorded")


def test_a_second_writer_is_refused_naming_the_holder(holder, monkeypatch):
    directory, process = holder
    monkeypatch.setattr(locking, "_pause", never_pause)  # a live holder is reported at once
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
    from electra_tf.data.records import integrity
    directory, process = holder
    pattern = os.path.join(directory, "pretrain_data.tfrecord*") + "," + os.path.join(directory,
                                                                                      ".partial-*")
    check = dict(max_seq_length=32, vocab_sha256="", vocab_size=100)
    with pytest.raises(DataError, match=f"being written right now by pid {process.pid}"):
        integrity.validate_dataset(pattern, **check)
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    with pytest.raises(DataError, match="no TFRecord files match"):
        integrity.validate_dataset(pattern, **check)


def dead_pid():
    """The pid of a child that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def probe_lock(directory, record):
    """A shared lock on `directory`'s lock file, as `current_holder` takes it for an instant,
    over a file that names `record` (None: no holder written yet). Returns the descriptor."""
    with open(locking.lock_path(directory), "w", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n" if record else "")
    fd = os.open(locking.lock_path(directory), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return fd


@pytest.mark.parametrize("recorded", ["nobody", "a dead holder"])
def test_a_writer_that_lands_in_a_probe_waits_for_it_instead_of_stopping(tmp_path, monkeypatch,
                                                                          recorded):
    """The race `current_holder` opens: its shared lock is up while a writer tries to lock. The
    probe ends at the writer's first pause here, exactly where it would end in the race."""
    directory = str(tmp_path)
    record = None if recorded == "nobody" else {"pid": dead_pid(), "host": socket.gethostname()}
    fd = probe_lock(directory, record)
    pauses = []

    def probe_ends(seconds):
        pauses.append(seconds)
        os.close(fd)

    monkeypatch.setattr(locking, "_pause", probe_ends)
    with locking.DirectoryLock(directory, "test dir"):
        assert locking.read_holder(directory)["pid"] == os.getpid()
    assert len(pauses) == 1


def test_a_lock_still_held_after_the_grace_is_reported_busy(tmp_path, monkeypatch):
    """A dead holder's lock that stays held (a child inherited the descriptor): the writer gives up
    after PROBE_GRACE_S and names the recorded holder."""
    directory = str(tmp_path)
    pid = dead_pid()
    fd = probe_lock(directory, {"pid": pid, "host": socket.gethostname()})
    pauses = []
    monkeypatch.setattr(locking, "_pause", pauses.append)
    try:
        with pytest.raises(locking.LockError, match=f"is in use by pid {pid} on host"):
            locking.DirectoryLock(directory, "test dir").acquire()
    finally:
        os.close(fd)
    assert len(pauses) == int(locking.PROBE_GRACE_S / locking._RETRY_PAUSE_S) > 0
    assert sum(pauses) == pytest.approx(locking.PROBE_GRACE_S)
