"""`python -m electra_tf.convert`: subcommands, --help, exit codes and one-line errors."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from electra_tf.convert.__main__ import main

from tests import convert_fixtures as cf

COMMANDS = ("from-google", "to-hf", "to-keras-hub", "to-google", "to-onnx")


def test_module_help_lists_every_subcommand():
    # A subprocess: the real entry point, from the repository root (a clean checkout).
    done = subprocess.run([sys.executable, "-m", "electra_tf.convert", "--help"], cwd=cf.REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for command in COMMANDS:
        assert command in done.stdout


@pytest.mark.parametrize("command, flags", [
    ("from-google", ("--checkpoint", "--vocab-file", "--output-dir", "--hparams", "--model-size",
                     "4010000")),
    ("to-hf", ("--model-dir", "--output-dir", "--part", "--checkpoint", "ElectraForMaskedLM")),
    ("to-keras-hub", ("--model-dir", "--output-dir", "tanh-approximate")),
    ("to-google", ("--model-dir", "--output-dir", "official variable names")),
    ("to-onnx", ("--model-dir", "--output", "--task", "--checkpoint", "--opset", "default: 17",
                 "--overwrite", "[onnx] extra", "dynamic")),
])
def test_subcommand_help(capsys, command, flags):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in flags:
        assert flag in text, flag


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    vocab = cf.write_text_vocab(str(tmp_path / "vocab.txt"))
    code = main(["--quiet", "from-google", "--checkpoint", str(tmp_path / "missing"), "--vocab-file", vocab,
                 "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith("python -m electra_tf.convert from-google: error: --checkpoint ")
    code = main(["--quiet", "to-hf", "--model-dir", str(tmp_path), "--output-dir", str(tmp_path / "hf")])
    assert code == 2 and "no config.json" in capsys.readouterr().err
    code = main(["--quiet", "from-google", "--checkpoint", "x", "--vocab-file", str(tmp_path / "nope.txt"),
                 "--output-dir", str(tmp_path / "out")])
    assert code == 2


def test_from_google_then_every_export(tmp_path):
    vocab = cf.write_text_vocab(str(tmp_path / "vocab.txt"))
    weights = cf.official_weights(cf.vocab_size_of(vocab), 128)
    prefix = cf.write_google_checkpoint(str(tmp_path / "release" / "electra_small"), weights, 42, adam_slots=False)
    model_dir = str(tmp_path / "data" / "models" / "electra_small")
    done = subprocess.run(
        [sys.executable, "-m", "electra_tf.convert", "from-google", "--checkpoint", prefix,
         "--vocab-file", vocab, "--output-dir", model_dir, "--hparams", '{"generator_hidden_size": 1.0}'],
        cwd=cf.REPO_ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=cf.REPO_ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "to continue pretraining: python run_pretraining.py" in done.stderr
    assert '"num_train_steps": 10042' in done.stderr
    assert os.path.isfile(os.path.join(model_dir, "init_checkpoint", "ckpt-0.index"))

    assert main(["--quiet", "to-google", "--model-dir", model_dir, "--output-dir", str(tmp_path / "g")]) == 0
    assert tf.train.latest_checkpoint(str(tmp_path / "g")).endswith("model.ckpt-42")
    assert main(["--quiet", "to-hf", "--model-dir", model_dir, "--output-dir", str(tmp_path / "hf"),
                 "--part", "generator"]) == 0
    assert os.path.isfile(str(tmp_path / "hf" / "model.safetensors"))
    assert main(["--quiet", "to-keras-hub", "--model-dir", model_dir, "--output-dir", str(tmp_path / "kh")]) == 0
    assert os.path.isfile(str(tmp_path / "kh" / "model.weights.h5"))
