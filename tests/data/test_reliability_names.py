"""File names that are not valid UTF-8 (`caf\\xe9.txt`, a Latin-1 name on a Linux disk) and names
with control characters, as real files: the builder hashes them as bytes for its per-file
seeds and shows them escaped in every message, manifest entry and inputs.jsonl line."""

import json
import os
import subprocess
import sys

import pytest

from electra_tf.data.build import build_config, builder as builder_lib
from electra_tf.data.text.corpus import CorpusError, list_corpus_files
from electra_tf.errors import BuildError, shown_path
from tests.pretraining_fixtures import REPO_ROOT, subprocess_env

LATIN1 = b"caf\xe9.txt"  # "café.txt" in Latin-1: not UTF-8
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "hello", "world", "again", "cafe"]


def _corpus(tmp_path, bad_content=False):
    corpus = os.fsencode(str(tmp_path / "corpus"))
    os.makedirs(corpus)
    text = b"hello world.\nhello again.\n\nworld hello.\n"
    with open(os.path.join(corpus, LATIN1), "wb") as f:
        f.write(text + (b"cafe \xff\xfe world.\n" if bad_content else b""))
    with open(os.path.join(corpus, b"tab\there.txt"), "wb") as f:
        f.write(text)
    with open(os.path.join(corpus, b"ok.txt"), "wb") as f:
        f.write(text)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    return os.fsdecode(corpus), str(vocab)


def test_shown_path_escapes_bytes_and_control_characters():
    assert shown_path(os.fsdecode(LATIN1)) == "caf\\xe9.txt"
    assert shown_path(b"a\nb") == "a\\nb"
    assert shown_path("café ✓.txt") == "café ✓.txt"  # valid UTF-8 stays as it is


def test_build_with_non_utf8_file_names(tmp_path):
    corpus, vocab = _corpus(tmp_path, bad_content=True)
    files = [f.relpath for f in list_corpus_files(corpus)]
    assert os.fsdecode(LATIN1) in files  # listed with surrogate escapes, as Python hands it
    out = str(tmp_path / "out")
    manifest = builder_lib.build_dataset(build_config.BuildConfig(
        corpus_dir=corpus, vocab_file=vocab, output_dir=out, max_seq_length=16,
        eval_fraction=0.0, num_out_files=1, progress_interval=1e9))
    assert manifest["counts"]["files"] == 3
    with open(os.path.join(out, "inputs.jsonl"), encoding="utf-8") as f:
        entries = [json.loads(line) for line in f]
    names = [entry["file"] for entry in entries]
    assert names == [shown_path(n) for n in files]
    assert "caf\\xe9.txt" in names and "tab\\there.txt" in names
    latin = entries[names.index("caf\\xe9.txt")]
    assert latin["examples"]["train"] > 0
    assert latin["problems"][0]["problem"] == "invalid_utf8"
    assert manifest["input_problems"][0]["file"] == "caf\\xe9.txt"
    # The per-file seed hashes the name's bytes: the same text under two names packs with two
    # different seeds, and a rebuild is byte-identical.
    again = str(tmp_path / "again")
    builder_lib.build_dataset(build_config.BuildConfig(
        corpus_dir=corpus, vocab_file=vocab, output_dir=again, max_seq_length=16,
        eval_fraction=0.0, num_out_files=1, progress_interval=1e9))
    shard = "pretrain_data.tfrecord-0-of-1"
    assert open(os.path.join(out, shard), "rb").read() == open(os.path.join(again, shard), "rb").read()


def test_bad_input_error_names_the_file_escaped_on_one_line(tmp_path):
    corpus, vocab = _corpus(tmp_path, bad_content=True)
    result = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "build_pretraining_dataset.py"), "--corpus-dir",
         corpus, "--vocab-file", vocab, "--output-dir", str(tmp_path / "out"),
         "--max-seq-length", "16", "--bad-input", "error"],
        capture_output=True, env=subprocess_env(), cwd=REPO_ROOT, timeout=300)
    stderr = result.stderr.decode("utf-8")  # printable: nothing undecodable reaches the terminal
    errors = [line for line in stderr.splitlines()
              if line.startswith("build_pretraining_dataset.py: error:")]
    assert result.returncode == 2 and "Traceback" not in stderr, stderr
    assert len(errors) == 1 and "caf\\xe9.txt: invalid_utf8 at line 5" in errors[0], stderr


def test_unreadable_entry_with_a_non_utf8_name_is_named_escaped(tmp_path):
    corpus = os.fsencode(str(tmp_path / "corpus"))
    os.makedirs(corpus)
    os.symlink(b"/nonexistent/target", os.path.join(corpus, b"\xff-link.txt"))
    with pytest.raises(CorpusError, match=r"cannot read corpus file .*/\\xff-link\.txt"):
        list_corpus_files(os.fsdecode(corpus))


def test_output_dir_that_tensorflow_cannot_name_is_refused(tmp_path):
    corpus, vocab = _corpus(tmp_path)
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xe9")
    with pytest.raises(BuildError, match=r"out\\xe9: TensorFlow writes and reads "
                                         r"only file names that are valid UTF-8"):
        builder_lib.build_dataset(build_config.BuildConfig(corpus_dir=corpus, vocab_file=vocab,
                                                          output_dir=out))
    assert not os.path.exists(out)
