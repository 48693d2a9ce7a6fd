"""Failures of the environment, each one line on stderr with exit status 2 (never a traceback):
a full disk during export, a read-only model directory (the eval metrics are still reported), a
batch too large for TensorFlow's int32 shapes, a TF_CONFIG task outside its cluster, a TPU
address nothing answers on; KERAS_BACKEND naming another backend (set back to tensorflow by the
tools, one line from a library caller).

Real faults: a tmpfs filled up or remounted read-only, a real TF_CONFIG / TPU_NAME in the
environment, a closed port on 127.0.0.1.
"""

import json
import logging
import os
import subprocess
import sys

import pytest

import run_pretraining
from electra_tf.training.tf import trainer as trainer_lib
from tests import fault_fixtures as faults
from tests import pretraining_fixtures as fx

RUN = dict(num_train_steps=2, save_checkpoints_steps=2, iterations_per_loop=2)

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest


def _main(capsys, *argv):
    return faults.run_main(run_pretraining.main, capsys, *argv)


@pytest.fixture
def disk(tmp_path):
    """A 16 MiB tmpfs holding a trained tiny run (`model_dir`)."""
    with faults.small_filesystem(str(tmp_path / "disk"), size="16m") as mount_point:
        yield mount_point


def _train(data_dir, model_dir, name):
    hparams = fx.tiny_hparams(model_dir=model_dir, **RUN)
    with trainer_lib.Trainer(trainer_lib.PretrainingConfig.create(name, data_dir, hparams)) as t:
        t.train()
    return hparams


@pytest.mark.slow  # trains, exports twice: ~60 s on 2 shared cores
def test_disk_full_during_export_is_one_line_and_leaves_no_staging(data_dir, disk, capsys):
    model_dir = os.path.join(disk, "run")
    hparams = _train(data_dir, model_dir, "export_full")
    faults.fill(disk, 64 << 10)  # far less than a SavedModel
    hparams.update(do_train=False, do_export=True)
    argv = ("--data-dir", data_dir, "--model-name", "export_full", "--hparams",
            json.dumps(hparams))
    line = faults.one_error_line(*_main(capsys, *argv))
    assert "cannot write the export" in line and "No space left on device" in line, line
    export_dir = os.path.join(model_dir, "export")
    # No staging left: at most the empty export/<network>/ folders of the version layout.
    left = [os.path.join(d, n) for d, dirs, files in os.walk(export_dir) for n in dirs + files]
    assert all(os.path.isdir(p) and not os.listdir(p) for p in left), left
    assert sorted(n for n in os.listdir(model_dir) if n.startswith("ckpt-2")) == [
        "ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    os.remove(os.path.join(disk, "filler"))
    code, err = _main(capsys, *argv)  # with space again, the same command exports
    assert code == 0, err[-3000:]
    # TF Serving's layout (issue 18): export/<network>/<step>/.
    assert os.path.isfile(os.path.join(export_dir, "discriminator", "2", "saved_model.pb"))


@pytest.mark.slow  # trains, evaluates: ~40 s on 2 shared cores
def test_read_only_model_dir_reports_eval_metrics_then_one_line(data_dir, disk, capsys):
    model_dir = os.path.join(disk, "run")
    hparams = _train(data_dir, model_dir, "read_only")
    faults.read_only(disk)
    hparams.update(do_train=False, do_eval=True, do_export=False)
    argv = ("--data-dir", data_dir, "--model-name", "read_only", "--hparams", json.dumps(hparams))
    code, err = _main(capsys, *argv)
    line = faults.one_error_line(code, err)
    assert "cannot write the eval results" in line and "Read-only file system" in line, line
    assert "the results at step 2: " in line and "disc_accuracy 0." in line  # not lost
    # A training run there stops before anything else, naming the directory.
    hparams.update(do_train=True, do_eval=False, num_train_steps=4)
    line = faults.one_error_line(*_main(capsys, "--data-dir", data_dir, "--model-name",
                                        "read_only", "--hparams", json.dumps(hparams)))
    assert f"cannot write in the model dir {model_dir}" in line and "Read-only" in line, line


def test_batch_overflowing_int32_shapes_is_one_line(data_dir, capsys):
    line = faults.one_error_line(*_main(
        capsys, "--data-dir", data_dir, "--model-name", "huge_batch", "--hparams",
        json.dumps(fx.tiny_hparams(train_batch_size=1_000_000_000))))
    assert "train_batch_size=1000000000 is too large" in line and "int32" in line, line


@pytest.mark.parametrize("tf_config, expected", [
    ({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 5}},
     "task index 5 is out of range: the cluster has 2 worker task(s), indices 0 to 1"),
    ({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "chief", "index": 0}},
     "task type 'chief' is not in the cluster (it has worker)"),
    ({"task": {"type": "worker", "index": 0}}, "TF_CONFIG has no \"cluster\""),
])
def test_tf_config_naming_a_task_outside_its_cluster_is_one_line(
        data_dir, capsys, monkeypatch, tf_config, expected):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    line = faults.one_error_line(*_main(
        capsys, "--data-dir", data_dir, "--model-name", "tf_config", "--hparams",
        json.dumps(fx.tiny_hparams(strategy="multi_worker"))))
    assert expected in line, line
    assert not os.path.exists(os.path.join(data_dir, "models", "tf_config"))


def test_tpu_address_nothing_answers_on_is_one_line(data_dir, capsys, monkeypatch):
    """TensorFlow waits forever for a TPU address nothing answers on; electra-tf checks it with
    a plain connection first (a closed port on 127.0.0.1: refused at once, no network)."""
    port = fx.free_ports(1)[0]
    monkeypatch.setenv("TPU_NAME", f"grpc://127.0.0.1:{port}")
    line = faults.one_error_line(*_main(
        capsys, "--data-dir", data_dir, "--model-name", "tpu", "--hparams",
        json.dumps(fx.tiny_hparams())))
    assert f"TPU 'grpc://127.0.0.1:{port}' is not reachable" in line, line
    assert "Connection refused" in line, line



# --- KERAS_BACKEND set to another backend (issue 47) ---------------------------------------------
def test_keras_backend_in_the_environment_is_set_to_tensorflow_by_the_tools(monkeypatch, caplog):
    """A JAX user's shell exports KERAS_BACKEND=jax: the TensorFlow tools set it back before
    Keras is imported (it reads it once, at import) and say so in one line."""
    from electra_tf import console

    monkeypatch.delitem(sys.modules, "keras")  # as in a tool before its first import of keras
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        console.use_tensorflow_keras()
    assert os.environ["KERAS_BACKEND"] == "tensorflow"
    assert "KERAS_BACKEND=jax in the environment is ignored" in caplog.text


def test_tensorflow_trainer_under_another_keras_backend_is_one_line_before_writing(
        data_dir, capsys, monkeypatch):
    """Keras imported with the JAX backend before the tool ran (a library caller): one line
    naming the variable, nothing written (was a 41-line traceback after config.json, vocab.txt
    and the manifest were written)."""
    import keras

    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    line = faults.one_error_line(*_main(
        capsys, "--data-dir", data_dir, "--model-name", "keras_jax", "--hparams",
        json.dumps(fx.tiny_hparams(**RUN))))
    assert ("the TensorFlow trainer (--backend tensorflow) needs Keras' tensorflow backend, but "
            "Keras was imported with the jax backend (KERAS_BACKEND=jax in the environment): "
            "set KERAS_BACKEND=tensorflow") in line, line
    assert not os.path.exists(os.path.join(data_dir, "models", "keras_jax"))


def test_reading_a_run_under_another_keras_backend_is_one_line(tmp_path, monkeypatch):
    """Conversion and fine-tuning read a run with TensorFlow's Keras: not "the checkpoint does
    not match config.json"."""
    import keras

    from electra_tf.errors import TrainingError
    from electra_tf.training import run_dir

    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(TrainingError, match=r"reading a run \(conversion, fine-tuning\) needs "
                                            r"Keras' tensorflow backend.*KERAS_BACKEND=jax"):
        run_dir.load_run(str(tmp_path))


@pytest.mark.slow  # a subprocess that trains: ~30 s
def test_run_pretraining_with_keras_backend_jax_trains_with_tensorflow(data_dir):
    proc = subprocess.run(fx.run_pretraining_command(data_dir, "env_jax", fx.tiny_hparams(**RUN)),
                          env=fx.subprocess_env(KERAS_BACKEND="jax"), capture_output=True,
                          text=True, timeout=faults.RUN_TIMEOUT, cwd=fx.REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "KERAS_BACKEND=jax in the environment is ignored" in proc.stderr
    model_dir = os.path.join(data_dir, "models", "env_jax")
    assert os.path.exists(os.path.join(model_dir, "ckpt-2.index")), os.listdir(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        assert json.load(f)["backend"] == "tensorflow"
