"""The objective's Keras layers and ElectraPretrainer on every backend (tests/layer_test_case.py):
shapes and dtypes, get_config / from_config, .keras saving, and on JAX and PyTorch the same
outputs as TensorFlow's (masks and samples bit for bit)."""

import json

import numpy as np
import pytest

from electra_tf.pretraining.layers import (ElectraDiscriminatorOutput, ElectraFakeData,
                                           ElectraMasking)
from electra_tf.pretraining.masking import MaskingOptions
from tests import backends
from tests.layer_test_case import (LayerCase, run_backend_test, run_layer_test, run_saving_test,
                                   run_serialization_test)

BATCH, SEQ, SLOTS, VOCAB, HIDDEN = 3, 16, 4, 50, 8
SPECIAL = {"pad_id": 0, "unk_id": 1, "cls_id": 2, "sep_id": 3, "mask_id": 4}
_rng = np.random.default_rng(0)
IDS = _rng.integers(5, VOCAB, (BATCH, SEQ)).astype(np.int32)
MASK = (np.arange(SEQ)[None, :] < np.array([[SEQ], [11], [6]])).astype(np.int32)
IDS[:, 0] = SPECIAL["cls_id"]
IDS = IDS * MASK
SEGMENTS = ((np.arange(SEQ)[None, :] >= 5) & (MASK > 0)).astype(np.int32)
INPUTS = {"input_ids": IDS, "input_mask": MASK, "segment_ids": SEGMENTS}
SEED = np.array([7, 3], np.int32)
MASKED = {  # a masked batch: slots 0..2 used at positions 1..3, [MASK] at 1 and 2
    "input_ids": np.where(np.isin(np.arange(SEQ), [1, 2]), SPECIAL["mask_id"], IDS).astype(np.int32),
    "input_mask": MASK, "segment_ids": SEGMENTS,
    "masked_lm_positions": np.tile(np.array([[1, 2, 3, 0]], np.int32), (BATCH, 1)),
    "masked_lm_ids": np.stack([IDS[:, 1], IDS[:, 2], IDS[:, 3], np.zeros(BATCH, np.int32)], 1),
    "masked_lm_weights": np.tile(np.array([[1, 1, 1, 0]], np.float32), (BATCH, 1)),
}
MASKED_SHAPES = {"input_ids": (BATCH, SEQ), "input_mask": (BATCH, SEQ), "segment_ids": (BATCH, SEQ),
                 "masked_lm_positions": (BATCH, SLOTS), "masked_lm_ids": (BATCH, SLOTS),
                 "masked_lm_weights": (BATCH, SLOTS)}
MASKED_DTYPES = {k: "float32" if k == "masked_lm_weights" else "int32" for k in MASKED_SHAPES}
# A layer's config holds every option (run_layer_test compares it with init_kwargs).
DEFAULT_OPTIONS = MaskingOptions().to_dict()

CASES = {
    "masking": LayerCase(
        ElectraMasking,
        {"special_tokens": SPECIAL,
         "masking_options": dict(DEFAULT_OPTIONS, max_predictions_per_seq=SLOTS, mask_prob=0.3),
         "seed": 5},
        {"inputs": INPUTS, "seed": SEED},
        expected_output_shape=MASKED_SHAPES, expected_output_dtype=MASKED_DTYPES, training=False),
    "whole_word": LayerCase(
        ElectraMasking,
        {"special_tokens": SPECIAL,
         "masking_options": dict(DEFAULT_OPTIONS, max_predictions_per_seq=SLOTS, mask_prob=0.3,
                                 masking="whole_word", continuation_ids=list(range(30, 50)),
                                 mask_with_replacement=False)},
        {"inputs": INPUTS, "seed": SEED},
        expected_output_shape=MASKED_SHAPES, expected_output_dtype=MASKED_DTYPES, training=False),
    "fake_data": LayerCase(
        ElectraFakeData, {"temperature": 0.7, "disallow_correct": True, "seed": 9},
        {"masked": MASKED, "mlm_logits": _rng.normal(size=(BATCH, SLOTS, VOCAB)).astype(np.float32),
         "seed": SEED},
        expected_output_shape={"input_ids": (BATCH, SEQ), "is_fake": (BATCH, SEQ),
                               "sampled_ids": (BATCH, SLOTS), "input_mask": (BATCH, SEQ),
                               "segment_ids": (BATCH, SEQ)},
        expected_output_dtype="int32", training=False),
    "discriminator_output": LayerCase(
        ElectraDiscriminatorOutput, {"hidden_size": HIDDEN},
        {"sequence_output": _rng.normal(size=(BATCH, SEQ, HIDDEN)).astype(np.float32),
         "labels": (_rng.random((BATCH, SEQ)) < 0.2).astype(np.int32), "input_mask": MASK},
        expected_output_shape={"logits": (BATCH, SEQ), "probs": (BATCH, SEQ),
                               "preds": (BATCH, SEQ), "labels": (BATCH, SEQ), "loss": (),
                               "per_example_loss": (BATCH,)},
        expected_output_dtype={"logits": "float32", "probs": "float32", "preds": "int32",
                               "labels": "int32", "loss": "float32",
                               "per_example_loss": "float32"},
        training=False),
}


@pytest.mark.parametrize("name", CASES)
def test_layer(name):
    run_layer_test(CASES[name])


@pytest.mark.parametrize("name", CASES)
def test_serialization(name):
    run_serialization_test(CASES[name])


@pytest.mark.parametrize("name", CASES)
def test_keras_file_saving(name, tmp_path):
    run_saving_test(CASES[name], tmp_path)


@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_every_layer_on_another_backend(backend):
    # rtol / atol 0 where the outputs are integers (masks, samples, labels): bit for bit.
    run_backend_test(backend, list(CASES.values()))


# --- ElectraPretrainer: a whole model through get_config and a .keras file -----------------------
_PRETRAINER = """
import json, os, tempfile
import keras
from keras import ops
from electra_tf.training.pretrainer import ElectraPretrainer

model_config = json.loads(str(inp["model_config"]))
keras.utils.set_random_seed(0)
model = ElectraPretrainer(**model_config)
model.build_from_sequence_length()
if "weights" in inp:
    model.set_weights([inp[f"w{i}"] for i in range(int(inp["weights"]))])
batch = {k: inp[k] for k in ("input_ids", "input_mask", "segment_ids")}
seed = ops.convert_to_tensor(inp["seed"])

def outputs(m):
    o = m(batch, seed=seed, training=False)
    return {"total_loss": ops.convert_to_numpy(o["total_loss"]),
            "sampled": ops.convert_to_numpy(o["metric_inputs"]["sampled_tokids"])}

expected = outputs(model)
config = model.get_config()
assert json.loads(json.dumps(config)) == config
revived = ElectraPretrainer.from_config(json.loads(json.dumps(config)))
revived.build_from_sequence_length()
revived.set_weights(model.get_weights())
assert revived.get_config() == config
got = outputs(revived)
np.testing.assert_allclose(got["total_loss"], expected["total_loss"], rtol=1e-6)
np.testing.assert_array_equal(got["sampled"], expected["sampled"])
with tempfile.TemporaryDirectory() as directory:
    path = os.path.join(directory, "pretrainer.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert type(restored) is ElectraPretrainer and restored.get_config() == config
    # The heads are built by the first call, under the model's name scope; a loaded model
    # builds them from its build config, outside it. Same variables, one path prefix less.
    strip = lambda path: path.split("/", 1)[1] if path.startswith(model.name + "/") else path
    assert [strip(v.path) for v in restored.weights] == [strip(v.path) for v in model.weights]
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    got = outputs(restored)
    np.testing.assert_allclose(got["total_loss"], expected["total_loss"], rtol=1e-6)
for i, w in enumerate(model.get_weights()):
    out[f"w{i}"] = w
out["weights"] = np.array(len(model.get_weights()))
out.update({k: v for k, v in expected.items()})
"""

_MODEL_CONFIG = {
    "discriminator_config": {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "intermediate_size": 32,
                             "embedding_size": 8},
    "generator_config": {"vocab_size": VOCAB, "hidden_size": 8, "num_hidden_layers": 1,
                         "num_attention_heads": 1, "intermediate_size": 16, "embedding_size": 8},
    "special_tokens": SPECIAL, "masking_options": {"max_predictions_per_seq": SLOTS}, "seed": 3,
}


@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=pytest.mark.slow),
                                     "torch"])
def test_pretrainer_config_and_keras_file_round_trip(backend):
    """On each backend: get_config -> JSON -> from_config and a .keras file give the same model
    (weights by path, losses and samples); given TensorFlow's weights, JAX and PyTorch compute
    TensorFlow's loss and samples."""
    if backend != "tensorflow":
        backends.require(backend)
    inputs = dict(INPUTS, seed=SEED, model_config=np.array(json.dumps(_MODEL_CONFIG)))
    ours = backends.run_on_backend("tensorflow", _PRETRAINER, inputs)
    if backend == "tensorflow":
        return
    inputs.update({k: v for k, v in ours.items() if k.startswith("w")})
    theirs = backends.run_on_backend(backend, _PRETRAINER, inputs)
    np.testing.assert_allclose(theirs["total_loss"], ours["total_loss"], rtol=1e-5)
    np.testing.assert_array_equal(theirs["sampled"], ours["sampled"])
