"""Fine-tuning's starting point across backends (issue 48, item 1): a JAX pretraining run's
`ckpt-N.npz` read by fine-tuning on JAX (no TensorFlow) and on TensorFlow, and a TensorFlow run
read by fine-tuning on JAX (through its TensorFlow child), all giving the discriminator encoder
the run saved.
"""

import json
import os

import numpy as np
import pytest

from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.pretrained import load_pretrained
from tests import backends
from tests.finetuning_fixtures import tiny_pretrained, write_vocab

STEP = 7
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran"]

# A JAX pretraining run directory as `run_pretraining.py --backend jax` leaves it (config.json,
# vocab.txt, ckpt-7.npz), and the discriminator encoder's weights it holds.
_JAX_RUN = """
import os, shutil
import keras
from electra_tf.config import PretrainingConfig
from electra_tf.training import npz_checkpoint
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import load_vocab

root, vocab_path = str(inp["root"]), str(inp["vocab"])
vocab = load_vocab(vocab_path)
config = PretrainingConfig.create("jaxrun", root, {
    "backend": "jax", "vocab_size": vocab.size, "embedding_size": 16, "max_seq_length": 32,
    "model_hparam_overrides": {"hidden_size": 32, "num_hidden_layers": 2,
                               "num_attention_heads": 2, "intermediate_size": 64}})
keras.utils.set_random_seed(3)
model = ElectraPretrainer.from_pretraining_config(config, vocab.special)
model.build_from_sequence_length()
os.makedirs(config.model_dir)
config.save(os.path.join(config.model_dir, "config.json"))
shutil.copyfile(vocab_path, os.path.join(config.model_dir, "vocab.txt"))
npz_checkpoint.save(config.model_dir, int(inp["step"]), model, None, None, None)
for i, w in enumerate(model.exported_discriminator().get_weights()):
    out[f"w{i}"] = w
"""

# load_pretrained on this backend, its encoder weights and what it says it read.
_LOAD = """
import json
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.pretrained import load_pretrained
p = load_pretrained(FinetuningConfig.create(str(inp["name"]), str(inp["root"]),
                                            {"task_names": ["chunk"]}))
for i, w in enumerate(p.weights):
    out[f"w{i}"] = w
out["meta"] = np.array(json.dumps({"kind": p.kind, "source": p.source, "step": p.step,
                                   "encoder": p.encoder_config}))
"""


def _weights(arrays):
    return [arrays[f"w{i}"] for i in range(sum(k.startswith("w") for k in arrays))]


def _assert_same(got, expected):
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_jax_runs_ckpt_npz_starts_fine_tuning_on_jax_and_on_tensorflow(tmp_path):
    backends.require("jax")
    root = str(tmp_path)
    vocab = write_vocab(os.path.join(root, "vocab.txt"), WORDS)
    saved = _weights(backends.run_on_backend("jax", _JAX_RUN, {
        "root": np.array(root), "vocab": np.array(vocab), "step": np.array(STEP)}))
    model_dir = os.path.join(root, "models", "jaxrun")
    assert sorted(os.listdir(model_dir)) == sorted(["config.json", f"ckpt-{STEP}.npz", "vocab.txt"])

    on_jax = backends.run_on_backend("jax", _LOAD, {"name": np.array("jaxrun"),
                                                    "root": np.array(root)})
    meta = json.loads(str(on_jax["meta"]))
    assert (meta["kind"], meta["source"], meta["step"]) == (
        "model_dir", os.path.join(model_dir, f"ckpt-{STEP}.npz"), STEP)
    assert meta["encoder"]["hidden_size"] == 32
    _assert_same(_weights(on_jax), saved)

    on_tensorflow = load_pretrained(FinetuningConfig.create("jaxrun", root,
                                                            {"task_names": ["chunk"]}))
    assert on_tensorflow.step == STEP
    _assert_same(on_tensorflow.weights, saved)


@pytest.mark.slow
def test_a_tensorflow_run_starts_fine_tuning_on_jax_through_a_tensorflow_child(tmp_path):
    backends.require("jax")
    root = str(tmp_path)
    tiny_pretrained(root, write_vocab(os.path.join(root, "src_vocab.txt"), WORDS))
    expected = load_pretrained(FinetuningConfig.create("tiny", root, {"task_names": ["chunk"]}))
    # TensorFlow importable in the child: the JAX process reads the run through its own child.
    on_jax = backends.run_on_backend("jax", _LOAD, {"name": np.array("tiny"),
                                                    "root": np.array(root)},
                                     block_tensorflow=False)
    assert json.loads(str(on_jax["meta"]))["step"] == expected.step
    _assert_same(_weights(on_jax), expected.weights)
