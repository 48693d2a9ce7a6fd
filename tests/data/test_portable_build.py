"""The dataset build without TensorFlow (issue 48): `--tokenizer`, the shards byte-identical to a
TensorFlow build's, and one tokenizer per dataset.

The TensorFlow-free builds run in child processes where `tensorflow` and `tensorflow_text`
cannot be imported, in the worker processes they spawn too: packages of those names that raise
ImportError come first on PYTHONPATH (what a machine without TensorFlow gives). The in-process
`sys.modules` block of `tests.backends` does the same for the checks that need no workers.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.build.build_config import BuildConfig, resolve_config
from electra_tf.data.build.builder import build_dataset
from electra_tf.data.records.record_framing import RecordWriter
from electra_tf.data.records.tfrecord_io import MANIFEST_NAME
from electra_tf.errors import BuildError
from tests import backends, pretraining_fixtures as fx
from tests.data.test_tokenization import CASES, REAL_CORPUS, REAL_VOCAB, write_test_vocab
from tests.spm_fixtures import write_corpus as write_spm_corpus

BUILD = os.path.join(fx.REPO_ROOT, "build_pretraining_dataset.py")


def no_tensorflow_env(tmp_path) -> dict:
    """A child's environment in which `import tensorflow` / `tensorflow_text` raise ImportError,
    also in the processes it spawns."""
    shim = tmp_path / "no_tensorflow"
    for name in backends.BLOCKED:
        (shim / name).mkdir(parents=True, exist_ok=True)
        (shim / name / "__init__.py").write_text(
            f'raise ImportError("No module named {name} (blocked by the test)")\n')
    return fx.subprocess_env(PYTHONPATH=os.pathsep.join([str(shim), fx.REPO_ROOT]))


def write_corpus(directory):
    """Every special case of the tokenizer tests (accents, CJK, controls, words of 200+
    characters, [UNK]s, invalid UTF-8), plus prose: real text where fetched, else generated."""
    os.makedirs(directory)
    with open(os.path.join(directory, "special.txt"), "wb") as f:
        for i, case in enumerate(CASES * 3):
            f.write(case.encode("utf-8", "surrogatepass").replace(b"\n", b" ") + b"\n")
            if i % 7 == 6:
                f.write(b"\n" + b"junk \xff\xfe bytes \xc3\n\n")
    if os.path.isdir(REAL_CORPUS) and os.listdir(REAL_CORPUS):
        for name in sorted(os.listdir(REAL_CORPUS))[::9]:
            with open(os.path.join(REAL_CORPUS, name), "rb") as src:
                data = src.read(120_000)
            with open(os.path.join(directory, name), "wb") as dst:
                dst.write(data[:data.rfind(b"\n") + 1])
    else:
        write_spm_corpus(os.path.join(directory, "prose"), lines=1500)


def _files(directory):
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name != MANIFEST_NAME}


def _run_build(env, *args):
    proc = subprocess.run([sys.executable, BUILD, "--quiet", *args], env=env, capture_output=True,
                          text=True, timeout=600)
    return proc


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vocabs")
    wordpiece = (REAL_VOCAB if os.path.isfile(REAL_VOCAB)
                 else write_test_vocab(directory / "vocab.txt").path)
    from electra_tf.data.text.spm_learning import learn_spm

    corpus = write_spm_corpus(str(directory / "spm_corpus"))
    spm = learn_spm([corpus], 150, str(directory / "spm.model")).path
    return {"wordpiece": ["--vocab-file", wordpiece], "sentencepiece": ["--spm-model", spm]}


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_build_without_tensorflow_is_byte_identical(tmp_path, vocabs, kind):
    """The default corpus excerpts and every tokenizer special case, with a held-out split, 3
    shards and (without TensorFlow) 2 worker processes: the same shard and inputs.jsonl bytes."""
    corpus = str(tmp_path / "corpus")
    write_corpus(corpus)
    flag, vocab = vocabs[kind]
    settings = dict(corpus_dir=corpus, output_dir=str(tmp_path / "tf"), num_out_files=3,
                    eval_fraction=0.1, seed=3, tokenizer="tensorflow")
    settings["vocab_file" if kind == "wordpiece" else "spm_model"] = vocab
    expected = build_dataset(BuildConfig(**settings))
    assert expected["tokenizer"]["name"] == "tensorflow"
    free = str(tmp_path / "free")
    proc = _run_build(no_tensorflow_env(tmp_path), "--corpus-dir", corpus, flag, vocab,
                      "--output-dir", free, "--num-out-files", "3", "--eval-fraction", "0.1",
                      "--seed", "3", "--num-processes", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = _files(free)
    assert got == _files(str(tmp_path / "tf"))
    assert sum(name.startswith("eval_data") for name in got) == 1
    manifest = json.load(open(os.path.join(free, MANIFEST_NAME)))
    library = "tokenizers" if kind == "wordpiece" else "sentencepiece"
    assert manifest["tokenizer"]["name"] == "tokenizers"
    assert manifest["tokenizer"]["library"] == library
    assert manifest["splits"] == expected["splits"]
    assert manifest["counts"] == expected["counts"]


def test_tokenizer_flag_resolves_and_is_documented(tmp_path):
    assert resolve_config(BuildConfig()).tokenizer == "tensorflow"  # TensorFlow is here
    assert resolve_config(BuildConfig(tokenizer="tokenizers")).tokenizer == "tokenizers"
    assert resolve_config(BuildConfig(tokenizer="tensorflow")).tokenizer == "tensorflow"
    with pytest.raises(BuildError, match="--tokenizer must be one of auto, tensorflow, tokenizers"):
        resolve_config(BuildConfig(tokenizer="spacy"))
    from electra_tf.commands.build_dataset import build_parser

    assert build_parser().parse_args([]).tokenizer == "auto"
    assert "--tokenizer {auto,tensorflow,tokenizers}" in build_parser().format_help()
    readme = open(os.path.join(fx.REPO_ROOT, "README.md"), encoding="utf-8").read()
    assert "--tokenizer tokenizers" in readme


def test_without_tensorflow_the_tensorflow_tokenizer_and_learn_vocab_are_one_line_errors(
        tmp_path, vocabs):
    corpus = str(tmp_path / "corpus")
    os.makedirs(corpus)
    with open(os.path.join(corpus, "a.txt"), "w") as f:
        f.write("hello world\n")
    env = no_tensorflow_env(tmp_path)
    for flags, message in (
            (["--tokenizer", "tensorflow", *vocabs["wordpiece"]],
             "--tokenizer tensorflow: TensorFlow cannot be imported here"),
            (["--learn-vocab", "100"], "--learn-vocab learns with tensorflow-text's WordPiece "
                                       "learner, which cannot be imported here")):
        proc = _run_build(env, "--corpus-dir", corpus, "--output-dir", str(tmp_path / "out"),
                          *flags)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
        assert not os.path.exists(tmp_path / "out" / MANIFEST_NAME)


_WORKER = """
import json
from electra_tf.data.build.build_worker import FilePacker
from electra_tf.errors import BuildError
from electra_tf.data.text.formats import InputSettings
from electra_tf.data.build.packing import PackSettings
from electra_tf.vocab import load_vocab
vocab = load_vocab(json.loads(inp["args"].item())["vocab"])
packer = FilePacker(vocab, True, True, InputSettings("text", True, "text"),
                    PackSettings(128, 0, 0.0, vocab.special.unk_id), False,
                    tokenizer="tensorflow")
try:
    packer.tokenizer
except BuildError as e:
    out["error"] = str(e)
"""


def test_a_worker_never_falls_back_to_the_other_tokenizer(vocabs):
    """A build's workers run the tokenizer chosen where it started: one that cannot (here:
    TensorFlow's, without TensorFlow; e.g. a Beam worker unlike its launcher) fails the build
    rather than mix the two in one dataset."""
    child = backends.run_on_backend(
        "jax", _WORKER, inputs={"args": np.asarray(json.dumps({"vocab": vocabs["wordpiece"][1]}))},
        timeout=300)
    error = child["error"].item()
    assert "this build tokenizes with TensorFlow" in error
    assert "never built with two tokenizers" in error and "--tokenizer tokenizers" in error


def test_record_writer_writes_what_tensorflow_writes(tmp_path):
    rng = np.random.default_rng(0)
    records = [b"", b"x"] + [rng.bytes(int(n)) for n in rng.integers(0, 3000, 50)]
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    with RecordWriter(str(tmp_path / "ours.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    assert (tmp_path / "ours.tfrecord").read_bytes() == (tmp_path / "tf.tfrecord").read_bytes()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "ours.tfrecord"))] == records
