"""One writer per directory: an exclusive advisory lock with the holder's pid and host.

The dataset builder locks its output directory and the trainer its run directory (a non-chief
worker its own checkpoint directory) while they write there. The lock is `DIR/.electra_tf.lock`,
held with `fcntl.flock` and holding a JSON line naming the holder (pid, host, start time,
command). A second writer gets a `LockError` naming the holder, before it writes anything.

The kernel releases the lock when its holder ends, however it ends (SIGKILL, a crash, a power
loss), so a lock file without a lock is stale: the next writer takes it over and logs whose it
was. A clean release deletes the file. On a filesystem where `flock` does not work (ENOLCK,
EOPNOTSUPP: some network filesystems) the recorded holder decides instead: a live process on
this host (or any process on another host, which cannot be checked from here) holds it.

Within one process the lock is re-entrant (counted), so sequential objects working on one
directory (a test's two trainers, a resumed run in a notebook) do not lock each other out.

`current_holder` probes with a momentary shared lock. A writer whose exclusive lock lands in that
window, or in the microseconds between a new holder's lock and its record, finds the lock taken
while the file names no live holder; it retries for up to `PROBE_GRACE_S` before it reports the
directory busy. A recorded holder that is alive (or on another host) is reported at once.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Dict, Optional, Tuple

from electra_tf.errors import ElectraError, shown_path

logger = logging.getLogger("electra_tf")

LOCK_NAME = ".electra_tf.lock"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
# Held locks of this process: real path of the lock file -> (fd or -1 without flock, count).
_held: Dict[str, Tuple[int, int]] = {}
_held_guard = threading.Lock()
# How long a writer retries a lock that is taken while its file names no live holder: a probe's
# shared lock lasts microseconds, so this only adds delay when a dead holder's lock is still held
# (e.g. by a child that inherited the descriptor), which is then reported as before.
PROBE_GRACE_S = 1.0
_RETRY_PAUSE_S = 0.01
_pause = time.sleep  # the retry's wait; tests replace it to act at the exact retry point


class LockError(ElectraError, RuntimeError):
    """Another process writes the directory (the message names it)."""


def lock_path(directory: str) -> str:
    return os.path.join(directory, LOCK_NAME)


def read_holder(directory: str) -> Optional[dict]:
    """The holder recorded in `directory`'s lock file (None: no file, or unreadable)."""
    try:
        with open(lock_path(directory), encoding="utf-8") as f:
            holder = json.loads(f.read() or "null")
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def current_holder(directory: str) -> Optional[dict]:
    """The holder of `directory`'s lock if a live process holds it now, else None.

    A probe: takes and drops the lock when it is free (never blocks).
    """
    path = lock_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return read_holder(directory) or {}
        return None
    finally:
        os.close(fd)
    return None


def held_here(directory: str) -> bool:
    """True if this process holds `directory`'s lock."""
    with _held_guard:
        return os.path.realpath(lock_path(directory)) in _held


def describe(holder: Optional[dict]) -> str:
    """`pid 123 on host h (since 2024-01-01T10:00:00, `cmd`)`, for messages."""
    if not holder:
        return "another process (no holder recorded yet)"
    since = holder.get("started", "?")
    command = holder.get("command", "")
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {since}"
            + (f", `{command}`" if command else "") + ")")


class DirectoryLock:
    """An exclusive lock on `directory` (which must exist) for the life of a writer.

    Use as a context manager, or `acquire()` / `release()`.

    Args:
        directory: str. The directory to lock.
        what: str. How messages call it ("--output-dir", "model dir").
    """

    def __init__(self, directory: str, what: str = "directory"):
        self.directory = directory
        self.what = what
        self.path = lock_path(directory)
        self._key = os.path.realpath(self.path)
        self.acquired = False

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> "DirectoryLock":
        """Takes the lock (or counts once more if this process holds it).

        Raises:
            LockError: another live process holds it.
            OSError: the lock file cannot be created (a read-only directory).
        """
        if self.acquired:
            return self
        with _held_guard:
            if self._key in _held:
                fd, count = _held[self._key]
                _held[self._key] = (fd, count + 1)
            else:
                _held[self._key] = (self._take(), 1)
        self.acquired = True
        return self

    def release(self) -> None:
        """Drops this object's hold; the last one deletes the lock file and unlocks."""
        if not self.acquired:
            return
        self.acquired = False
        with _held_guard:
            fd, count = _held[self._key]
            if count > 1:
                _held[self._key] = (fd, count - 1)
                return
            del _held[self._key]
        try:
            os.remove(self.path)  # while still holding it: no one locks a file being deleted
        except OSError:
            pass
        if fd >= 0:
            os.close(fd)

    # -------------------------------------------------------------------------------------------
    def _take(self) -> int:
        retries = int(PROBE_GRACE_S / _RETRY_PAUSE_S)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in _NO_FLOCK:
                    return self._take_without_flock()
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    holder = read_holder(self.directory)
                    if retries > 0 and not (holder and _alive_elsewhere(holder)):
                        # Taken, but by no live recorded holder: a probe of `current_holder`, or
                        # a new holder that has not written its record yet. Both end at once.
                        retries -= 1
                        _pause(_RETRY_PAUSE_S)
                        continue
                    raise self._busy(holder) from None
                raise
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # the previous holder deleted it as we opened it: take the new one
        self._record(fd)
        return fd

    def _take_without_flock(self) -> int:
        holder = read_holder(self.directory)
        if holder and holder.get("pid") != os.getpid() and _alive_elsewhere(holder):
            raise self._busy(holder)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._record(fd)
        os.close(fd)
        logger.warning("%s: file locks do not work on this filesystem; the lock relies on the "
                       "recorded holder only", shown_path(self.path))
        return -1

    def _record(self, fd: int) -> None:
        """Writes this process as the holder, logging a stale holder it replaces."""
        previous = os.read(fd, 4096)
        if previous.strip():
            try:
                stale = json.loads(previous)
            except ValueError:
                stale = None
            logger.warning("%s %s: taking over a stale lock of %s, which is no longer running",
                           self.what, shown_path(self.directory),
                           describe(stale if isinstance(stale, dict) else None))
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "command": " ".join(os.path.basename(a) if i == 0 else a
                                      for i, a in enumerate(sys.argv))[:200]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)

    def _busy(self, holder: Optional[dict]) -> LockError:
        return LockError(
            f"{self.what} {shown_path(self.directory)} is in use by {describe(holder)}: only one "
            f"process may write there at a time; wait for it to finish or stop it (lock file "
            f"{shown_path(self.path)})")


def _alive_elsewhere(holder: dict) -> bool:
    """Whether a recorded holder may still run: a live pid on this host, or another host."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
