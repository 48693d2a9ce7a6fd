"""Atomic writes: a file or directory appears complete at its final path, or not at all.

Everything electra-tf writes for later runs or other programs to read (config.json, the vocab
copy, eval results, SavedModels, fetched data, exports for other frameworks) goes through
`atomic_path`: the content is written under a hidden temporary name in the same directory (same
filesystem, so the final rename is atomic) and renamed into place only once complete. A crash or
a full disk mid-write leaves the previous version (or nothing), never half a file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from typing import Any, Iterator


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
    prefix = f".{os.path.basename(path)}.tmp-"
    if directory:
        tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    else:
        fd, tmp = tempfile.mkstemp(prefix=prefix, dir=parent)
        os.close(fd)
    try:
        os.chmod(tmp, _default_mode(directory))
        yield tmp
        if not directory:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())  # the bytes reach the disk before the name does
        if directory and os.path.isdir(path):
            old = tmp + ".old"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
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
