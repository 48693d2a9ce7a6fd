"""`python build_pretraining_dataset.py` as a user runs it: flags, errors, a real build."""

import json
import os
import subprocess
import sys

import pytest

from tests.extras import import_extra
from tests.pretraining_fixtures import REPO_ROOT
SCRIPT = os.path.join(REPO_ROOT, "build_pretraining_dataset.py")
GOOD_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "hello", "world", "again"]


def run_cli(*args, cwd=REPO_ROOT):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    # TensorFlow may log its own lines (e.g. "E0000 ... cuInit"); ours carry the program name.
    errors = [line for line in result.stderr.splitlines()
              if line.startswith("build_pretraining_dataset.py: error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.fixture
def inputs(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world.\nhello again.\n\nworld hello.\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(GOOD_VOCAB) + "\n")
    return {"corpus": str(corpus), "vocab": str(vocab), "out": str(tmp_path / "out"),
            "tmp": tmp_path}


def base_args(inputs, **overrides):
    flags = {"--corpus-dir": inputs["corpus"], "--vocab-file": inputs["vocab"],
             "--output-dir": inputs["out"]}
    flags.update(overrides)
    return [item for key, value in flags.items() for item in (key, value)]


def test_help_documents_every_flag():
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ["--corpus-dir", "--vocab-file", "--output-dir", "--max-seq-length",
                 "--num-processes", "--blanks-separate-docs", "--no-blanks-separate-docs",
                 "--do-lower-case", "--no-lower-case", "--strip-accents", "--no-strip-accents",
                 "--num-out-files", "--seed", "--overwrite", "--eval-fraction", "--learn-vocab",
                 "--input-format", "--jsonl-text-field", "--bad-input", "--shuffle-memory-mb",
                 "--runner", "DirectRunner", "DataflowRunner", "[beam]"]:
        assert flag in result.stdout, flag


def test_missing_corpus_dir(inputs):
    result = run_cli(*base_args(inputs, **{"--corpus-dir": str(inputs["tmp"] / "nope")}))
    assert_one_line_error(result, "corpus dir", "nope", "does not exist")


def test_empty_corpus_dir(inputs):
    (inputs["tmp"] / "empty").mkdir()
    result = run_cli(*base_args(inputs, **{"--corpus-dir": str(inputs["tmp"] / "empty")}))
    assert_one_line_error(result, "empty", "contains no files")


def test_corpus_of_empty_files(inputs):
    (inputs["tmp"] / "zeros").mkdir()
    (inputs["tmp"] / "zeros" / "z.txt").write_text("")
    result = run_cli(*base_args(inputs, **{"--corpus-dir": str(inputs["tmp"] / "zeros")}))
    assert_one_line_error(result, "zeros", "only empty files")


def test_unreadable_corpus_file(inputs):
    # A dangling link is unreadable even for root (chmod 000 is not).
    os.symlink(str(inputs["tmp"] / "gone.txt"), os.path.join(inputs["corpus"], "b.txt"))
    result = run_cli(*base_args(inputs))
    assert_one_line_error(result, "cannot read corpus file", "b.txt")


def test_missing_vocab(inputs):
    result = run_cli(*base_args(inputs, **{"--vocab-file": str(inputs["tmp"] / "no_vocab.txt")}))
    assert_one_line_error(result, "vocab file not found", "no_vocab.txt")


@pytest.mark.parametrize("missing", ["[CLS]", "[SEP]", "[MASK]", "[UNK]"])
def test_vocab_lacking_a_special_token(inputs, missing):
    bad = inputs["tmp"] / "bad_vocab.txt"
    bad.write_text("\n".join(t for t in GOOD_VOCAB if t != missing) + "\n")
    result = run_cli(*base_args(inputs, **{"--vocab-file": str(bad)}))
    assert_one_line_error(result, "bad_vocab.txt", "lacks required special token", missing)


def test_vocab_with_a_utf8_bom_is_named_as_such(inputs):
    """Not "lacks [PAD]": the BOM glued to the first token is what is wrong."""
    bom = inputs["tmp"] / "bom_vocab.txt"
    bom.write_bytes(b"\xef\xbb\xbf" + ("\n".join(GOOD_VOCAB) + "\n").encode())
    result = run_cli(*base_args(inputs, **{"--vocab-file": str(bom)}))
    assert_one_line_error(result, "bom_vocab.txt", "starts with a UTF-8 byte order mark")
    assert "lacks" not in result.stderr


def test_max_seq_length_too_small(inputs):
    result = run_cli(*base_args(inputs, **{"--max-seq-length": "4"}))
    assert_one_line_error(result, "--max-seq-length", "4")


def test_blanks_separate_docs_is_a_real_switch_not_type_bool(inputs):
    # The official `type=bool` flag parsed "False" as True; here a value is rejected by argparse.
    result = run_cli(*base_args(inputs), "--blanks-separate-docs", "False")
    assert result.returncode == 2 and "unrecognized arguments: False" in result.stderr


def test_build_then_refuse_then_overwrite(inputs):
    args = base_args(inputs, **{"--max-seq-length": "16", "--seed": "5", "--eval-fraction": "0"})
    result = run_cli(*args, "--no-blanks-separate-docs", "--num-out-files", "3")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # Log lines are `HH:MM:SS message` (console.setup).
    summary = [line for line in result.stderr.splitlines() if line[9:].startswith("done: ")]
    assert len(summary) == 1 and "train examples" in summary[0]
    manifest = json.load(open(os.path.join(inputs["out"], "manifest.json")))
    assert manifest["blanks_separate_docs"] is False and manifest["seed"] == 5
    assert manifest["max_seq_length"] == 16
    assert "--no-blanks-separate-docs" in manifest["command"]
    assert manifest["counts"]["documents"] == 1  # one file, blank lines skipped
    before = sorted(os.listdir(inputs["out"]))

    result = run_cli(*args)
    assert_one_line_error(result, "output dir", "exists and is not empty", "--overwrite")
    assert sorted(os.listdir(inputs["out"])) == before

    result = run_cli(*args, "--overwrite", "--no-lower-case", "--no-strip-accents")
    assert result.returncode == 0, result.stderr
    manifest = json.load(open(os.path.join(inputs["out"], "manifest.json")))
    assert manifest["do_lower_case"] is False and manifest["strip_accents"] is False
    assert manifest["blanks_separate_docs"] is True and manifest["counts"]["documents"] == 2


def test_learn_vocab_too_small(inputs):
    pytest.importorskip("electra_tf.data.text.vocab_learning")
    result = run_cli("--corpus-dir", inputs["corpus"], "--output-dir", inputs["out"],
                     "--learn-vocab", "3")  # would write <tmp>/vocab.txt, which exists
    assert_one_line_error(result, "vocab.txt exists", "--overwrite")
    learned = str(inputs["tmp"] / "learned.txt")
    result = run_cli("--corpus-dir", inputs["corpus"], "--output-dir", inputs["out"],
                     "--learn-vocab", "3", "--vocab-file", learned)
    assert_one_line_error(result, "--learn-vocab 3")
    assert not os.path.exists(inputs["out"]) and not os.path.exists(learned)


def test_default_paths_fetch_first_when_default_data_missing(tmp_path, monkeypatch):
    # Fetching the default data is the tool's step, before the (library) build.
    from electra_tf.commands import build_dataset as script

    monkeypatch.chdir(tmp_path)
    calls = []

    def fake_fetch(data_dir="pretrain_data", cache_dir=None, overwrite=False):
        calls.append(data_dir)
        corpus = tmp_path / data_dir / "corpus"
        corpus.mkdir(parents=True)
        (corpus / "a.txt").write_text("hello world.\nhello again.\n\nworld hello.\n")
        (tmp_path / data_dir / "vocab.txt").write_text("\n".join(GOOD_VOCAB) + "\n")

    monkeypatch.setattr(script, "default_data_ready", lambda data_dir="pretrain_data": bool(calls))
    monkeypatch.setattr(script, "fetch_default_data", fake_fetch)
    assert script.main(["--max-seq-length", "16"]) == 0
    assert calls == ["pretrain_data"]
    manifest = json.load(open(os.path.join("pretrain_data", "pretrain_tfrecords", "manifest.json")))
    assert manifest["corpus_dir"] == os.path.join("pretrain_data", "corpus")
    assert manifest["vocab"]["path"] == os.path.join("pretrain_data", "vocab.txt")
    # Data now "ready": no second fetch; a bad flag fails before any fetch is considered.
    assert script.main(["--max-seq-length", "16", "--overwrite"]) == 0
    assert script.main(["--max-seq-length", "4"]) == 2
    assert calls == ["pretrain_data"]
    # An explicit corpus never triggers the fetch.
    calls.clear()
    monkeypatch.setattr(script, "default_data_ready", lambda data_dir="pretrain_data": False)
    assert script.main(["--corpus-dir", "pretrain_data/corpus", "--vocab-file",
                        "pretrain_data/vocab.txt", "--output-dir", "other",
                        "--max-seq-length", "16"]) == 0
    assert calls == []


def test_jsonl_input_counts_a_bad_line_or_stops_at_it(inputs):
    import gzip

    corpus = inputs["tmp"] / "jsonl"
    corpus.mkdir()
    rows = [json.dumps({"text": "hello world.\nhello again."}), '{"body": "no text"}',
            json.dumps({"text": "world hello."})]
    (corpus / "dump.jsonl.gz").write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    args = base_args(inputs, **{"--corpus-dir": str(corpus), "--max-seq-length": "16"})
    result = run_cli(*args, "--input-format", "jsonl")
    assert result.returncode == 0, result.stderr
    assert "1 input problem(s)" in result.stderr and "dump.jsonl.gz: missing_text_field at line 2" \
        in result.stderr
    manifest = json.load(open(os.path.join(inputs["out"], "manifest.json")))
    assert manifest["input_format"] == "jsonl" and manifest["counts"]["documents"] == 2
    result = run_cli(*args, "--input-format", "jsonl", "--bad-input", "error", "--overwrite")
    assert_one_line_error(result, "dump.jsonl.gz", "line 2", "no field 'text'")


def _one_line_error(capsys, code, *fragments):
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_beam_runner_without_beam_is_one_line_naming_the_extra(inputs, monkeypatch, capsys):
    from electra_tf.commands import build_dataset as script

    monkeypatch.setitem(sys.modules, "apache_beam", None)  # `import apache_beam` fails
    code = script.main(base_args(inputs) + ["--runner", "DirectRunner"])
    _one_line_error(capsys, code, "--runner DirectRunner needs Apache Beam",
                    "pip install -e '.[beam]'")
    assert not os.path.exists(inputs["out"])


def test_beam_options_need_a_beam_runner(inputs):
    result = run_cli(*base_args(inputs), "--direct_num_workers", "2")
    assert result.returncode == 2
    assert "unrecognized arguments: --direct_num_workers 2" in result.stderr


def test_beam_runner_passes_its_options_through_and_rejects_unknown_ones(inputs, capsys):
    import_extra("apache_beam", "beam")
    from electra_tf.commands import build_dataset as script

    args = base_args(inputs, **{"--max-seq-length": "16"}) + ["--runner", "DirectRunner"]
    code = script.main(args + ["--direct_num_workers", "1", "--no_such_beam_option", "3"])
    _one_line_error(capsys, code, "unrecognized arguments: --no_such_beam_option 3")
    code = script.main(args + ["--num-processes", "2"])
    _one_line_error(capsys, code, "--num-processes is the local builder's")
    assert not os.path.exists(inputs["out"])
    assert script.main(args + ["--direct_num_workers", "1"]) == 0
    manifest = json.load(open(os.path.join(inputs["out"], "manifest.json")))
    assert manifest["runner"]["name"] == "DirectRunner"
    assert manifest["runner"]["pipeline_args"] == ["--direct_num_workers", "1"]
    assert "--runner DirectRunner" in manifest["command"]
    assert manifest["splits"]["train"]["examples"] > 0


def test_quiet_by_default_in_worker_processes_too(inputs):
    # Each spawned worker loads TensorFlow again: its C++ start-up lines must stay hidden there.
    result = run_cli(*base_args(inputs, **{"--max-seq-length": "16"}), "--num-processes", "2")
    assert result.returncode == 0, result.stderr
    noise = [line for line in result.stderr.splitlines()
             if "absl::InitializeLog" in line or "oneDNN" in line or "cudart" in line]
    assert noise == [], result.stderr
