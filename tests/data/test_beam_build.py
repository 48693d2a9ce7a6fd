"""The dataset build on Apache Beam's DirectRunner against the local builder, on real text.

Both engines key every example by the same shuffle key and write each shard's key range in key
order, so the check is the strongest one: byte-identical shards and inputs.jsonl, and equal
manifest counts (not only the example multiset).
"""

import bz2
import gzip
import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
from types import SimpleNamespace

import pytest

from tests.extras import import_extra

beam = import_extra("apache_beam", "beam")

from apache_beam.io.localfilesystem import LocalFileSystem  # noqa: E402

from electra_tf.data.build import beam_build, beam_runner  # noqa: E402
from electra_tf.data.build.build_config import BuildConfig  # noqa: E402
from electra_tf.data.build.builder import build_dataset  # noqa: E402
from electra_tf.data.text.corpus import ReadStats, list_corpus_files  # noqa: E402
from electra_tf.data.text.formats import (InputSettings, iter_document_lines,  # noqa: E402
                                          iter_documents)
from electra_tf.errors import BuildError  # noqa: E402
from tests import pretraining_fixtures as fx  # noqa: E402

REAL_CORPUS = os.path.join(fx.REPO_ROOT, "pretrain_data", "corpus")
REAL_VOCAB = os.path.join(fx.REPO_ROOT, "pretrain_data", "vocab.txt")
MAX_SEQ_LENGTH = 64
# Keys of the manifest that describe the run, not the data.
RUN_KEYS = {"runner", "num_processes", "shuffle", "command", "started_at", "finished_at",
            "elapsed_seconds", "phase_seconds", "throughput", "corpus_dir"}


def real_documents(per_source=40):
    """{source prefix: first documents of its first default-corpus file} (real text)."""
    found = {}
    for corpus_file in list_corpus_files(REAL_CORPUS):
        source = corpus_file.relpath.split("_")[0]
        if source not in found:
            docs = iter_documents(iter_document_lines(corpus_file, InputSettings(), ReadStats()))
            found[source] = [doc for _, doc in zip(range(per_source), docs)]
    assert len(found) >= 3, found.keys()
    return found


def as_text(documents):
    return ("\n\n".join("\n".join(doc) for doc in documents) + "\n").encode("utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Real text as plain, gzip, bzip2 and xz files, plus a truncated stream and bad UTF-8."""
    root = tmp_path_factory.mktemp("beam_corpus")
    directory = root / "corpus"
    (directory / "sub").mkdir(parents=True)
    writers = [("plain.txt", lambda b: b), ("sub/gz.txt.gz", gzip.compress),
               ("bz.txt.bz2", bz2.compress), ("sub/xz.txt.xz", lzma.compress)]
    docs = list(real_documents().values())
    for (name, compress), documents in zip(writers, docs + docs):
        (directory / name).write_bytes(compress(as_text(documents)))
    damaged = gzip.compress(as_text(docs[0][:20]))
    (directory / "truncated.txt.gz").write_bytes(damaged[:len(damaged) // 2])
    (directory / "latin1.txt").write_bytes(b"caf\xe9 au lait.\nwhat a day.\n\nanother doc.\n")
    (directory / ".hidden.txt").write_text("never read\n")
    return directory


def build_both(corpus_dir, out_root, beam_args=(), **settings):
    """The local and the Beam build of one config: (local dir, local manifest, beam dir, ...)."""
    settings = dict({"vocab_file": REAL_VOCAB, "max_seq_length": MAX_SEQ_LENGTH,
                     "num_out_files": 3, "eval_fraction": 0.05, "seed": 11}, **settings)
    local_dir, beam_dir = str(out_root / "local"), str(out_root / "beam")
    local = build_dataset(BuildConfig(corpus_dir=str(corpus_dir), output_dir=local_dir,
                                      **settings))
    on_beam = beam_build.build_dataset_beam(
        BuildConfig(corpus_dir=str(corpus_dir), output_dir=beam_dir, **settings),
        "DirectRunner", beam_args)
    return local_dir, local, beam_dir, on_beam


def read_bytes(directory):
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name != "manifest.json"}


def assert_same_dataset(local_dir, local, beam_dir, on_beam):
    assert read_bytes(beam_dir) == read_bytes(local_dir)  # every shard and inputs.jsonl
    assert {k: v for k, v in on_beam.items() if k not in RUN_KEYS} == {
        k: v for k, v in local.items() if k not in RUN_KEYS}
    assert json.load(open(os.path.join(beam_dir, "manifest.json"))) == on_beam


@pytest.fixture(scope="module")
def builds(corpus, tmp_path_factory):
    return build_both(corpus, tmp_path_factory.mktemp("beam_builds"))


def test_same_shards_inputs_and_counts_as_the_local_builder(builds):
    local_dir, local, beam_dir, on_beam = builds
    assert_same_dataset(*builds)
    counts = on_beam["counts"]
    assert counts["files"] == 6 and counts["damaged_files"] == 1
    assert counts["undecodable_bytes"] == 1
    assert {p["problem"] for p in on_beam["input_problems"]} == {"damaged_stream",
                                                                 "invalid_utf8"}
    assert on_beam["splits"]["eval"]["examples"] > 0
    # The held-out split (equal above, so the same documents): planned from both engines'
    # surveys alike; the truncated gzip copy repeats documents of plain.txt, on one side.
    split = on_beam["eval_split"]
    assert split["rule_version"] == 2 and split["within_tolerance"]
    assert split["duplicate_documents"] >= 10
    assert split["held_out_documents"] == on_beam["splits"]["eval"]["documents"]
    assert [s["file"] for s in on_beam["splits"]["train"]["shards"]] == [
        f"pretrain_data.tfrecord-{i}-of-3" for i in range(3)]
    assert not [n for n in os.listdir(beam_dir) if n.startswith(".")]  # no temporaries left


def test_manifest_records_the_runner_and_beam_counters_agree_with_it(builds):
    on_beam = builds[3]
    runner = on_beam["runner"]
    assert runner["name"] == "DirectRunner" and runner["engine"] == "apache_beam"
    assert runner["beam_version"] == beam.__version__ and runner["pipeline_args"] == []
    assert builds[1]["runner"] == {"name": "local", "num_processes": 1}
    counters = runner["counters"]
    assert counters["kind"] == "committed"
    counts, splits = on_beam["counts"], on_beam["splits"]
    examples = splits["train"]["examples"] + splits["eval"]["examples"]
    assert counters["values"]["files"] == counts["files"]
    assert counters["values"]["bytes"] == counts["corpus_bytes"]
    assert counters["values"]["tokens"] == counts["tokenized_tokens"]
    assert counters["values"]["examples"] == counters["values"]["written"] == examples
    assert counters["values"]["problems"] == counts["input_problems"]


def test_rebuild_with_parallel_workers_is_byte_identical_and_overwrite_keeps_other_files(
        builds, corpus):
    _, _, beam_dir, first = builds
    before = read_bytes(beam_dir)
    notes = os.path.join(beam_dir, "my_notes.txt")
    with open(notes, "w") as f:
        f.write("mine\n")
    config = BuildConfig(corpus_dir=str(corpus), output_dir=beam_dir, vocab_file=REAL_VOCAB,
                         max_seq_length=MAX_SEQ_LENGTH, num_out_files=3, eval_fraction=0.05,
                         seed=11)
    with pytest.raises(BuildError, match="exists and is not empty; pass --overwrite"):
        beam_build.build_dataset_beam(config, "DirectRunner")
    args = ["--direct_num_workers", "2", "--direct_running_mode", "multi_threading"]
    again = beam_build.build_dataset_beam(
        BuildConfig(**dict(config.__dict__, overwrite=True)), "DirectRunner", args)
    after = read_bytes(beam_dir)
    assert after.pop("my_notes.txt") == b"mine\n"
    assert after == before
    assert again["runner"]["pipeline_args"] == args
    assert again["counts"] == first["counts"] and again["splits"] == first["splits"]


def openwebtext_archive(path, documents):
    with tarfile.open(path, "w:xz") as tar:
        for i, doc in enumerate(documents):
            data = "\n\n".join(doc).encode("utf-8")  # blank lines are not breaks here
            info = tarfile.TarInfo(f"urlsf_subset00-{i}_data/{i:04d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_openwebtext_archives_and_json_lines_match_the_local_builder(tmp_path):
    sources = list(real_documents(per_source=15).values())
    owt = tmp_path / "owt"
    owt.mkdir()
    openwebtext_archive(owt / "urlsf_subset00-1_data.xz", sources[0])
    openwebtext_archive(owt / "urlsf_subset00-2_data.xz", sources[1])
    built = build_both(owt, tmp_path / "owt_out", input_format="openwebtext")
    assert_same_dataset(*built)
    assert built[3]["counts"]["documents"] == len(sources[0]) + len(sources[1])

    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    rows = [json.dumps({"body": "\n".join(doc)}) for doc in sources[2]]
    rows[3] = json.dumps({"title": "no body here"})  # counted skip, as in the local builder
    rows[5] = "{not json"
    (jsonl / "dump.jsonl.gz").write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    built = build_both(jsonl, tmp_path / "jsonl_out", input_format="jsonl",
                       jsonl_text_field="body")
    assert_same_dataset(*built)
    problems = {p["problem"]: p["first"] for p in built[3]["input_problems"]}
    assert problems == {"missing_text_field": "line 4", "invalid_json": "line 6"}
    assert built[3]["counts"]["skipped_documents"] == 2


def test_bad_input_error_is_the_local_builders_one_line_and_leaves_nothing(tmp_path):
    corpus = tmp_path / "jsonl"
    corpus.mkdir()
    rows = [json.dumps({"text": "hello world."}), json.dumps({"title": "x"})]
    (corpus / "d.jsonl").write_text("\n".join(rows) + "\n")
    settings = dict(vocab_file=REAL_VOCAB, max_seq_length=MAX_SEQ_LENGTH,
                    input_format="jsonl", bad_input="error")
    with pytest.raises(BuildError) as local:
        build_dataset(BuildConfig(corpus_dir=str(corpus), output_dir=str(tmp_path / "local"),
                                  **settings))
    out = tmp_path / "beam"
    with pytest.raises(BuildError) as on_beam:
        beam_build.build_dataset_beam(BuildConfig(corpus_dir=str(corpus), output_dir=str(out),
                                                  **settings), "DirectRunner")
    assert str(on_beam.value) == str(local.value)
    assert "d.jsonl: missing_text_field at line 2" in str(on_beam.value)
    assert "\n" not in str(on_beam.value) and "while running" not in str(on_beam.value)
    assert not out.exists()  # the dir it created, with its temporaries, is gone


def test_tokenizer_is_built_once_per_worker_not_per_file(tmp_path, monkeypatch):
    from electra_tf.data.text import tokenization

    built = []
    original = tokenization.Tokenizer.__init__

    def counting_init(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(tokenization.Tokenizer, "__init__", counting_init)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"f{i}.txt").write_text(f"hello world number {i}.\nand again.\n")
    manifest = beam_build.build_dataset_beam(BuildConfig(
        corpus_dir=str(corpus), output_dir=str(tmp_path / "out"), vocab_file=REAL_VOCAB,
        max_seq_length=MAX_SEQ_LENGTH, eval_fraction=0), "DirectRunner")
    assert manifest["counts"]["files"] == 8
    assert len(built) == 1  # one DirectRunner worker: one DoFn instance, one tokenizer


class _ElsewhereFileSystem(LocalFileSystem):
    """A Beam filesystem under its own scheme (elsewhere:///abs/path -> /abs/path), standing in
    for gs:// or hdfs://: corpus URLs are listed and read through Beam's FileSystems."""

    @classmethod
    def scheme(cls):
        return "elsewhere"

    @staticmethod
    def _local(path):
        return path[len("elsewhere://"):] if path.startswith("elsewhere://") else path

    def match(self, patterns, limits=None):
        results = super().match([self._local(p) for p in patterns], limits)
        for result in results:
            for metadata in result.metadata_list:
                metadata.path = "elsewhere://" + metadata.path
        return results

    def open(self, path, *args, **kwargs):
        return super().open(self._local(path), *args, **kwargs)


def test_corpus_url_is_listed_and_read_through_beam_filesystems(builds, corpus, tmp_path):
    local_dir, local = builds[0], builds[1]
    config = BuildConfig(corpus_dir="elsewhere://" + str(corpus), output_dir=str(tmp_path / "o"),
                         vocab_file=REAL_VOCAB, max_seq_length=MAX_SEQ_LENGTH, num_out_files=3,
                         eval_fraction=0.05, seed=11)
    assert [f.relpath for f in beam_build.list_files(config.corpus_dir)] == [
        f.relpath for f in list_corpus_files(str(corpus))]
    on_beam = beam_build.build_dataset_beam(config, "DirectRunner")
    assert_same_dataset(local_dir, local, str(tmp_path / "o"), on_beam)


@pytest.mark.slow
def test_beam_shards_train_with_run_pretraining(builds, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(builds[2], data_dir / "pretrain_tfrecords")
    shutil.copy(REAL_VOCAB, data_dir / "vocab.txt")
    hparams = fx.tiny_hparams(vocab_size=30522, max_seq_length=MAX_SEQ_LENGTH,
                              num_train_steps=3, iterations_per_loop=3, do_eval=True,
                              num_eval_steps=1)
    result = subprocess.run(fx.run_pretraining_command(str(data_dir), "beam_tiny", hparams),
                            capture_output=True, text=True, env=fx.subprocess_env(),
                            cwd=fx.REPO_ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert fx.final_fingerprint(result.stdout + result.stderr)[0] == 3
    results = (data_dir / "models" / "beam_tiny" / "eval_results.txt").read_text()
    assert "loss" in results


@pytest.mark.slow
def test_learn_vocab_then_build_matches_the_local_builder(tmp_path):
    pytest.importorskip("electra_tf.data.text.vocab_learning")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, documents in zip(("a.txt", "b.txt"), real_documents(per_source=8).values()):
        (corpus / name).write_bytes(as_text(documents))
    built = {}
    for engine in ("local", "beam"):
        config = BuildConfig(corpus_dir=str(corpus), learn_vocab=400,
                             vocab_file=str(tmp_path / engine / "vocab.txt"),
                             output_dir=str(tmp_path / engine / "pretrain_tfrecords"),
                             max_seq_length=MAX_SEQ_LENGTH, num_out_files=2, seed=5)
        built[engine] = (build_dataset(config) if engine == "local"
                         else beam_build.build_dataset_beam(config, "DirectRunner"))
    assert built["beam"]["vocab"]["learned"] is True
    assert built["beam"]["vocab"]["sha256"] == built["local"]["vocab"]["sha256"]
    assert built["beam"]["vocab"]["size"] == 400
    assert read_bytes(tmp_path / "beam" / "pretrain_tfrecords") == read_bytes(
        tmp_path / "local" / "pretrain_tfrecords")

    def data_keys(manifest):  # each engine learned into its own vocab file
        return {k: dict(v, path=None) if k == "vocab" else v for k, v in manifest.items()
                if k not in RUN_KEYS}

    assert data_keys(built["beam"]) == data_keys(built["local"])
    with pytest.raises(BuildError, match="--learn-vocab reads uncompressed plain-text"):
        (corpus / "c.txt.gz").write_bytes(gzip.compress(b"more text.\n"))
        beam_build.build_dataset_beam(BuildConfig(
            corpus_dir=str(corpus), learn_vocab=400, vocab_file=str(tmp_path / "v2.txt"),
            output_dir=str(tmp_path / "o2")), "DirectRunner")


def test_worker_errors_reported_as_text_by_a_remote_runner_become_one_line():
    # Dataflow reports a worker's exception as its traceback's text, not as the exception.
    remote = RuntimeError(
        "Dataflow pipeline failed. State: FAILED, Error:\nTraceback (most recent call last):\n"
        '  File "apache_beam/runners/common.py", line 1498, in process\n'
        "electra_tf.errors.BuildError: bad input in gs://b/c/d.jsonl: "
        "missing_text_field at line 2 [while running 'PackFiles']\n")
    assert beam_runner.user_error(remote) == (
        "bad input in gs://b/c/d.jsonl: missing_text_field at line 2")
    try:  # in-process runners re-raise the worker's exception (or chain it)
        try:
            raise BuildError("bad input in x.txt: damaged_stream [while running 'PackFiles']")
        except BuildError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        assert beam_runner.user_error(e) == "bad input in x.txt: damaged_stream"
    assert beam_runner.user_error(RuntimeError("KeyError: 'split'")) is None  # a bug: re-raised


def test_counters_that_disagree_with_the_per_file_results_are_warned_about(builds, caplog):
    from apache_beam.metrics.execution import MetricKey, MetricResult
    from apache_beam.metrics.metricbase import MetricName

    from electra_tf.data.build.beam_pipeline import COUNTER_NAMESPACE

    on_beam = builds[3]
    values = dict(on_beam["runner"]["counters"]["values"], tokens=1)  # one counter off

    class Result:
        def metrics(self):
            class Query:
                def query(self, _filter):
                    return {"counters": [
                        MetricResult(MetricKey("PackFiles", MetricName(COUNTER_NAMESPACE, k)),
                                     v, v) for k, v in values.items()]}
            return Query()

    counts, splits = on_beam["counts"], on_beam["splits"]
    totals = SimpleNamespace(  # what BuildTotals holds of these counts
        read=SimpleNamespace(bytes_read=counts["corpus_bytes"]),
        pack=SimpleNamespace(tokenized_tokens=counts["tokenized_tokens"], splits={
            split: SimpleNamespace(examples=splits[split]["examples"]) for split in splits}),
        num_problems=counts["input_problems"])
    with caplog.at_level("WARNING", logger="electra_tf.data.build.beam_build"):
        entry = beam_runner.runner_entry(beam, "DirectRunner", [], Result(), totals,
                                         counts["files"])
    assert entry["counters"] == {"kind": "committed", "values": dict(sorted(values.items()))}
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [f"Beam counter tokens = 1, but the per-file results count "
                      f"{counts['tokenized_tokens']}"]


def test_learn_spm_then_build_matches_the_local_builder(tmp_path):
    pytest.importorskip("sentencepiece")
    from tests.spm_fixtures import write_corpus

    corpus = tmp_path / "corpus"
    write_corpus(str(corpus), lines=300)
    built = {}
    for engine in ("local", "beam"):
        config = BuildConfig(corpus_dir=str(corpus), learn_spm=150,
                             spm_model=str(tmp_path / engine / "spm.model"),
                             output_dir=str(tmp_path / engine / "pretrain_tfrecords"),
                             max_seq_length=MAX_SEQ_LENGTH, num_out_files=2, seed=5)
        built[engine] = (build_dataset(config) if engine == "local"
                         else beam_build.build_dataset_beam(config, "DirectRunner"))
    assert built["beam"]["vocab"]["kind"] == "sentencepiece"
    assert built["beam"]["vocab"]["sha256"] == built["local"]["vocab"]["sha256"]
    assert read_bytes(tmp_path / "beam" / "pretrain_tfrecords") == read_bytes(
        tmp_path / "local" / "pretrain_tfrecords")
