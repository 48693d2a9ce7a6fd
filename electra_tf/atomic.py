"""Atomic writes: a file or directory appears complete at its final path, or not at all.

Everything electra-tf writes for later runs or other programs to read (config.json, the vocab
copy, eval results, SavedModels, fetched data, exports for other frameworks) goes through
`atomic_path`: the content is written under a hidden temporary name in the same directory (same
filesystem, so the final rename is atomic) and renamed into place only once complete. A crash or
a full disk mid-write leaves the previous version (or nothing), never half a file.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Iterator, List, Mapping

logger = logging.getLogger("electra_tf")

# `.NAME.tmp-XXXXXXXX` (mkstemp/mkdtemp's random suffix), and `.old` for a directory being
# replaced: what an interrupted `atomic_path` leaves behind.
_TEMPORARY = re.compile(r"^\..+\.tmp-[a-z0-9_]{6,}(\.old)?$")


_TMP_INFIX = ".tmp-"


@functools.lru_cache(maxsize=None)
def _umask() -> int:
    umask = os.umask(0)  # the only way to read it is to set it: once per process
    os.umask(umask)
    return umask


def _default_mode(directory: bool) -> int:
    # mkstemp / mkdtemp create 0600 / 0700; what we write is meant to be read by others (an
    # export served by another user), so give it what open() / os.makedirs() would.
    return (0o777 if directory else 0o666) & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str, directory: bool = False) -> Iterator[str]:
    """Yields a temporary path beside `path`; renames it onto `path` when the block succeeds.

    The temporary name is hidden and unique (`.NAME.tmp-XXXXXX`), so concurrent writers never
    collide. An existing file is replaced by one `os.replace`; an existing directory is first
    renamed aside, then deleted once the new one is in place (a reader sees the old or the new
    directory, never a mix). If the block raises, the temporary path is removed and `path` is
    left as it was.

    Args:
        path: str. The final path; its parent directory is created if missing.
        directory: bool. Yield an empty directory to fill (default: a file to write).

    Example:
        with atomic_path(os.path.join(model_dir, "config.json")) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    prefix = f".{os.path.basename(path)}{_TMP_INFIX}"
    if directory:
        tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    else:
        fd, tmp = tempfile.mkstemp(prefix=prefix, dir=parent)
        os.close(fd)
    try:
        os.chmod(tmp, _default_mode(directory))
        yield tmp
        if not directory:
            fsync_path(tmp)  # the bytes reach the disk before the name does
        if directory and os.path.isdir(path):
            old = tmp + ".old"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
        fsync_path(parent)  # and the new name survives a power loss
    except BaseException:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.remove(tmp)
        raise


def write_text(path: str, text: str) -> None:
    """Writes `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def write_json(path: str, value: Any, **dump_kwargs) -> None:
    """Writes `value` as JSON plus a final newline to `path` atomically.

    Args:
        path: str.
        value: anything `json.dump` takes.
        **dump_kwargs: passed to `json.dump` (default `indent=2`).
    """
    dump_kwargs.setdefault("indent", 2)
    write_text(path, json.dumps(value, **dump_kwargs) + "\n")


def copy_file(source: str, target: str) -> None:
    """Copies `source` to `target` atomically (the content only, with default permissions)."""
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def write_files(directory: str, writers: Mapping[str, Callable[[str], None]]) -> None:
    """Writes several files into `directory` together: all of them, or none if one fails.

    Each writer fills the path it is given, in a hidden staging directory (`.NAME.tmp-XXXXXX`,
    what `remove_temporaries` clears after a kill). Only once every writer has returned do the
    files take their names: a missing `directory` is renamed into place whole (atomic); into an
    existing one each file is renamed (replacing a file of that name; nothing else there is
    touched). A writer that raises leaves `directory` as it was. The files get the default
    permissions (`open()`'s under the umask) whatever mode a writer created them with.

    Args:
        directory: str. The directory to write into (created, with its parents, if missing).
        writers: {file name: function(path) writing that file at path}.
    """
    def fill(staging):
        for name, write in writers.items():
            path = os.path.join(staging, name)
            write(path)
            os.chmod(path, _default_mode(False))
            fsync_path(path)

    if not os.path.isdir(directory):
        with atomic_path(directory, directory=True) as staging:
            fill(staging)
        return
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(directory))}"
                                      f"{_TMP_INFIX}", dir=directory)
    try:
        fill(staging)
        for name in writers:
            os.replace(os.path.join(staging, name), os.path.join(directory, name))
        fsync_path(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fsync_path(path: str) -> None:
    """Flushes a file's (or a directory's entries') writes to the disk.

    Filesystems that cannot sync a directory (EINVAL) are accepted silently.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def is_temporary(name: str) -> bool:
    """True for the name of a temporary that `atomic_path` creates (left behind by a kill)."""
    return bool(_TEMPORARY.match(name))


def remove_temporaries(directory: str) -> List[str]:
    """Deletes what interrupted atomic writes left in `directory` (not recursively).

    Only safe while no other process writes there (the caller holds the directory's lock):
    a live writer's temporary looks the same.

    Returns:
        The paths removed.
    """
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in sorted(names):
        if not is_temporary(name):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        removed.append(path)
    return removed
