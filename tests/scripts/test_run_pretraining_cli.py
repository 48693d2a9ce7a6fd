"""run_pretraining.py: --help, one-line errors with exit code 2, --model-size, --overwrite, debug,
and a real SIGKILL mid-training followed by a restart that finishes the run."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import run_pretraining
from electra_tf import cli
from electra_tf.commands import pretrain
from electra_tf.config import HPARAM_NAMES, PretrainingConfig
from electra_tf.config.hparams import ConfigError
from tests import pretraining_fixtures as fx

SUBPROCESS_TIMEOUT = 180


def _main(capsys, *argv):
    code = run_pretraining.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err


def _assert_one_line_error(code, err, *needles):
    lines = [line for line in err.splitlines() if line.startswith("run_pretraining.py: error:")]
    assert code == cli.EXIT_USER_ERROR, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------------------------------------------------
# --help
# ------------------------------------------------------------------------------------------------
def test_help_documents_every_flag_and_hparam():
    result = subprocess.run([sys.executable, os.path.join(fx.REPO_ROOT, "run_pretraining.py"),
                             "--help"], capture_output=True, text=True, timeout=60,
                            env=fx.subprocess_env(), cwd=fx.REPO_ROOT)
    assert result.returncode == 0
    text = result.stdout
    parser = run_pretraining.build_parser()
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in text, flag
        assert action.help and len(action.help) > 10, action.option_strings
    for name in HPARAM_NAMES:
        assert name in text, name
    for choice in ("small", "base", "large"):
        assert choice in text


# ------------------------------------------------------------------------------------------------
# User errors: one line, exit 2, no traceback
# ------------------------------------------------------------------------------------------------
def test_unknown_hparam(capsys, data_dir):
    code, err = _main(capsys, "--data-dir", data_dir, "--hparams", '{"learnin_rate": 1e-4}')
    _assert_one_line_error(code, err, "learnin_rate", "learning_rate")


def test_invalid_hparams_json_and_bad_value(capsys, data_dir):
    code, err = _main(capsys, "--data-dir", data_dir, "--hparams", '{"learning_rate": }')
    _assert_one_line_error(code, err, "--hparams", "invalid JSON")
    code, err = _main(capsys, "--data-dir", data_dir, "--hparams", '{"num_train_steps": "ten"}')
    _assert_one_line_error(code, err, "num_train_steps")
    code, err = _main(capsys, "--data-dir", data_dir, "--hparams", "missing_file.json")
    _assert_one_line_error(code, err, "missing_file.json")
    deep = '{"seed": ' + "[" * 100000 + "]" * 100000 + "}"
    code, err = _main(capsys, "--data-dir", data_dir, "--hparams", deep)
    _assert_one_line_error(code, err, "--hparams", "nested too deeply")


@pytest.mark.parametrize("value, needle", [("-1", "must be 0 or more, got -1"),
                                           ("two", "invalid int value: 'two'")])
def test_profile_steps_must_be_a_count(capsys, data_dir, value, needle):
    with pytest.raises(SystemExit) as exit_info:  # argparse: usage, then one error line
        run_pretraining.main(["--data-dir", data_dir, "--profile-steps", value])
    err = capsys.readouterr().err
    assert exit_info.value.code == cli.EXIT_USER_ERROR
    _assert_one_line_error(cli.EXIT_USER_ERROR, err, "argument --profile-steps", needle)


def test_missing_data_dir(capsys, tmp_path):
    missing = str(tmp_path / "no_such_dir")
    code, err = _main(capsys, "--data-dir", missing)
    _assert_one_line_error(code, err, missing)
    assert not os.path.exists(missing)  # nothing created


def test_missing_vocab(capsys, tmp_path):
    data = str(tmp_path / "data")
    fx.write_dataset(data, examples_per_shard=4)
    os.remove(os.path.join(data, "vocab.txt"))
    code, err = _main(capsys, "--data-dir", data, "--hparams", json.dumps(fx.tiny_hparams()))
    _assert_one_line_error(code, err, os.path.join(data, "vocab.txt"))
    assert not os.path.exists(os.path.join(data, "models"))


def test_a_vocab_under_another_name_is_named_with_the_accepted_names(capsys, tmp_path):
    """Issue 47: `sp.model` where `spm.model` is looked for: the line names the accepted names
    and the file found."""
    data = str(tmp_path / "data")
    fx.write_dataset(data, examples_per_shard=4)
    os.rename(os.path.join(data, "vocab.txt"), os.path.join(data, "sp.model"))
    code, err = _main(capsys, "--data-dir", data, "--hparams", json.dumps(fx.tiny_hparams()))
    _assert_one_line_error(code, err, os.path.join(data, "vocab.txt"),
                           "vocab.txt, a WordPiece vocab, or spm.model, a SentencePiece model",
                           f"{data} holds sp.model: rename it")
    assert not os.path.exists(os.path.join(data, "models"))


def test_missing_tfrecords(capsys, tmp_path):
    data = str(tmp_path / "data")
    fx.write_vocab(os.path.join(data, "vocab.txt"))
    code, err = _main(capsys, "--data-dir", data, "--hparams", json.dumps(fx.tiny_hparams()))
    _assert_one_line_error(code, err, "pretrain_data.tfrecord*", "build_pretraining_dataset.py")
    assert not os.path.exists(os.path.join(data, "models"))


def test_dataset_built_for_another_max_seq_length(capsys, data_dir):
    code, err = _main(capsys, "--data-dir", data_dir, "--model-name", "seq64",
                      "--hparams", json.dumps(fx.tiny_hparams(max_seq_length=64)))
    _assert_one_line_error(code, err, "manifest.json", "max_seq_length")


def test_user_error_exit_code_in_a_real_process(tmp_path):
    missing = str(tmp_path / "absent")
    result = subprocess.run(fx.run_pretraining_command(missing, "x", {}), capture_output=True,
                            text=True, timeout=SUBPROCESS_TIMEOUT, env=fx.subprocess_env(),
                            cwd=fx.REPO_ROOT)
    _assert_one_line_error(result.returncode, result.stderr, missing)


# ------------------------------------------------------------------------------------------------
# --model-size
# ------------------------------------------------------------------------------------------------
def test_model_size_shortcut():
    base = pretrain.pretraining_config_from_args(run_pretraining.parse_args(["--model-size", "base"]))
    assert base.model_size == "base"
    assert (base.embedding_size, base.max_seq_length, base.train_batch_size) == (768, 512, 256)
    small = pretrain.pretraining_config_from_args(run_pretraining.parse_args([]))
    assert small.model_size == "small" and small.embedding_size == 128
    agree = pretrain.pretraining_config_from_args(run_pretraining.parse_args(
        ["--model-size", "large", "--hparams", '{"model_size": "large", "max_seq_length": 128}']))
    assert agree.model_size == "large" and agree.max_seq_length == 128  # hparams win
    with pytest.raises(ConfigError, match="--model-size base contradicts"):
        pretrain.pretraining_config_from_args(run_pretraining.parse_args(
            ["--model-size", "base", "--hparams", '{"model_size": "small"}']))


def test_model_size_contradiction_is_a_one_line_error(capsys, data_dir):
    code, err = _main(capsys, "--data-dir", data_dir, "--model-size", "base",
                      "--hparams", '{"model_size": "large"}')
    _assert_one_line_error(code, err, "--model-size base")


# ------------------------------------------------------------------------------------------------
# --overwrite and debug: nothing is deleted without the flag
# ------------------------------------------------------------------------------------------------
def _checkpoint_step(model_dir):
    path = tf.train.latest_checkpoint(model_dir)
    return None if path is None else int(path.rsplit("-", 1)[1])


def test_overwrite_starts_afresh(capsys, data_dir, caplog):
    from electra_tf.training.tf import trainer as trainer_lib

    # An existing run at step 0 (config.json, vocab copy, checkpoint), made without training.
    old = trainer_lib.Trainer(fx.tiny_config(data_dir, "ow", num_train_steps=5))
    old.manager.save(checkpoint_number=0)
    model_dir = old.config.model_dir
    del old
    # A stale file of the old run (a file of the user's would make --overwrite refuse: issue 13).
    stale = os.path.join(model_dir, "eval_results.txt")
    open(stale, "w").close()
    # With --overwrite and a changed model: the old run is gone and training restarts at step 0
    # (without the flag, the changed model would be refused as incompatible).
    changed = json.dumps(fx.tiny_hparams(num_train_steps=1, iterations_per_loop=1,
                                         save_checkpoints_steps=1, embedding_size=16))
    code, err = _main(capsys, "--data-dir", data_dir, "--model-name", "ow", "--hparams", changed)
    _assert_one_line_error(code, err, "embedding_size")
    assert os.path.exists(stale)
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        code, err = _main(capsys, "--data-dir", data_dir, "--model-name", "ow", "--hparams",
                          changed, "--overwrite")
    assert code == 0, err[-3000:]
    assert not os.path.exists(stale)
    assert _checkpoint_step(model_dir) == 1
    assert any("training from step 0" in r.getMessage() for r in caplog.records)
    saved = json.load(open(os.path.join(model_dir, "config.json")))
    assert saved["embedding_size"] == 16


def test_overwrite_refuses_a_directory_that_is_not_a_run(capsys, data_dir, tmp_path):
    mine = tmp_path / "my_dir"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    hparams = json.dumps(fx.tiny_hparams(model_dir=str(mine)))
    code, err = _main(capsys, "--data-dir", data_dir, "--hparams", hparams, "--overwrite")
    _assert_one_line_error(code, err, "refusing to delete", str(mine))
    assert (mine / "thesis.tex").read_text() == "precious"


def test_overwrite_with_bad_inputs_deletes_nothing(capsys, data_dir, tmp_path):
    hparams = fx.tiny_hparams(num_train_steps=1, iterations_per_loop=1, save_checkpoints_steps=1)
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(fx.tiny_config(data_dir, "r", model_dir=run_dir).to_dict(), f)
    bad = dict(hparams, model_dir=run_dir, pretrain_tfrecords=str(tmp_path / "nothing*"))
    code, err = _main(capsys, "--data-dir", data_dir, "--hparams", json.dumps(bad), "--overwrite")
    _assert_one_line_error(code, err, "nothing*")
    assert os.path.exists(os.path.join(run_dir, "config.json"))


def test_debug_mode_never_deletes_the_model_dir(capsys, data_dir):
    model_dir = os.path.join(data_dir, "models", "debug_run")
    os.makedirs(model_dir)
    keep = os.path.join(model_dir, "my_notes.txt")
    with open(keep, "w") as f:
        f.write("mine")
    # Official debug mode deletes the model directory first; here the user's file survives.
    hparams = {"debug": True, "vocab_size": fx.VOCAB_SIZE, "max_seq_length": fx.MAX_SEQ_LENGTH,
               "num_train_steps": 1, "do_export": False}
    code, err = _main(capsys, "--data-dir", data_dir, "--model-name", "debug_run",
                      "--hparams", json.dumps(hparams))
    assert code == 0, err
    assert open(keep).read() == "mine"
    assert _checkpoint_step(model_dir) == 1
    # The debug model (hidden 144, FFN 576) was trained.
    shapes = dict(tf.train.list_variables(tf.train.latest_checkpoint(model_dir)))
    assert any(shape == [144, 576] for shape in shapes.values())


# ------------------------------------------------------------------------------------------------
# SIGKILL mid-training, then restart
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # a kill and a restart: two training processes (~50-100 s)
def test_sigkill_mid_training_then_restart_reaches_num_train_steps(data_dir):
    steps = 40
    hparams = fx.tiny_hparams(num_train_steps=steps, iterations_per_loop=1, save_checkpoints_steps=2,
                              keep_checkpoint_max=3)
    command = fx.run_pretraining_command(data_dir, "killed", hparams)
    model_dir = os.path.join(data_dir, "models", "killed")
    proc = subprocess.Popen(command, env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed_at = None
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            step = _checkpoint_step(model_dir) if os.path.isdir(model_dir) else None
            if step is not None and step > 0:
                proc.send_signal(signal.SIGKILL)
                killed_at = step
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None and killed_at is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    assert killed_at is not None, f"no checkpoint beyond step 0 appeared:\n{err[-3000:]}"
    assert proc.returncode == -signal.SIGKILL
    last_before_restart = _checkpoint_step(model_dir)
    assert 0 < last_before_restart < steps, "the run finished before the kill: raise `steps`"

    restart = subprocess.run(command, env=fx.subprocess_env(), cwd=fx.REPO_ROOT,
                             capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert restart.returncode == 0, restart.stderr[-3000:]
    assert f"(step {last_before_restart})" in restart.stderr  # resumed, not restarted
    assert f"training from step {last_before_restart} to {steps}" in restart.stderr
    assert _checkpoint_step(model_dir) == steps

    # The final checkpoint is valid and loadable: a new run restores it at num_train_steps.
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == steps
    from electra_tf.training.tf import trainer as trainer_lib

    restored = trainer_lib.Trainer(PretrainingConfig.create("killed", data_dir, hparams))
    assert restored.step == steps
    assert all(np.isfinite(v.numpy()).all() for v in restored.model.trainable_variables)
