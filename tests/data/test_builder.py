"""The dataset builder end to end (library level): shards, manifest, determinism, split, safety."""

import collections
import dataclasses
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.build import build_plan, builder as builder_lib
from electra_tf.data.build.build_config import BuildConfig
from electra_tf.data.build.builder import build_dataset
from electra_tf.data.build.packing import derive_seed
from electra_tf.data.build.split import document_key
from electra_tf.data.records.tfrecord_io import (FEATURE_NAMES, parse_example, read_manifest,
                                                 shard_paths)
from electra_tf.data.text.corpus import CorpusError
from electra_tf.errors import BuildError
from electra_tf.vocab import load_vocab
from tests.pretraining_fixtures import REPO_ROOT

REAL_VOCAB = os.path.join(REPO_ROOT, "pretrain_data", "vocab.txt")
REAL_CORPUS = os.path.join(REPO_ROOT, "pretrain_data", "corpus")
NUM_WORDS = 2000
# Special tokens deliberately not at BERT's ids: the builder must look them up, not assume them.
SPECIALS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(path):
    tokens = SPECIALS + [".", ","] + [f"w{i}" for i in range(NUM_WORDS)]
    path.write_text("\n".join(tokens) + "\n")
    return str(path)


@pytest.fixture
def vocab_file(tmp_path):
    return write_vocab(tmp_path / "vocab.txt")


def ids_of(words):
    return [len(SPECIALS) + 2 + int(w[1:]) for w in words]


def write_corpus(directory, docs_per_file, seed=0, words_per_line=(1, 12), lines_per_doc=(1, 6)):
    """Writes files of blank-line separated documents of 'wN' words; returns their documents."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    documents = {}
    for f, num_docs in enumerate(docs_per_file):
        docs = []
        for _ in range(num_docs):
            docs.append([[f"w{rng.randrange(NUM_WORDS)}"
                          for _ in range(rng.randint(*words_per_line))]
                         for _ in range(rng.randint(*lines_per_doc))])
        name = f"part{f:02d}.txt"
        text = "\n\n".join("\n".join(" ".join(line) for line in doc) for doc in docs)
        (directory / name).write_text(text + "\n")
        documents[name] = docs
    return documents


def build(tmp_path, vocab_file, corpus_dir, out_name="out", **kwargs):
    kwargs.setdefault("max_seq_length", 32)
    config = BuildConfig(corpus_dir=str(corpus_dir), vocab_file=vocab_file,
                         output_dir=str(tmp_path / out_name), **kwargs)
    return build_dataset(config), str(tmp_path / out_name)


def read_split(output_dir, split="train"):
    """All examples of a split as (input_ids, input_mask, segment_ids) tuples of ints."""
    manifest = read_manifest(output_dir)
    paths = shard_paths(manifest, output_dir, split)
    if not paths:
        return []
    L = manifest["max_seq_length"]
    examples = []
    for batch in tf.data.TFRecordDataset(paths).batch(256).map(lambda s: parse_example(s, L)):
        arrays = [batch[name].numpy() for name in FEATURE_NAMES]
        examples += [tuple(tuple(a[i].tolist()) for a in arrays) for i in range(len(arrays[0]))]
    return examples


def check_example_structure(example, cls_id, sep_id, L):
    ids, mask, segments = example
    n = sum(mask)
    assert len(ids) == L and mask == (1,) * n + (0,) * (L - n)
    assert ids[0] == cls_id and ids[n - 1] == sep_id and ids[n:] == (0,) * (L - n)
    seps = [i for i in range(n) if ids[i] == sep_id]
    assert seps[-1] == n - 1 and len(seps) in (1, 2)
    first_sep = seps[0]
    assert segments == (0,) * (first_sep + 1) + (1,) * (n - first_sep - 1) + (0,) * (L - n)
    assert first_sep >= 2  # the first segment is never empty


def test_round_trip_structure_and_manifest(tmp_path, vocab_file):
    documents = write_corpus(tmp_path / "corpus", [40, 25, 10])
    (tmp_path / "corpus" / "unk.txt").write_text("w1 zzz w2 zzz\n\nqqq.\n")
    manifest, out = build(tmp_path, vocab_file, tmp_path / "corpus", eval_fraction=0.2, seed=3,
                          num_out_files=3, command="python build_pretraining_dataset.py --x")
    vocab = load_vocab(vocab_file)
    L = 32
    train, evals = read_split(out, "train"), read_split(out, "eval")
    for ex in train + evals:
        check_example_structure(ex, vocab.special.cls_id, vocab.special.sep_id, L)

    assert manifest == read_manifest(out)
    assert manifest["vocab"] == {"path": vocab_file, "sha256": vocab.sha256, "size": vocab.size,
                                 "kind": "wordpiece", "learned": False, "special_ids": vocab.special._asdict()}
    for key, value in {"max_seq_length": L, "do_lower_case": True, "strip_accents": True,
                       "blanks_separate_docs": True, "seed": 3, "eval_fraction": 0.2}.items():
        assert manifest[key] == value
    assert manifest["features"] == {name: ["int64", L] for name in FEATURE_NAMES}
    counts = manifest["counts"]
    num_docs = sum(len(d) for d in documents.values()) + 2
    num_sentences = sum(len(doc) for d in documents.values() for doc in d) + 2
    assert counts["files"] == 4
    assert counts["documents"] == num_docs
    assert counts["sentences"] == num_sentences
    assert counts["tokenized_tokens"] == sum(
        len(line) for d in documents.values() for doc in d for line in doc) + 6
    assert counts["unk_tokens"] == 3 and counts["unk_rate"] == 3 / counts["tokenized_tokens"]
    for split, examples in (("train", train), ("eval", evals)):
        entry = manifest["splits"][split]
        assert entry["examples"] == len(examples) > 0
        assert sum(s["examples"] for s in entry["shards"]) == len(examples)
        assert entry["tokens"] == sum(sum(mask) for _, mask, _ in examples)
        assert entry["single_segment"] == sum(1 for ids, *_ in examples
                                              if ids.count(vocab.special.sep_id) == 1)
        for shard in entry["shards"]:
            assert os.path.getsize(os.path.join(out, shard["file"])) == shard["bytes"]
    assert [s["file"] for s in manifest["splits"]["train"]["shards"]] == [
        f"pretrain_data.tfrecord-{i}-of-3" for i in range(3)]
    assert counts["examples"] == len(train) + len(evals)
    single = sum(manifest["splits"][s]["single_segment"] for s in ("train", "eval"))
    assert counts["example_tokens"] == (counts["tokenized_tokens"] - counts["truncated_tokens"]
                                        + 3 * counts["examples"] - single)
    hist = manifest["length_histogram"]
    assert hist["bucket_width"] == 8 and len(hist["counts"]) == 4
    assert sum(hist["counts"]) == counts["examples"]
    lengths = collections.Counter((sum(mask) - 1) // 8 for _, mask, _ in train + evals)
    assert hist["counts"] == [lengths[i] for i in range(4)]
    assert manifest["single_segment_fraction"] == pytest.approx(single / counts["examples"])
    assert manifest["command"] == "python build_pretraining_dataset.py --x"
    assert set(manifest["versions"]) == {"python", "tensorflow", "tensorflow-text", "electra_tf"}
    assert manifest["versions"]["tensorflow"] == tf.__version__
    assert manifest["elapsed_seconds"] > 0 and manifest["throughput"]["tokens_per_second"] > 0
    assert manifest["started_at"] <= manifest["finished_at"]
    assert manifest["input_format"] == "text" and manifest["input_problems"] == []
    assert manifest["shuffle"]["method"] == "global"
    # inputs.jsonl: one line per input file, in path order, adding up to the manifest's counts.
    inputs = [json.loads(line) for line in open(os.path.join(out, "inputs.jsonl"))]
    assert [e["file"] for e in inputs] == ["part00.txt", "part01.txt", "part02.txt", "unk.txt"]
    assert sum(e["documents"] for e in inputs) == counts["documents"]
    for split in ("train", "eval"):
        assert sum(e["examples"][split] for e in inputs) == manifest["splits"][split]["examples"]
    assert sum(e["bytes"] for e in inputs) == counts["corpus_bytes"]
    # Only the dataset's own files, no temporaries left behind.
    assert sorted(os.listdir(out)) == sorted(
        ["manifest.json", "inputs.jsonl"] + [s["file"] for split in ("train", "eval")
                                             for s in manifest["splits"][split]["shards"]])


def _doc_examples(examples, cls_id, sep_id):
    out = []
    for ids, mask, _ in examples:
        n = sum(mask)
        assert ids[n - 1] == sep_id and ids.count(sep_id) == 1
        out.append(list(ids[1:n - 1]))
    return out


@pytest.mark.parametrize("blanks_separate_docs", [True, False])
def test_documents_and_files_bound_examples(tmp_path, vocab_file, blanks_separate_docs):
    # Short documents (< 62 tokens, the first-segment target at 128) each become exactly one
    # single-segment example holding the whole document: a blank line and every file end
    # flush the buffer. Without blanks_separate_docs, blank lines are skipped and each file
    # (total < 128 tokens) is one example.
    documents = write_corpus(tmp_path / "corpus", [6, 4, 5], words_per_line=(1, 3),
                             lines_per_doc=(1, 3))
    manifest, out = build(tmp_path, vocab_file, tmp_path / "corpus", max_seq_length=128,
                          eval_fraction=0.0, blanks_separate_docs=blanks_separate_docs)
    vocab = load_vocab(vocab_file)
    got = sorted(_doc_examples(read_split(out), vocab.special.cls_id, vocab.special.sep_id))
    if blanks_separate_docs:
        expected = [ids_of([w for line in doc for w in line])
                    for d in documents.values() for doc in d]
    else:
        expected = [ids_of([w for doc in d for line in doc for w in line])
                    for d in documents.values()]
    assert got == sorted(expected)
    assert manifest["counts"]["documents"] == len(expected)
    assert manifest["splits"]["eval"]["shards"] == []


def test_examples_are_the_per_file_packing_in_global_shuffle_key_order(tmp_path, vocab_file):
    # Each file is packed by a fresh ExampleBuilder seeded from (seed, relative path); the
    # examples are then ordered by their shuffle key (seed, split, file, index in the file) and
    # cut into shards by key range: reading the shards in order gives every example once, in
    # key order.
    from electra_tf.data.build.example_builder import ExampleBuilder
    from electra_tf.data.build.shuffle import shard_of, shuffle_key
    from electra_tf.data.text.tokenization import Tokenizer

    documents = write_corpus(tmp_path / "corpus", [30, 20, 25], seed=5)
    manifest, out = build(tmp_path, vocab_file, tmp_path / "corpus", eval_fraction=0.0, seed=9,
                          num_out_files=3)
    vocab = load_vocab(vocab_file)
    tokenizer = Tokenizer(vocab)
    cls_id, sep_id = vocab.special.cls_id, vocab.special.sep_id
    keyed = []
    for name in sorted(documents):
        packer = ExampleBuilder(32, random.Random(derive_seed(9, "pack", "train", name)))
        examples = []
        for doc in documents[name]:
            for line in doc:
                examples.append(packer.add_sentence(tokenizer.encode(" ".join(line))))
            examples.append(packer.end_document())
        for index, e in enumerate(e for e in examples if e):
            ids = tuple([cls_id] + e.first_segment + [sep_id]
                        + (e.second_segment + [sep_id] if e.second_segment else []))
            keyed.append((shuffle_key(9, "train", name, index), ids, name))
    keyed.sort()
    paths = shard_paths(manifest, out)
    assert len(paths) == 3
    for shard, path in enumerate(paths):
        got = [tuple(b["input_ids"].numpy()[b["input_mask"].numpy() == 1])
               for b in tf.data.TFRecordDataset(path).map(lambda s: parse_example(s, 32))]
        assert got == [ids for key, ids, _ in keyed if shard_of(key, 3) == shard]
    # The global order is not the corpus order: neighbours come from any file (a random order of
    # 3 files of 25-35 examples changes file about 2/3 of the time; corpus order twice).
    changes = sum(a[2] != b[2] for a, b in zip(keyed, keyed[1:]))
    assert changes > len(keyed) / 3


def test_same_inputs_give_byte_identical_shards(tmp_path, vocab_file):
    write_corpus(tmp_path / "corpus", [30, 30, 10], seed=1)
    m1, out1 = build(tmp_path, vocab_file, tmp_path / "corpus", "a", eval_fraction=0.1)
    m2, out2 = build(tmp_path, vocab_file, tmp_path / "corpus", "b", eval_fraction=0.1)
    m3, out3 = build(tmp_path, vocab_file, tmp_path / "corpus", "c", eval_fraction=0.1, seed=1)
    names = sorted(os.listdir(out1))
    assert names == sorted(os.listdir(out2))
    for name in names:
        if name != "manifest.json":
            with open(os.path.join(out1, name), "rb") as f1:
                with open(os.path.join(out2, name), "rb") as f2:
                    assert f1.read() == f2.read(), name
    volatile = {"started_at", "finished_at", "elapsed_seconds", "throughput", "phase_seconds"}
    assert {k: v for k, v in m1.items() if k not in volatile} == \
        {k: v for k, v in m2.items() if k not in volatile}
    assert sorted(read_split(out1)) != sorted(read_split(out3))  # another seed, other packing


@pytest.mark.slow
def test_two_processes_give_byte_identical_shards(tmp_path, vocab_file):
    write_corpus(tmp_path / "corpus", [30, 5, 25, 12, 8], seed=2)
    m1, out1 = build(tmp_path, vocab_file, tmp_path / "corpus", "n1", eval_fraction=0.2,
                     num_out_files=4)
    m2, out2 = build(tmp_path, vocab_file, tmp_path / "corpus", "n2", eval_fraction=0.2,
                     num_processes=2, num_out_files=4, shuffle_memory_mb=1)
    assert m1["num_processes"] == 1 and m2["num_processes"] == 2
    assert len(read_split(out1, "eval")) > 0
    names = sorted(os.listdir(out1))
    assert names == sorted(os.listdir(out2))
    for name in names:
        if name != "manifest.json":  # shards and inputs.jsonl
            with open(os.path.join(out1, name), "rb") as f1:
                with open(os.path.join(out2, name), "rb") as f2:
                    assert f1.read() == f2.read(), name
    assert m1["splits"] == m2["splits"] and m1["counts"] == m2["counts"]
    assert m1["length_histogram"] == m2["length_histogram"]


def test_eval_split_is_disjoint_by_document_and_near_the_fraction(tmp_path, vocab_file):
    # 1000 one-line documents, each with its own marker word w{i}.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(2):
        (corpus / f"f{f}.txt").write_text("\n\n".join(
            f"w{i} w{i} w{i}" for i in range(f * 500, (f + 1) * 500)) + "\n")
    manifest, out = build(tmp_path, vocab_file, corpus, max_seq_length=64, eval_fraction=0.2)
    base = len(SPECIALS) + 2

    def markers(examples):
        return {i - base for ids, mask, _ in examples for i in ids[1:sum(mask) - 1]}

    train, evals = markers(read_split(out, "train")), markers(read_split(out, "eval"))
    assert not train & evals
    assert train | evals == set(range(1000))
    assert manifest["splits"]["eval"]["documents"] == len(evals)
    # Equal documents of 3 tokens: the 200 with the smallest content keys hold 20% exactly.
    keys = sorted((document_key([f"w{i} w{i} w{i}"]), i) for i in range(1000))
    assert evals == {i for _, i in keys[:200]}
    assert manifest["eval_split"]["token_fraction"] == 0.2
    assert [s["file"] for s in manifest["splits"]["eval"]["shards"]] == [
        "eval_data.tfrecord-0-of-1"]


def test_refuses_existing_output_and_overwrites_only_its_own_files(tmp_path, vocab_file):
    write_corpus(tmp_path / "corpus", [40, 40], seed=4)
    m1, out = build(tmp_path, vocab_file, tmp_path / "corpus", num_out_files=6, eval_fraction=0.3)
    assert len(m1["splits"]["train"]["shards"]) == 6
    (tmp_path / "out" / "notes.txt").write_text("mine")
    before = {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)}
    with pytest.raises(BuildError, match="output dir .*out exists and is not empty; pass "
                                         "--overwrite"):
        build(tmp_path, vocab_file, tmp_path / "corpus", num_out_files=2)
    assert {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)} == before
    m2, out = build(tmp_path, vocab_file, tmp_path / "corpus", num_out_files=2, eval_fraction=0.0,
                    overwrite=True)
    assert sorted(os.listdir(out)) == ["inputs.jsonl", "manifest.json", "notes.txt",
                                       "pretrain_data.tfrecord-0-of-2",
                                       "pretrain_data.tfrecord-1-of-2"]
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    assert read_manifest(out) == m2


def test_a_small_corpus_never_yields_empty_shards(tmp_path, vocab_file):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "tiny.txt").write_text("w1 w2\n\nw3\n\nw4 w5 w6\n")
    manifest, out = build(tmp_path, vocab_file, corpus, num_out_files=10, eval_fraction=0.0)
    shards = manifest["splits"]["train"]["shards"]
    n = len(shards)
    assert 1 <= n <= 3
    assert [s["file"] for s in shards] == [f"pretrain_data.tfrecord-{i}-of-{n}" for i in range(n)]
    assert all(s["examples"] > 0 for s in shards) and sum(s["examples"] for s in shards) == 3
    assert sorted(os.listdir(out)) == sorted(["manifest.json", "inputs.jsonl"]
                                             + [s["file"] for s in shards])
    assert manifest["num_out_files_requested"] == 10
    assert build_plan.default_num_out_files(100) == 4
    assert build_plan.default_num_out_files(100 << 20) == 13
    assert build_plan.default_num_out_files(100 << 30) == 1000


def test_warns_when_no_document_is_held_out(tmp_path, vocab_file, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "one.txt").write_text("w1 w2 w3\n")  # one document: train keeps it
    with caplog.at_level(logging.INFO, logger=builder_lib.__name__):
        manifest, _ = build(tmp_path, vocab_file, corpus, eval_fraction=0.01)
    assert manifest["splits"]["eval"]["shards"] == []
    assert any("no document was held out for eval" in r.getMessage() for r in caplog.records)


def test_junk_input_is_decoded_counted_and_completes(tmp_path, vocab_file, monkeypatch):
    monkeypatch.setattr("electra_tf.data.text.corpus.MAX_LINE_BYTES", 1 << 16)  # keeps the test quick
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "bom_crlf.txt").write_bytes(b"\xef\xbb\xbfw1 w2\r\nw3\r\n\r\nw4\r\n")
    (corpus / "bad_utf8.txt").write_bytes(b"w5 \xff\xfe w6\nw7\x00w8\n")
    (corpus / "binary.bin").write_bytes(bytes(random.Random(0).randrange(256) for _ in range(5000)))
    (corpus / "long_line.txt").write_bytes(b"w9 " * 100000 + b"w10")  # 300 kB, no newline
    manifest, out = build(tmp_path, vocab_file, corpus, eval_fraction=0.0)
    counts = manifest["counts"]
    assert counts["bom_files"] == 1
    assert counts["crlf_line_ends"] == 4
    assert counts["nul_bytes"] >= 1
    assert counts["undecodable_bytes"] >= 2
    assert counts["lines_split"] == 1
    assert manifest["splits"]["train"]["examples"] > 0


def test_a_line_far_longer_than_an_example_is_split_and_warned_about(tmp_path, vocab_file,
                                                                       caplog):
    """A 3 MB line (the real MAX_LINE_BYTES of 1 MiB): split into 3 pieces, and a warning names
    the file and says how much of it was dropped (not only a count in the manifest)."""
    corpus = tmp_path / "corpus"
    write_corpus(corpus, [20])
    (corpus / "zz_one_line.txt").write_bytes(b"w9 w10 " * 430_000 + b"w11\n")  # 3.0 MB
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        manifest, out = build(tmp_path, vocab_file, corpus, eval_fraction=0.0)
    assert manifest["counts"]["lines_split"] == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert ("1 line(s) longer than 1048576 bytes in 1 file(s) were split into pieces of that "
            "size, but an example holds at most 32 tokens") in warnings[0], warnings[0]
    assert "first: zz_one_line.txt (1 line(s))" in warnings[0], warnings[0]
    assert "(99.9%) were dropped" in warnings[0] or "(100.0%) were dropped" in warnings[0]
    entries = [json.loads(line) for line in open(os.path.join(out, "inputs.jsonl"))]
    long_entry = next(e for e in entries if e["file"] == "zz_one_line.txt")
    assert long_entry["lines_split"] == 1 and long_entry["examples"]["train"] == 3
    assert long_entry["truncated_tokens"] == long_entry["tokens"] - 3 * 30
    assert all("lines_split" not in e for e in entries if e is not long_entry)


def test_mostly_truncated_text_is_warned_about(tmp_path, vocab_file, caplog):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, [10], words_per_line=(200, 300), lines_per_doc=(1, 1))
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        build(tmp_path, vocab_file, corpus, eval_fraction=0.0)
    assert any("were dropped: lines longer than an example (32 tokens) are truncated" in
               r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_no_examples_is_an_error_and_leaves_nothing_behind(tmp_path, vocab_file):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "blank.txt").write_text("\n   \n\t\n")
    with pytest.raises(BuildError, match="no training examples"):
        build(tmp_path, vocab_file, corpus)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides,message", [
    ({"max_seq_length": 7}, "--max-seq-length must be between 8"),
    ({"num_processes": 0}, "--num-processes must be >= 1"),
    ({"num_out_files": 0}, "--num-out-files must be >= 1"),
    ({"eval_fraction": 1.0}, r"--eval-fraction must be in \[0, 1\)"),
    ({"seed": -1}, "--seed must be >= 0"),
])
def test_bad_settings_are_rejected_before_anything_is_written(tmp_path, vocab_file, overrides,
                                                             message):
    write_corpus(tmp_path / "corpus", [2])
    with pytest.raises(BuildError, match=message):
        build(tmp_path, vocab_file, tmp_path / "corpus", **overrides)
    assert not (tmp_path / "out").exists()


def test_output_inside_corpus_is_rejected(tmp_path, vocab_file):
    write_corpus(tmp_path / "corpus", [2])
    with pytest.raises(BuildError, match="must not be inside --corpus-dir"):
        build_dataset(BuildConfig(corpus_dir=str(tmp_path / "corpus"), vocab_file=vocab_file,
                                  output_dir=str(tmp_path / "corpus" / "out")))


def test_progress_and_summary_are_logged(tmp_path, vocab_file, caplog):
    write_corpus(tmp_path / "corpus", [20, 20])
    with caplog.at_level(logging.INFO, logger="electra_tf.data"):
        build(tmp_path, vocab_file, tmp_path / "corpus", progress_interval=0.0)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("progress: files") and "tokens/s" in m for m in messages)
    assert messages[-1].startswith("done: ") and "train examples" in messages[-1]


def test_default_paths_read_the_default_data_and_never_fetch(tmp_path, monkeypatch):
    # The library reads pretrain_data/; fetching it is the script's step (see the CLI tests).
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CorpusError, match="corpus dir pretrain_data/corpus does not exist"):
        build_dataset(BuildConfig(max_seq_length=32))
    write_corpus(tmp_path / "pretrain_data" / "corpus", [5])
    write_vocab(tmp_path / "pretrain_data" / "vocab.txt")
    manifest = build_dataset(BuildConfig(max_seq_length=32))
    assert manifest["corpus_dir"] == os.path.join("pretrain_data", "corpus")
    assert manifest["vocab"]["path"] == os.path.join("pretrain_data", "vocab.txt")
    assert os.path.isfile(os.path.join("pretrain_data", "pretrain_tfrecords", "manifest.json"))


def test_learn_vocab_writes_beside_output_and_refuses_to_clobber(tmp_path):
    pytest.importorskip("electra_tf.data.text.vocab_learning")
    write_corpus(tmp_path / "corpus", [30, 30])
    config = BuildConfig(corpus_dir=str(tmp_path / "corpus"), learn_vocab=300, max_seq_length=32,
                         output_dir=str(tmp_path / "data" / "pretrain_tfrecords"))
    manifest = build_dataset(config)
    vocab_path = tmp_path / "data" / "vocab.txt"
    assert vocab_path.is_file()
    vocab = load_vocab(str(vocab_path))
    assert manifest["vocab"]["learned"] is True
    assert manifest["vocab"]["sha256"] == vocab.sha256
    assert os.path.abspath(manifest["vocab"]["path"]) == str(vocab_path)
    with pytest.raises(BuildError, match="vocab file .*vocab.txt exists; pass --overwrite"):
        build_dataset(dataclasses.replace(config, output_dir=str(tmp_path / "data" / "other")))


def test_real_vocab_and_corpus(tmp_path):
    if not (os.path.isfile(REAL_VOCAB) and os.path.isdir(REAL_CORPUS) and os.listdir(REAL_CORPUS)):
        pytest.skip("fetched default data absent: run `python pretrain_data/fetch.py`")
    # Two real files (~1 MB): enough for realistic statistics, quick to tokenise.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    names = sorted(os.listdir(REAL_CORPUS))
    picked = ([n for n in names if n.startswith("wiki")][:1]
              + [n for n in names if n.startswith("lee")][:1]) or names[:2]
    for name in picked:
        shutil.copy(os.path.join(REAL_CORPUS, name), corpus / name)
    manifest, out = build(tmp_path, REAL_VOCAB, corpus, max_seq_length=128, eval_fraction=0.05)
    vocab = load_vocab(REAL_VOCAB)
    assert manifest["vocab"]["size"] == 30522
    counts = manifest["counts"]
    assert counts["unk_rate"] < 0.01
    assert counts["undecodable_bytes"] == 0
    train = read_split(out)
    assert len(train) == manifest["splits"]["train"]["examples"] > 100
    for ex in train[:500]:
        check_example_structure(ex, vocab.special.cls_id, vocab.special.sep_id, 128)
    # Full-length examples dominate: short ones come only from document ends and the 5% draw.
    histogram = manifest["length_histogram"]["counts"]
    assert histogram[-1] == max(histogram)
    assert np.mean([sum(mask) for _, mask, _ in train]) > 64
    # About 10% single-segment by the draw, plus short documents and truncation.
    assert 0.08 < manifest["single_segment_fraction"] < 0.6


@pytest.mark.slow
def test_peak_memory_is_bounded_with_a_10mb_line(tmp_path, vocab_file):
    # After a warm-up build (TensorFlow and the tokenizer initialised), a corpus with a 10 MB
    # line and no newline in it must not raise peak RSS by more than a few tens of MB: the line
    # is cut into 1 MiB pieces and tokenised a piece at a time.
    warm, big = tmp_path / "warm", tmp_path / "big"
    write_corpus(warm, [5])
    big.mkdir()
    with open(big / "long.txt", "wb") as f:
        f.write(b"w1 w2 w3.\n" * 1000 + b"x" * (10 << 20) + b"\nw4 w5\n")
    script = textwrap.dedent(f"""
        import os, resource, sys
        sys.path.insert(0, {REPO_ROOT!r})
        from electra_tf.data.build.build_config import BuildConfig
        from electra_tf.data.build.builder import build_dataset
        def run(corpus, out):
            return build_dataset(BuildConfig(corpus_dir=corpus, vocab_file={vocab_file!r},
                                             output_dir=out, max_seq_length=32))
        run({str(warm)!r}, {str(tmp_path / "out_warm")!r})
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        manifest = run({str(big)!r}, {str(tmp_path / "out_big")!r})
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(manifest["counts"]["lines_split"], (peak - base) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert out.returncode == 0, out.stderr[-2000:]
    lines_split, delta_mb = map(int, out.stdout.split()[-2:])
    assert lines_split == 1
    assert delta_mb < 60, f"peak RSS grew by {delta_mb} MB"
