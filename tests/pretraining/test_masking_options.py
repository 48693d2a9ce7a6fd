"""Masking options as one object and the strategy as a name (issue 36, item 4): the registry,
and configs saved before (`whole_word_masking` and the options one by one) loading as the same
masking."""

import json

import keras
import numpy as np
import pytest

from electra_tf.config import hparam_checks
from electra_tf.pretraining import masking
from electra_tf.pretraining.layers import ElectraMasking
from electra_tf.pretraining.masking import MaskingOptions
from electra_tf.training.pretrainer import ElectraPretrainer
from tests.pretraining.test_pretrainer import SPECIAL

# Written by ElectraMasking.get_config before MaskingOptions (keras.saving.serialize_keras_object).
OLD_MASKING = {
    "module": "electra_tf.pretraining.layers", "class_name": "ElectraMasking",
    "config": {"name": "m", "trainable": True,
               "dtype": {"module": "keras", "class_name": "DTypePolicy",
                         "config": {"name": "float32"}, "registered_name": None},
               "special_tokens": {"pad_id": 0, "unk_id": 1, "cls_id": 2, "sep_id": 3,
                                  "mask_id": 4},
               "mask_prob": 0.2, "max_predictions_per_seq": 7, "mask_with_replacement": False,
               "whole_word_masking": True, "continuation_ids": [50, 51], "seed": 3},
    "registered_name": "electra_tf>ElectraMasking"}
# Written by ElectraPretrainer.get_config before MaskingOptions.
OLD_PRETRAINER = {
    "name": "pretrainer", "trainable": True,
    "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
              "registered_name": None},
    "discriminator_config": {"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "intermediate_size": 32,
                             "embedding_size": 8},
    "generator_config": {"vocab_size": 60, "hidden_size": 8, "num_hidden_layers": 1,
                         "num_attention_heads": 1, "intermediate_size": 16, "embedding_size": 8},
    "special_tokens": {"pad_id": 0, "unk_id": 1, "cls_id": 2, "sep_id": 3, "mask_id": 4},
    "mask_prob": 0.15, "max_predictions_per_seq": 5, "electra_objective": True,
    "uniform_generator": False, "untied_generator": True, "untied_generator_embeddings": False,
    "embedding_sharing": "tied", "disallow_correct": False, "temperature": 1.0,
    "frozen_generator": False, "temperature_start": None, "temperature_decay_steps": None,
    "temperature_schedule": "linear", "gen_weight": 1.0, "disc_weight": 50.0,
    "mask_with_replacement": True, "whole_word_masking": True, "continuation_ids": [50, 51],
    "seed": 3, "discriminator_encoder": None, "generator_encoder": None}
OLD_KEYS = set(masking.LEGACY_KEYS)


def _batch(size=4, length=16):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 60, (size, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = SPECIAL.cls_id, SPECIAL.sep_id
    return {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}


def _assert_same(a, b):
    assert set(a) == set(b)
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def test_every_masking_hparam_value_is_a_strategy():
    assert tuple(masking.STRATEGIES) == hparam_checks.MASKINGS
    assert masking.STRATEGIES["whole_word"].needs_word_starts
    assert not masking.STRATEGIES["random"].needs_word_starts
    with pytest.raises(ValueError, match="masking must be one of random, whole_word, got 'span'"):
        MaskingOptions(masking="span")


def test_options_are_one_frozen_object_written_as_their_fields():
    options = MaskingOptions(masking="whole_word", continuation_ids=[3, 1])
    assert options.continuation_ids == (3, 1)
    with pytest.raises(AttributeError):
        options.mask_prob = 0.2
    assert MaskingOptions.of(json.loads(json.dumps(options.to_dict()))) == options
    assert MaskingOptions.of(None) == MaskingOptions()
    layer = ElectraMasking(SPECIAL, options)
    assert layer.masking_options is options
    assert layer.get_config()["masking_options"] == options.to_dict()


def test_a_masking_layer_saved_before_loads_as_the_same_masking():
    layer = keras.saving.deserialize_keras_object(json.loads(json.dumps(OLD_MASKING)))
    assert isinstance(layer, ElectraMasking) and (layer.name, layer.seed) == ("m", 3)
    expected = MaskingOptions(masking="whole_word", mask_prob=0.2, max_predictions_per_seq=7,
                              mask_with_replacement=False, continuation_ids=(50, 51))
    assert layer.masking_options == expected
    assert not OLD_KEYS & set(layer.get_config())
    batch = _batch()
    _assert_same(layer(batch, seed=5), ElectraMasking(SPECIAL, expected, seed=3)(batch, seed=5))
    old_random = dict(OLD_MASKING["config"], whole_word_masking=False)
    assert ElectraMasking.from_config(old_random).masking_options.masking == "random"


def test_a_pretrainer_saved_before_loads_as_the_same_model():
    model = ElectraPretrainer.from_config(json.loads(json.dumps(OLD_PRETRAINER)))
    assert model.masking_options == MaskingOptions(
        masking="whole_word", max_predictions_per_seq=5, continuation_ids=(50, 51))
    assert model.masking.masking_options is model.masking_options
    config = model.get_config()
    assert not OLD_KEYS & set(config)
    assert ElectraPretrainer.from_config(config).get_config() == config
    new = {k: v for k, v in OLD_PRETRAINER.items() if k not in OLD_KEYS}
    again = ElectraPretrainer(**new, masking_options={
        "masking": "whole_word", "max_predictions_per_seq": 5, "continuation_ids": [50, 51]})
    batch = _batch()
    _assert_same(model.mask(batch, seed=7), again.mask(batch, seed=7))


def test_old_keys_beside_masking_options_are_refused():
    with pytest.raises(ValueError, match="masking_options only"):
        masking.upgrade_config({"masking_options": {}, "mask_prob": 0.2})
    assert masking.upgrade_config({"seed": 1}) == {"seed": 1}
