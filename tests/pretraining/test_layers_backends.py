"""The objective's Keras layers and ElectraPretrainer on every backend (tests/layer_test_case.py):
shapes and dtypes, get_config / from_config, .keras saving, and on JAX and PyTorch the same
outputs as TensorFlow's (masks and samples bit for bit); and the config round trip of further
constructor arguments (`CONFIG_VARIANTS`: names, options, mixed_bfloat16) on TensorFlow."""

import dataclasses

import keras
import numpy as np
import pytest

from electra_tf.pretraining.layers import (ElectraDiscriminatorOutput, ElectraFakeData,
                                           ElectraMasking)
from electra_tf.pretraining.masking import MaskingOptions
from electra_tf.training.pretrainer import ElectraPretrainer
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


# Constructor arguments beyond the cases above (names, whole-word options, activations, a mixed
# dtype policy, given as get_config writes it), each through get_config / from_config / JSON on
# TensorFlow.
def _masked_shapes(slots):
    """`ElectraMasking`'s output shapes with `slots` masked slots per example."""
    return dict(MASKED_SHAPES, **{k: (BATCH, slots) for k in MASKED_SHAPES
                                  if k.startswith("masked_lm_")})


MIXED = keras.dtype_policies.serialize(keras.DTypePolicy("mixed_bfloat16"))
WIDE = 16
WIDE_OUTPUT = {"sequence_output": _rng.normal(size=(BATCH, SEQ, WIDE)).astype(np.float32),
               "labels": (_rng.random((BATCH, SEQ)) < 0.3).astype(np.int32), "input_mask": MASK}
CONFIG_VARIANTS = {
    "masking_whole_word_named": dataclasses.replace(
        CASES["masking"], init_kwargs={
            "special_tokens": SPECIAL, "seed": 3, "name": "m",
            "masking_options": dict(DEFAULT_OPTIONS, masking="whole_word", mask_prob=0.2,
                                    max_predictions_per_seq=7, mask_with_replacement=False,
                                    continuation_ids=[50, 51])},
        expected_output_shape=_masked_shapes(7)),
    "fake_data_named": dataclasses.replace(
        CASES["fake_data"],
        init_kwargs={"temperature": 0.5, "disallow_correct": True, "seed": 4, "name": "f"}),
    "discriminator_output_relu_named": dataclasses.replace(
        CASES["discriminator_output"], input_data=WIDE_OUTPUT,
        init_kwargs={"hidden_size": WIDE, "hidden_act": "relu", "initializer_range": 0.1,
                     "name": "d"}),
    # Under mixed_bfloat16 the outputs stay float32 / int32 (expected_output_dtype).
    "masking_mixed_bfloat16": dataclasses.replace(
        CASES["masking"], init_kwargs={"special_tokens": SPECIAL, "dtype": MIXED},
        expected_output_shape=_masked_shapes(DEFAULT_OPTIONS["max_predictions_per_seq"])),
    "fake_data_mixed_bfloat16": dataclasses.replace(CASES["fake_data"],
                                                    init_kwargs={"dtype": MIXED}),
    "discriminator_output_mixed_bfloat16": dataclasses.replace(
        CASES["discriminator_output"], input_data=WIDE_OUTPUT,
        init_kwargs={"hidden_size": WIDE, "dtype": MIXED}),
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


@pytest.mark.parametrize("name", CONFIG_VARIANTS)
def test_config_variant(name):
    run_layer_test(CONFIG_VARIANTS[name])
    run_serialization_test(CONFIG_VARIANTS[name])


@pytest.mark.parametrize("name", ["masking_whole_word_named", "fake_data_named",
                                  "discriminator_output_relu_named"])
def test_rebuilt_layer_keeps_every_argument_as_its_attribute(name):
    revived = run_serialization_test(CONFIG_VARIANTS[name])
    base = keras.layers.Layer().get_config()
    for key, value in revived.get_config().items():
        if key not in base:  # the layer's own arguments, stored under the same names
            stored = getattr(revived, key)
            # An options object is written as its fields (MaskingOptions.to_dict).
            stored = stored.to_dict() if isinstance(stored, MaskingOptions) else stored
            assert stored == value, key


@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_every_layer_on_another_backend(backend):
    # rtol / atol 0 where the outputs are integers (masks, samples, labels): bit for bit.
    run_backend_test(backend, list(CASES.values()))


# --- ElectraPretrainer: a whole model through get_config and a .keras file -----------------------
_SCALAR, _TOKENS, _SLOTS = (), (BATCH, SEQ), (BATCH, SLOTS)
PRETRAINER = LayerCase(
    ElectraPretrainer,
    {"discriminator_config": {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 1,
                              "num_attention_heads": 2, "intermediate_size": 32,
                              "embedding_size": 8},
     "generator_config": {"vocab_size": VOCAB, "hidden_size": 8, "num_hidden_layers": 1,
                          "num_attention_heads": 1, "intermediate_size": 16, "embedding_size": 8},
     "special_tokens": SPECIAL, "seed": 3,
     "masking_options": dict(DEFAULT_OPTIONS, max_predictions_per_seq=SLOTS)},
    {"inputs": INPUTS, "seed": SEED},
    expected_output_shape={
        "total_loss": _SCALAR, "masked_lm_loss": _SCALAR, "disc_loss": _SCALAR,
        "metric_inputs": {"input_ids": _TOKENS, "input_mask": _TOKENS, "masked_lm_ids": _SLOTS,
                          "masked_lm_preds": _SLOTS, "masked_lm_weights": _SLOTS,
                          "mlm_loss": _SLOTS, "sampled_tokids": _SLOTS, "disc_loss": (BATCH,),
                          "disc_labels": _TOKENS, "disc_probs": _TOKENS, "disc_preds": _TOKENS}},
    expected_output_dtype={
        "total_loss": "float32", "masked_lm_loss": "float32", "disc_loss": "float32",
        "metric_inputs": {"input_ids": "int32", "input_mask": "int32", "masked_lm_ids": "int32",
                          "masked_lm_preds": "int32", "masked_lm_weights": "float32",
                          "mlm_loss": "float32", "sampled_tokids": "int32",
                          "disc_loss": "float32", "disc_labels": "int32",
                          "disc_probs": "float32", "disc_preds": "int32"}})


def test_pretrainer(tmp_path):
    """get_config -> JSON -> from_config and a .keras file give the same model (weights by path,
    losses and samples exactly)."""
    run_layer_test(PRETRAINER)
    run_serialization_test(PRETRAINER)
    run_saving_test(PRETRAINER, tmp_path)


# JAX dispatches the model op by op in eager calls (~85 s; PyTorch ~40 s).
@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_pretrainer_on_another_backend(backend):
    """The same round trips on JAX and PyTorch; given TensorFlow's weights and seed states, the
    model computes TensorFlow's losses and samples (training False and True)."""
    run_backend_test(backend, [PRETRAINER])


# Constructor arguments beyond PRETRAINER, through get_config / from_config / JSON on TensorFlow.
def _pretrainer_with(masking_options=None, **kwargs):
    options = dict(PRETRAINER.init_kwargs["masking_options"], **(masking_options or {}))
    return dataclasses.replace(
        PRETRAINER, init_kwargs=dict(PRETRAINER.init_kwargs, masking_options=options, **kwargs))


PRETRAINER_VARIANTS = {
    "temperature_without_replacement": _pretrainer_with({"mask_with_replacement": False},
                                                        temperature=0.5),
    "temperature_curriculum_frozen_generator": _pretrainer_with(
        temperature_start=2.0, temperature_decay_steps=10, temperature_schedule="cosine",
        frozen_generator=True),
    "gdes": _pretrainer_with(embedding_sharing="gdes"),
    "whole_word_seeded": _pretrainer_with({"masking": "whole_word", "continuation_ids": [2]},
                                          seed=9),
}


def _frozen_generator_has_no_trainable_variable(model):
    assert not model.generator.trainable_variables


def _masking_layer_has_the_options_and_seed(model):
    assert model.masking.masking_options.continuation_ids == (2,) and model.masking.seed == 9


REBUILT_CHECKS = {  # of the rebuilt model, beyond its config
    "temperature_curriculum_frozen_generator": _frozen_generator_has_no_trainable_variable,
    "whole_word_seeded": _masking_layer_has_the_options_and_seed,
}


@pytest.mark.parametrize("name", PRETRAINER_VARIANTS)
def test_pretrainer_variant(name):
    revived = run_serialization_test(PRETRAINER_VARIANTS[name])
    if name in REBUILT_CHECKS:
        REBUILT_CHECKS[name](revived)
