"""Continuing Google's checkpoints on JAX and PyTorch (issue 48, item 4).

`from-google` writes init_checkpoint/ with TensorFlow's `ckpt-0` and the same model and step as
`ckpt-0.npz` (the portable checkpoint format); `run_pretraining.py --backend jax|torch` starts
from the latter, in a child that cannot import TensorFlow, at the imported step with a fresh
optimizer, as the TensorFlow trainer starts from the former. Checked, from one fake official
TF1 checkpoint (global_step 4000) imported once:

- the first step's losses equal the TensorFlow trainer's from the same import (rtol 1e-6;
  measured: JAX bit-identical, PyTorch 9e-8), the next three steps' and the held-out eval
  within rtol 1e-4 (measured at most 6e-6 / 1.4e-5 on JAX, 2.2e-5 / 3.8e-5 on PyTorch), at
  the README's continuation rate (2e-4 at the imported step, fresh Adam moments) (slow);
- an import directory's config.json (backend tensorflow) does not stop a JAX run, while a run's
  own checkpoints of another backend still do; the converters read a JAX run that stopped
  before its first save (the import);
- an import holding TensorFlow's checkpoint only (before this copy was written) and a damaged
  copy are one-line errors naming the fix.
"""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.convert import google
from electra_tf.errors import TrainingError
from electra_tf.training import checkpoint_files, npz_checkpoint, run_dir
from electra_tf.training.portable import resume as portable_resume
from electra_tf.training.tf import trainer as trainer_lib
from electra_tf.vocab import load_vocab
from tests import backends, convert_fixtures as cf, pretraining_fixtures as fx

pytestmark = pytest.mark.usefixtures("float32_policy")

IMPORTED_STEP, STEPS = 4000, 4
LOSSES = ("total_loss", "masked_lm_loss", "disc_loss")
EVAL_KEYS = ("loss", "masked_lm_loss", "disc_loss", "disc_accuracy", "masked_lm_accuracy")
TIMEOUT = 600


@pytest.fixture(scope="module")
def imported(data_dir, tmp_path_factory):
    """A fake official checkpoint imported into DATA_DIR/models/imported, and the hparams that
    continue it for STEPS steps (the official README's rule: 2e-4 at the imported step)."""
    weights = cf.official_weights(fx.VOCAB_SIZE, generator_hidden=16)
    prefix = cf.write_google_checkpoint(str(tmp_path_factory.mktemp("google") / "model.ckpt"),
                                        weights, global_step=IMPORTED_STEP)
    result = google.import_google_checkpoint(
        prefix, os.path.join(data_dir, "vocab.txt"), _model_dir(data_dir, "imported"),
        hparams={"max_seq_length": fx.MAX_SEQ_LENGTH})
    hparams = google.continue_hparams(result.hparams, IMPORTED_STEP, extra_steps=STEPS)
    hparams.update(train_batch_size=8, eval_batch_size=8, num_eval_steps=2,
                   iterations_per_loop=1, save_checkpoints_steps=1000, do_export=False,
                   mixed_precision="float32")
    return hparams


def _model_dir(data_dir, name):
    return os.path.join(data_dir, "models", name)


def _copy_import(data_dir, name):
    shutil.copytree(_model_dir(data_dir, "imported"), _model_dir(data_dir, name))
    return _model_dir(data_dir, name)


def _config(data_dir, name, hparams, **overrides):
    return PretrainingConfig.create(name, data_dir, dict(hparams, **overrides))


# --- The portable copy and the run directory (fast) ------------------------------------------------
def test_an_import_starts_a_run_on_any_backend_but_a_run_resumes_on_its_own(data_dir, imported):
    model_dir = _copy_import(data_dir, "switch")
    vocab = load_vocab(os.path.join(model_dir, "vocab.txt"))
    jax_config = _config(data_dir, "switch", imported, backend="jax")
    run_dir.prepare(jax_config, jax_config.vocab_file, vocab.sha256, write=True)
    assert PretrainingConfig.load(os.path.join(model_dir, "config.json")).backend == "jax"
    # A JAX run stopped before its first save: the converters read the imported weights.
    loaded = run_dir.load_run(model_dir)
    assert loaded.step == IMPORTED_STEP
    assert loaded.checkpoint.endswith(os.path.join(checkpoint_files.INIT_CHECKPOINT_DIR, "ckpt-0"))
    # Once the JAX run has saved, the TensorFlow trainer refuses it (the formats differ).
    shutil.copy(os.path.join(model_dir, checkpoint_files.INIT_CHECKPOINT_DIR,
                             checkpoint_files.INIT_PORTABLE_NAME),
                os.path.join(model_dir, npz_checkpoint.file_name(IMPORTED_STEP + 1)))
    tf_config = _config(data_dir, "switch", imported)
    with pytest.raises(TrainingError, match="holds a run trained with --backend jax"):
        run_dir.prepare(tf_config, tf_config.vocab_file, vocab.sha256, write=True)


def test_an_import_without_its_portable_copy_is_one_line_naming_the_fix(data_dir, imported):
    model_dir = _copy_import(data_dir, "old_import")
    os.remove(os.path.join(model_dir, checkpoint_files.INIT_CHECKPOINT_DIR,
                           checkpoint_files.INIT_PORTABLE_NAME))
    with pytest.raises(TrainingError) as raised:
        portable_resume.imported_start(model_dir, "jax")
    message = str(raised.value)
    assert "\n" not in message
    assert "holds TensorFlow's checkpoint only" in message and "--backend jax cannot" in message
    assert "from-google ... --output-dir" in message and "--overwrite" in message
    assert message.endswith("or train with --backend tensorflow")
    assert portable_resume.imported_start(_model_dir(data_dir, "none"), "jax") is None


def test_a_damaged_portable_copy_is_one_line_naming_the_fix(data_dir, imported):
    model_dir = _copy_import(data_dir, "damaged_import")
    path = os.path.join(model_dir, checkpoint_files.INIT_CHECKPOINT_DIR,
                        checkpoint_files.INIT_PORTABLE_NAME)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(TrainingError, match=r"the imported checkpoint \S+ckpt-0\.npz is "
                                            r"(damaged|unreadable).*: import the weights "
                                            r"again: electra-convert from-google"):
        portable_resume.imported_start(model_dir, "torch")


# --- The same first steps as the TensorFlow trainer (slow) -----------------------------------------
@pytest.fixture(scope="module")
def reference(data_dir, imported):
    """The TensorFlow trainer's first STEPS steps from the import, and its eval."""
    _copy_import(data_dir, "tf")
    with trainer_lib.Trainer(_config(data_dir, "tf", imported)) as trainer:
        assert trainer.step == IMPORTED_STEP
        trainer.train()
        eval_results = trainer.evaluate()
    return {"scalars": fx.read_scalars(_model_dir(data_dir, "tf"), LOSSES), "eval": eval_results}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_continuing_an_import_gives_the_tensorflow_trainers_losses(data_dir, imported, reference,
                                                                   backend):
    backends.require(backend)
    model_dir = _copy_import(data_dir, backend)
    command = backends.blocked_tool_command(
        "run_pretraining.py", "--data-dir", data_dir, "--model-name", backend,
        "--hparams", json.dumps(dict(imported, do_eval=True)), "--backend", backend)
    proc = subprocess.run(command, env=fx.subprocess_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=fx.REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (f"initialised from the imported checkpoint {model_dir}/init_checkpoint/ckpt-0.npz "
            f"(step {IMPORTED_STEP}, fresh optimizer)") in proc.stderr
    assert f"training from step {IMPORTED_STEP} to {IMPORTED_STEP + STEPS}" in proc.stderr
    got = fx.read_scalars(model_dir, LOSSES)
    steps = list(range(IMPORTED_STEP + 1, IMPORTED_STEP + STEPS + 1))
    for tag in LOSSES:
        want = reference["scalars"][tag]
        assert sorted(got[tag]) == sorted(want) == steps, tag
        # The first step: the same weights in, the same loss out (measured within 1e-7).
        assert got[tag][steps[0]] == pytest.approx(want[steps[0]], rel=1e-6), tag
        np.testing.assert_allclose([got[tag][s] for s in steps], [want[s] for s in steps],
                                   rtol=1e-4, err_msg=tag)
    with open(os.path.join(model_dir, "eval_results.txt")) as f:
        results = {k.strip(): float(v) for k, v in (line.split("=") for line in f)}
    assert results["global_step"] == IMPORTED_STEP + STEPS
    for key in EVAL_KEYS:
        assert results[key] == pytest.approx(reference["eval"][key], rel=1e-4), key
    # The run's own checkpoint from now on (no step-0 save: it started at the imported step).
    assert npz_checkpoint.checkpoints(model_dir) == [
        npz_checkpoint.path_for(model_dir, IMPORTED_STEP + STEPS)]
