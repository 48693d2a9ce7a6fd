"""A damaged `ckpt-N.npz` (a JAX / PyTorch run's checkpoint), as every reader sees it (issue 47).

The zip stays readable but one member's bytes are flipped (bit rot, a bad copy: its CRC-32 no
longer matches), or a member is missing. Every reader (`latest_good`: the JAX / PyTorch trainer's
resume, `load_run`: the converters and fine-tuning) reads all members back before choosing a
checkpoint: the damaged newest one is named in a warning and the older intact one read; one asked
for by name is a one-line error naming the intact ones beside it; all damaged is an error, never
a fresh start over them.
"""

import logging
import os
import shutil
import zipfile

import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.errors import TrainingError
from electra_tf.finetuning import pretrained
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.training import npz_checkpoint, optimization, run_dir
from electra_tf.training.pretrainer import ElectraPretrainer
from tests import convert_fixtures as cf

pytestmark = pytest.mark.usefixtures("float32_policy")


def flip_member_bytes(path: str, member: str) -> None:
    """Inverts 8 bytes in the middle of `member`'s stored data (its CRC-32 no longer matches)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    with open(path, "rb") as f:  # the local header: 30 bytes, then the name and extra field
        f.seek(info.header_offset + 26)
        name_length, extra_length = (int.from_bytes(f.read(2), "little") for _ in range(2))
    middle = info.header_offset + 30 + name_length + extra_length + info.compress_size // 2
    with open(path, "r+b") as f:
        f.seek(middle)
        data = f.read(8)
        f.seek(middle)
        f.write(bytes(b ^ 0xFF for b in data))


def drop_member(path: str, member: str) -> None:
    """Rewrites the archive without `member`."""
    with zipfile.ZipFile(path) as archive:
        kept = [(info, archive.read(info)) for info in archive.infolist()
                if info.filename != member]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in kept:
            archive.writestr(info, data)


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    """A `--backend jax` run directory: config.json, vocab.txt, ckpt-1000.npz and ckpt-2000.npz
    (written by `npz_checkpoint.save`, as the JAX trainer does)."""
    root = str(tmp_path_factory.mktemp("portable_run"))
    vocab = cf.text_vocab_path(root, real=False)
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab), backend="jax")
    model_dir, model, _ = cf.make_model_dir(root, hparams, vocab, step=1000)
    for name in os.listdir(model_dir):  # the TensorFlow checkpoint make_model_dir writes
        if name.startswith("ckpt-") or name == "checkpoint":
            os.remove(os.path.join(model_dir, name))
    config = PretrainingConfig.load(os.path.join(model_dir, "config.json"))
    optimizer, _ = optimization.create_optimizer(config, config.optimizer)
    optimizer.build(model.trainable_variables)
    for step in (1000, 2000):
        npz_checkpoint.save(model_dir, step, model, optimizer, None, None)
    return {"root": root, "model_dir": model_dir, "model": model, "optimizer": optimizer}


@pytest.fixture
def damaged_run(jax_run, tmp_path):
    """A copy of the run whose ckpt-2000.npz has one member failing its CRC."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(jax_run["model_dir"], model_dir)
    newest = os.path.join(model_dir, "ckpt-2000.npz")
    flip_member_bytes(newest, "model/0.npy")
    return {"model_dir": model_dir, "newest": newest, "root": jax_run["root"]}


def _warnings(records):
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_a_member_failing_its_crc_is_skipped_for_the_older_checkpoint(damaged_run, caplog):
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        found = npz_checkpoint.latest_good(damaged_run["model_dir"])
    assert found == os.path.join(damaged_run["model_dir"], "ckpt-1000.npz")
    warnings = _warnings(caplog.records)
    assert any(damaged_run["newest"] in w and "member model/0.npy fails its CRC-32 check" in w
               for w in warnings), warnings
    assert len(warnings) <= 2, warnings


def test_a_missing_member_is_skipped_for_the_older_checkpoint(jax_run, tmp_path, caplog):
    model_dir = str(tmp_path / "run")
    shutil.copytree(jax_run["model_dir"], model_dir)
    drop_member(os.path.join(model_dir, "ckpt-2000.npz"), "optimizer/1.npy")
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        found = npz_checkpoint.latest_good(model_dir)
    assert found.endswith("ckpt-1000.npz")
    assert "incomplete (member optimizer/1.npy missing)" in caplog.text


def test_all_checkpoints_damaged_is_an_error_not_a_fresh_start(damaged_run):
    flip_member_bytes(os.path.join(damaged_run["model_dir"], "ckpt-1000.npz"), "model/1.npy")
    with pytest.raises(TrainingError, match=r"no intact checkpoint in .*ckpt-2000.npz damaged "
                                            r".*ckpt-1000.npz damaged .*--overwrite"):
        npz_checkpoint.latest_good(damaged_run["model_dir"])


def test_restore_of_a_damaged_file_is_one_line(damaged_run, jax_run):
    model = ElectraPretrainer.from_config(jax_run["model"].get_config())
    model.build_from_sequence_length()
    with pytest.raises(TrainingError, match=r"ckpt-2000.npz is damaged \(Bad CRC-32"):
        npz_checkpoint.restore(damaged_run["newest"], model, None)


def test_converters_read_the_older_checkpoint(damaged_run, caplog):
    """`load_run`: what to-onnx, to-hf, to-keras-hub and to-google read."""
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        loaded = run_dir.load_run(damaged_run["model_dir"])
    assert loaded.step == 1000 and loaded.checkpoint.endswith("ckpt-1000.npz")
    assert any("fails its CRC-32 check" in w for w in _warnings(caplog.records))


def test_a_damaged_checkpoint_named_explicitly_names_the_intact_ones(damaged_run):
    with pytest.raises(TrainingError) as raised:
        run_dir.load_run(damaged_run["model_dir"], damaged_run["newest"])
    line = str(raised.value)
    assert "\n" not in line and "ckpt-2000.npz is damaged (member model/0.npy" in line, line
    assert "intact checkpoints beside it: ckpt-1000.npz" in line, line
    assert "config.json" not in line, line  # not reported as a config mismatch


def test_finetuning_starts_from_the_older_checkpoint(damaged_run, caplog):
    config = FinetuningConfig.create("run", os.path.join(damaged_run["root"], "data"),
                                     {"task_names": ["sts"],
                                      "init_checkpoint": damaged_run["model_dir"]})
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        loaded = pretrained.load_pretrained(config)
    assert loaded.source.endswith("ckpt-1000.npz"), loaded.source
    assert any("fails its CRC-32 check" in w for w in _warnings(caplog.records))
