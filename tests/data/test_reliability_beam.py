"""The Beam build under the faults of issue 31, on Apache Beam's DirectRunner: deeply nested
JSON and OpenWebText as downloaded give the local builder's dataset byte for byte; a full disk
is the local builder's one line (not a 90-line `ResourceExhaustedError ... [while running
'WriteShards']`), with no `apitools not found` line and nothing left behind.
"""

import json
import os
import random
import subprocess
import sys

import pytest

from tests.extras import import_extra

beam = import_extra("apache_beam", "beam")

from electra_tf.data.build import beam_build  # noqa: E402
from electra_tf.data.build.build_config import BuildConfig  # noqa: E402
from electra_tf.data.build.builder import build_dataset  # noqa: E402
from tests import fault_fixtures as faults  # noqa: E402
from tests import pretraining_fixtures as fx  # noqa: E402
from tests.data.test_reliability_input import _tar_bytes, _text  # noqa: E402

SCRIPT = os.path.join(fx.REPO_ROOT, "build_pretraining_dataset.py")
NUM_WORDS = 200
RUN_KEYS = {"runner", "num_processes", "shuffle", "command", "started_at", "finished_at",
            "elapsed_seconds", "phase_seconds", "throughput", "corpus_dir"}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return fx.write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"),
                          fx.vocab_tokens(NUM_WORDS))


def _read_bytes(directory):
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name != "manifest.json"}


def _both_engines(corpus, out_root, vocab, **settings):
    """The local and the Beam build of one config must be the same dataset; returns Beam's
    manifest."""
    settings = dict(vocab_file=vocab, max_seq_length=16, num_out_files=2, eval_fraction=0.1,
                    seed=5, **settings)
    local = build_dataset(BuildConfig(corpus_dir=str(corpus), output_dir=str(out_root / "local"),
                                      **settings))
    on_beam = beam_build.build_dataset_beam(BuildConfig(
        corpus_dir=str(corpus), output_dir=str(out_root / "beam"), **settings), "DirectRunner")
    assert _read_bytes(out_root / "beam") == _read_bytes(out_root / "local")
    assert ({k: v for k, v in on_beam.items() if k not in RUN_KEYS}
            == {k: v for k, v in local.items() if k not in RUN_KEYS})
    return on_beam


def test_deeply_nested_json_on_beam_is_the_local_builders_counted_skip(vocab, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(7)
    lines = [json.dumps({"text": _text(rng, 3)}) for _ in range(40)]
    lines[9] = '{"a": ' + "[" * 1000 + "1" + "]" * 1000 + ', "text": "x"}'
    (corpus / "deep.jsonl").write_text("\n".join(lines) + "\n")
    manifest = _both_engines(corpus, tmp_path, vocab, input_format="jsonl")
    assert [(p["problem"], p["first"]) for p in manifest["input_problems"]] == [
        ("invalid_json", "line 10")]
    assert manifest["counts"]["documents"] == 39


def test_openwebtext_as_downloaded_on_beam_reads_the_inner_archives(vocab, tmp_path):
    rng = random.Random(8)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    inner = {f"openwebtext/urlsf_subset00-{k}_data.xz": _tar_bytes(
        {f"{k}-{i}.txt": (_text(rng, 4) + "\n").encode() for i in range(8)}, "xz")
        for k in range(2)}
    (corpus / "openwebtext.tar.xz").write_bytes(_tar_bytes(inner, "xz"))
    manifest = _both_engines(corpus, tmp_path, vocab, input_format="openwebtext")
    assert manifest["counts"]["documents"] == 16 and manifest["counts"]["unk_tokens"] == 0


@pytest.mark.slow  # two Beam builds in subprocesses
def test_beam_build_on_a_full_disk_is_one_line_and_leaves_nothing(vocab, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(9)
    for f in range(3):
        (corpus / f"part{f}.txt").write_text("\n\n".join(_text(rng, 4) for _ in range(800)) + "\n")
    with faults.small_filesystem(str(tmp_path / "disk"), size="4m") as disk:
        out = os.path.join(disk, "out")
        filler = faults.fill(disk, 64 << 10)
        command = [sys.executable, SCRIPT, "--corpus-dir", str(corpus), "--vocab-file", vocab,
                   "--output-dir", out, "--max-seq-length", "32", "--num-out-files", "2",
                   "--runner", "DirectRunner"]
        full = subprocess.run(command, env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                              capture_output=True, text=True, timeout=600)
        line = faults.one_error_line(full.returncode, full.stderr, "build_pretraining_dataset.py")
        assert f"shards in {out} (" in line and "cannot write the " in line, line
        assert "No space left on device" in line and "while running" not in line, line
        assert "--overwrite" not in line  # nothing is left that a rerun would have to replace
        assert "apitools" not in full.stderr, full.stderr  # Beam's optional-client chatter
        assert not os.path.exists(out)  # the directory it created, temporaries and all
        os.remove(filler)
        again = subprocess.run(command, env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "apitools" not in again.stderr, again.stderr
        assert json.load(open(os.path.join(out, "manifest.json")))["counts"]["files"] == 3
