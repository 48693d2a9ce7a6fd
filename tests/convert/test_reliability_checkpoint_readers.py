"""A corrupted weight tensor in the newest checkpoint, as `convert to-hf` and fine-tuning see it.

The tensor's bytes in `ckpt-2000.data-*` are flipped on disk (bit rot; the bundle's CRC32C no
longer matches). Both readers must name the checkpoint and the tensor, fall back to the older
intact `ckpt-1000` (a few warning lines, not a config mismatch and ~180 warnings), and a
`--checkpoint` naming the damaged one must fail in one line that says so and names the intact
one beside it.
"""

import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.convert.__main__ import main as convert_main
from electra_tf.finetuning import pretrained
from electra_tf.finetuning.config import FinetuningConfig
from tests import convert_fixtures as cf
from tests import fault_fixtures as faults


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory):
    """A run with intact ckpt-1000 and ckpt-2000 whose largest weight tensor is damaged."""
    root = tmp_path_factory.mktemp("damaged_tensor")
    vocab = cf.text_vocab_path(str(root), real=False)
    model_dir, _, _ = cf.make_model_dir(str(root), cf.tiny_hparams(cf.vocab_size_of(vocab)), vocab,
                                         step=1000)
    for suffix in (".index", ".data-00000-of-00001"):
        shutil.copyfile(os.path.join(model_dir, f"ckpt-1000{suffix}"),
                        os.path.join(model_dir, f"ckpt-2000{suffix}"))
    with open(os.path.join(model_dir, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "ckpt-2000"\nall_model_checkpoint_paths: "ckpt-1000"\n'
                'all_model_checkpoint_paths: "ckpt-2000"\n')
    prefix = os.path.join(model_dir, "ckpt-2000")
    tensor = faults.flip_tensor_bytes(prefix, _largest_weight(prefix))
    return {"root": str(root), "model_dir": model_dir, "tensor": tensor, "prefix": prefix}


def _largest_weight(prefix):
    """(keras 3 keeps the model's variables under optimizer/_trainable_variables/)"""
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    weights = [n for n in shapes if "_trainable_variables/" in n and "OPTIMIZER_SLOT" not in n]
    return max(weights, key=lambda n: (int(np.prod(shapes[n])), n))


def _named(run):
    """The damaged tensor as messages name it: the variable, then its checkpoint key."""
    return f"/kernel ({run['tensor']}) is damaged"


def _assert_fell_back(records, run):
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert any(run["prefix"] in w and "corrupted" in w and _named(run) in w
               for w in warnings), warnings
    assert len(warnings) <= 3, warnings  # named once, not a wall of mismatch warnings


def test_convert_to_hf_names_the_damaged_tensor_and_converts_the_older_checkpoint(
        damaged_run, tmp_path, caplog, capsys):
    out = str(tmp_path / "hf")
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        code = convert_main(["to-hf", "--model-dir", damaged_run["model_dir"], "--output-dir", out])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    _assert_fell_back(caplog.records, damaged_run)
    read = [r.getMessage() for r in caplog.records if r.getMessage().startswith("read ")]
    assert read and os.path.join(damaged_run["model_dir"], "ckpt-1000") in read[0], read
    assert os.path.isfile(os.path.join(out, "config.json"))


def test_convert_an_explicitly_named_damaged_checkpoint_is_one_line(damaged_run, tmp_path, capsys):
    line = faults.one_error_line(
        convert_main(["to-hf", "--model-dir", damaged_run["model_dir"], "--output-dir",
                      str(tmp_path / "hf"), "--checkpoint", damaged_run["prefix"]]),
        capsys.readouterr().err, prog="python -m electra_tf.convert to-hf")
    assert f"checkpoint {damaged_run['prefix']} is corrupted" in line, line
    assert _named(damaged_run) in line, line
    assert "intact checkpoints beside it: ckpt-1000" in line, line
    assert "config.json" not in line, line  # not reported as a config mismatch


def test_finetuning_names_the_damaged_tensor_and_starts_from_the_older_checkpoint(
        damaged_run, caplog):
    config = FinetuningConfig.create("run", os.path.join(damaged_run["root"], "data"),
                                     {"task_names": ["sts"],
                                      "init_checkpoint": damaged_run["model_dir"]})
    with caplog.at_level(logging.INFO, logger="electra_tf"):
        loaded = pretrained.load_pretrained(config)
    _assert_fell_back(caplog.records, damaged_run)
    assert loaded.source == os.path.join(damaged_run["model_dir"], "ckpt-1000"), loaded.source
