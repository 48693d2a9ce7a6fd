"""ElectraPretrainer (training/pretrainer.py): the pretraining model with Keras' training hooks,
kept out of the model's own package (issue 36, item 1)."""

import keras

from electra_tf.pretraining.model import PretrainingModel
from electra_tf.training.pretrainer import ElectraPretrainer
from tests.pretraining.test_pretrainer import SPECIAL, tiny_config

TRAINING_HOOKS = ("compile", "train_step", "test_step", "reset_metrics")


def test_the_model_leaves_keras_training_hooks_to_the_subclass():
    for name in TRAINING_HOOKS:
        assert getattr(PretrainingModel, name) is getattr(keras.Model, name), name
        assert getattr(ElectraPretrainer, name) is not getattr(keras.Model, name), name


def test_every_built_model_is_fit_capable_and_keeps_its_keras_name():
    model = ElectraPretrainer.from_pretraining_config(tiny_config(), SPECIAL)
    assert type(model) is ElectraPretrainer
    # The name saved models (.keras files, get_config dicts) were written under.
    assert keras.saving.get_registered_name(ElectraPretrainer) == "electra_tf>ElectraPretrainer"
    assert keras.saving.get_registered_object("electra_tf>ElectraPretrainer") is ElectraPretrainer
    assert keras.saving.serialize_keras_object(model)["registered_name"] == \
        "electra_tf>ElectraPretrainer"
