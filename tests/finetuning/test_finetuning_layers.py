"""Every Keras layer of electra_tf.finetuning, declaratively (tests/layer_test_case.py): the heads
of each family, `TaskHeads` and `FinetuningModel`: shapes and dtypes (training and inference),
get_config / from_config through JSON, and .keras saving.

On TensorFlow only: the heads are written in TensorFlow ops (`run_backend_test` runs a case
where TensorFlow cannot be imported). What each head computes is checked against numpy in
tests/finetuning/test_finetuning_heads.py."""

import numpy as np
import pytest

from electra_tf.finetuning.model import ClassificationHead, FinetuningModel, TaskHeads
from electra_tf.finetuning.qa.head import QAHead
from electra_tf.finetuning.regression.head import RegressionHead
from electra_tf.finetuning.tagging.head import TaggingHead
from tests.layer_test_case import (LayerCase, run_layer_test, run_saving_test,
                                   run_serialization_test)

BATCH, SEQ, HIDDEN, BEAM, SLOTS = 2, 10, 8, 4, 4
_rng = np.random.default_rng(0)
SEQUENCE_OUTPUT = _rng.normal(size=(BATCH, SEQ, HIDDEN)).astype(np.float32)
# Record 0: [CLS] q q [SEP] c c c c [SEP] pad; record 1: [CLS] q [SEP] c c c c c c [SEP].
INPUT_MASK = np.array([[1] * 9 + [0], [1] * 10], np.int32)
SEGMENT_IDS = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]], np.int32)
FEATURES = {  # every head's features, `<task>_<key>`, for the task names below
    "input_mask": INPUT_MASK, "segment_ids": SEGMENT_IDS,
    "cola_label_ids": np.array([1, 0], np.int32),
    "sts_targets": np.array([0.76, 0.0], np.float32),
    "squad_start_positions": np.array([5, 0], np.int32),
    "squad_end_positions": np.array([6, 0], np.int32),
    "squad_is_impossible": np.array([0, 1], np.int32),
    "chunk_labeled_positions": np.array([[1, 2, 4, 0], [1, 0, 0, 0]], np.int32),
    "chunk_labels": np.array([[2, 0, 1, 0], [1, 0, 0, 0]], np.int32),
    "chunk_labels_mask": np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32),
}
HEAD_INPUTS = {"sequence_output": SEQUENCE_OUTPUT, "features": FEATURES}

CLASSIFICATION_OUTPUT = ({"logits": (BATCH, 3), "predictions": (BATCH,), "loss": (BATCH,)},
                         {"logits": "float32", "predictions": "int32", "loss": "float32"})
REGRESSION_OUTPUT = ({"predictions": (BATCH,), "loss": (BATCH,)}, "float32")
TAGGING_OUTPUT = ({"logits": (BATCH, SLOTS, 5), "predictions": (BATCH, SLOTS), "loss": (BATCH,)},
                  {"logits": "float32", "predictions": "int32", "loss": "float32"})
QA_OUTPUT = ({"start_logits": (BATCH, SEQ), "end_logits": (BATCH, SEQ),
              "answerable_logit": (BATCH,), "start_top_log_probs": (BATCH, BEAM),
              "start_top_index": (BATCH, BEAM), "end_top_log_probs": (BATCH, BEAM, BEAM),
              "end_top_index": (BATCH, BEAM, BEAM), "loss": (BATCH,)},
             {"start_logits": "float32", "end_logits": "float32", "answerable_logit": "float32",
              "start_top_log_probs": "float32", "start_top_index": "int32",
              "end_top_log_probs": "float32", "end_top_index": "int32", "loss": "float32"})


def _head_case(cls, init_kwargs, output):
    shapes, dtypes = output
    return LayerCase(cls, init_kwargs, HEAD_INPUTS, expected_output_shape=shapes,
                     expected_output_dtype=dtypes)


# Head specs as `TaskHeads` and `FinetuningModel` store them (`family` included).
SPECS = [{"name": "cola", "num_labels": 3, "family": "classification"},
         {"name": "sts", "family": "regression"},
         {"name": "squad", "family": "qa", "beam_size": BEAM, "joint_prediction": False,
          "answerable_weight": 0.25},
         {"name": "chunk", "family": "tagging", "num_labels": 5}]
TINY_ENCODER = dict(vocab_size=30, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=16, embedding_size=4)
INPUT_IDS = np.where(INPUT_MASK > 0, _rng.integers(5, 30, (BATCH, SEQ)), 0).astype(np.int32)
FAMILY_OUTPUTS = {"cola": CLASSIFICATION_OUTPUT, "sts": REGRESSION_OUTPUT, "squad": QA_OUTPUT,
                  "chunk": TAGGING_OUTPUT}


# `TaskHeads` and the model: {task: that head's outputs}.
TASK_SHAPES = {task: shapes for task, (shapes, _) in FAMILY_OUTPUTS.items()}
TASK_DTYPES = {task: dtypes for task, (_, dtypes) in FAMILY_OUTPUTS.items()}

CASES = {
    "classification": _head_case(ClassificationHead,
                                 {"num_labels": 3, "dropout_prob": 0.2, "name": "cola"},
                                 CLASSIFICATION_OUTPUT),
    "regression": _head_case(RegressionHead, {"dropout_prob": 0.3, "name": "sts"},
                             REGRESSION_OUTPUT),
    "tagging": _head_case(TaggingHead, {"num_labels": 5, "name": "chunk"}, TAGGING_OUTPUT),
    "qa": _head_case(QAHead, {"beam_size": BEAM, "name": "squad"}, QA_OUTPUT),
    "qa_without_joint_prediction": _head_case(
        QAHead, {"beam_size": BEAM, "joint_prediction": False,
                 "answerable_uses_start_logits": False, "answerable_weight": 0.25,
                 "name": "squad"}, QA_OUTPUT),
    "qa_without_answerable_classifier": _head_case(
        QAHead, {"beam_size": BEAM, "answerable_classifier": False, "name": "squad"}, QA_OUTPUT),
    "task_heads": LayerCase(
        TaskHeads, {"tasks": SPECS, "hidden_size": HIDDEN, "dropout_prob": 0.2},
        HEAD_INPUTS, expected_output_shape=TASK_SHAPES, expected_output_dtype=TASK_DTYPES),
    "model": LayerCase(
        FinetuningModel, {"encoder_config": TINY_ENCODER, "tasks": SPECS,
                          "head_dropout_prob": 0.2},
        {"inputs": dict(FEATURES, input_ids=INPUT_IDS)},
        expected_output_shape=TASK_SHAPES, expected_output_dtype=TASK_DTYPES),
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


def test_rebuilt_model_builds_each_head_from_its_spec():
    """The model's config stores the specs; each rebuilt head holds its own arguments."""
    revived = run_serialization_test(CASES["model"])
    head = revived.task_heads.heads["squad"]
    assert (head.beam_size, head.joint_prediction, head.answerable_weight) == (4, False, 0.25)
