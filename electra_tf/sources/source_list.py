"""The pinned source list, sources.json: which artifacts, vocab, corpus sources and named
corpus sets the fetch reads, each checked when it is loaded.

The file is package data (pyproject's package-data), so an installed copy finds it. Its
"sources" are the default corpus; "corpora" names extra sets (`--corpus NAME`); "labelled" is
read by `electra_tf.sources.labelled`.
"""

from __future__ import annotations

import json
import os
from typing import List

from electra_tf.sources.downloads import FetchError
from electra_tf.sources.readers import READERS

# The pinned source list is package data (pyproject's package-data), found in a checkout and
# in an installed copy alike.
DEFAULT_SOURCES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sources.json")
SOURCES_FORMAT = 1
_SOURCE_KEYS = ("name", "artifact", "reader", "file_prefix", "members")
# The corpus of sources.json's "sources"; the named extra sets are under "corpora".
DEFAULT_CORPUS = "default"


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
