"""The fine-tuning model: the ELECTRA encoder plus one head per task (official `FinetuningModel`).

    sequence_output = encoder(input_ids, input_mask, segment_ids)      [batch, seq, hidden]
    outputs[task]   = head_task(sequence_output, features)              every head, every record
    loss            = SUM over the batch of loss_task[b] for the task of record b

Each head returns a dict of float32/int tensors with a per-record `loss` [batch], reading its own
features as `<task>_<key>` (official naming; a record of another task carries zeros there). The
total is a `reduce_sum`, not a mean (official), so padding records (task id = number of tasks)
add nothing. With the global-norm clip at 1.0 this sets the effective step size; electra-tf
keeps it for parity (docs/finetuning.md).

Heads by family (`make_head`): `ClassificationHead` here; `RegressionHead`
(`regression/head.py`), `QAHead` (`qa/head.py`), `TaggingHead` (`tagging/head.py`).

Variable paths follow the official scopes: the encoder is "electra/..." (as in pretraining, so
weights map one-to-one) and the heads are "task_specific/<task>/<layer>/{kernel,bias}", which the
layer-wise learning rate (optimization.py) keys on.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import keras
from keras import ops

from electra_tf.finetuning.qa.head import QAHead
from electra_tf.finetuning.regression.head import RegressionHead
from electra_tf.finetuning.tagging.head import TaggingHead
from electra_tf.finetuning.task import (CLASSIFICATION, QUESTION_ANSWERING, REGRESSION, TAGGING,
                                        feature_or_zeros)
from electra_tf.modeling import ops_kernels
from electra_tf.modeling.encoder import ElectraEncoder

# Official ClassificationTask: tf.nn.dropout(reprs, keep_prob=0.9) in training.
HEAD_DROPOUT_PROB = 0.1
ENCODER_NAME = "electra"  # official BertModel scope
TASK_SCOPE = "task_specific"  # official variable scope of the task heads


@keras.saving.register_keras_serializable(package="electra_tf")
class ClassificationHead(keras.layers.Layer):
    """dropout -> dense(num_labels) on the [CLS] vector; softmax cross-entropy per record.

    Args:
        num_labels: int.
        dropout_prob: float. Applied only when training.
        **kwargs: forwarded to keras.layers.Layer (name = the task name).

    Call args:
        sequence_output: float [batch_size, seq_length, hidden_size].
        features: dict; reads `<task>_label_ids` int [batch_size] (zeros when absent).
        training: bool.

    Returns:
        {"logits": float32 [batch_size, num_labels], "predictions": int32 [batch_size],
         "loss": float32 [batch_size]}.
    """

    def __init__(self, num_labels: int, dropout_prob: float = HEAD_DROPOUT_PROB, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.dropout_prob = dropout_prob
        self.dropout = keras.layers.Dropout(dropout_prob, dtype=self.dtype_policy, name="dropout")
        self.dense = keras.layers.Dense(num_labels, kernel_initializer="glorot_uniform",
                                        bias_initializer="zeros", dtype=self.dtype_policy,
                                        name="dense")

    def build(self, sequence_shape):
        self.dense.build((None, sequence_shape[-1]))

    def call(self, sequence_output, features, training=None):
        pooled = sequence_output[:, 0]
        # The encoder's dropout stream (`kernel_settings.DROPOUT_RNG`): with the default "hash"
        # the same masks on every backend, so TensorFlow and JAX fine-tuning are equal.
        pooled = ops_kernels.dropout(
            pooled, ops_kernels.draw(self.dropout, ops.shape(pooled), pooled.dtype, training))
        logits = ops.cast(self.dense(pooled), "float32")
        labels = feature_or_zeros(features, f"{self.name}_label_ids", logits, "int32")
        return {"logits": logits,
                "predictions": ops.cast(ops.argmax(logits, axis=-1), "int32"),
                "loss": ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)}

    def get_config(self):
        config = super().get_config()
        config.update({"num_labels": self.num_labels, "dropout_prob": self.dropout_prob})
        return config


# Family -> head class.
HEAD_CLASSES = {CLASSIFICATION: ClassificationHead, REGRESSION: RegressionHead,
                QUESTION_ANSWERING: QAHead, TAGGING: TaggingHead}


def _normalized_spec(spec: Mapping[str, Any]) -> dict:
    """A head spec with its family (a spec without one is a classification head)."""
    spec = dict(spec)
    spec.setdefault("family", CLASSIFICATION)
    if spec["family"] not in HEAD_CLASSES:
        raise ValueError(f"task {spec.get('name')!r}: unknown head family {spec['family']!r}")
    return spec


def make_head(spec: Mapping[str, Any], dropout_prob: float, dtype=None) -> keras.layers.Layer:
    """The head layer of one task spec {"name", "family", ...that head's arguments}."""
    spec = _normalized_spec(spec)
    kwargs = {k: v for k, v in spec.items() if k not in ("name", "family")}
    if spec["family"] in (CLASSIFICATION, REGRESSION):
        kwargs["dropout_prob"] = dropout_prob
    return HEAD_CLASSES[spec["family"]](**kwargs, dtype=dtype, name=spec["name"])


@keras.saving.register_keras_serializable(package="electra_tf")
class TaskHeads(keras.layers.Layer):
    """One head per task, under the official "task_specific" scope.

    Args:
        tasks: list of head specs {"name", "family", ...} (`FinetuningTask.head_config()`),
            in task-id order. A spec without "family" is a classification head
            ({"name", "num_labels"}).
        hidden_size: int. Width of the sequence output.
        dropout_prob: float. Dropout of the classification and regression heads.
    """

    def __init__(self, tasks: Sequence[Mapping[str, Any]], hidden_size: int,
                 dropout_prob: float = HEAD_DROPOUT_PROB, **kwargs):
        kwargs.setdefault("name", TASK_SCOPE)
        super().__init__(**kwargs)
        self.tasks = [_normalized_spec(t) for t in tasks]
        self.hidden_size = hidden_size
        self.dropout_prob = dropout_prob
        self.heads = {}
        for task in self.tasks:
            head = make_head(task, dropout_prob, dtype=self.dtype_policy)
            # One attribute per head (Keras tracks attributes; checkpoints follow them).
            setattr(self, f"head_{len(self.heads)}", head)
            self.heads[task["name"]] = head
        self.build()

    def build(self, input_shape=None):
        # Keras' build wrapper opens this layer's name scope and each head's own, so the
        # variables are "task_specific/<task>/<layer>/..." (official scope).
        for head in self.heads.values():
            if not head.built:
                head.build((None, None, self.hidden_size))

    def call(self, sequence_output, features, training=None, only: Optional[str] = None):
        names = [only] if only is not None else list(self.heads)
        return {name: self.heads[name](sequence_output, features, training=training)
                for name in names}

    def get_config(self):
        config = super().get_config()
        config.update({"tasks": self.tasks, "hidden_size": self.hidden_size,
                       "dropout_prob": self.dropout_prob})
        return config


@keras.saving.register_keras_serializable(package="electra_tf")
class FinetuningModel(keras.Model):
    """Encoder + per-task heads (official `run_finetuning.FinetuningModel`).

    Args:
        encoder_config: dict of `ElectraEncoder` arguments (the official BertConfig sizes:
            `ModelConfig.to_dict()` of the pretrained discriminator).
        tasks: list of head specs, in task-id order (see `TaskHeads`).
        head_dropout_prob: float.

    Call args:
        inputs: dict with int32 [batch_size, seq_length] `input_ids`, `input_mask`,
            `segment_ids`, and the heads' own features `<task>_<key>`.
        training: bool.

    Returns:
        {task name: {output name: tensor}} (each head's outputs, `loss` [batch_size] included).
    """

    def __init__(self, encoder_config: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]],
                 head_dropout_prob: float = HEAD_DROPOUT_PROB, **kwargs):
        super().__init__(**kwargs)
        self.encoder_config = dict(encoder_config)
        self.tasks = [_normalized_spec(t) for t in tasks]
        self.head_dropout_prob = head_dropout_prob
        self.encoder = ElectraEncoder(**self.encoder_config, name=ENCODER_NAME)
        self.task_heads = TaskHeads(self.tasks, self.encoder.hidden_size, head_dropout_prob,
                                    name=TASK_SCOPE)

    def _sequence_output(self, inputs, training):
        return self.encoder({"input_ids": inputs["input_ids"], "input_mask": inputs["input_mask"],
                             "segment_ids": inputs["segment_ids"]},
                            training=training)["sequence_output"]

    def call(self, inputs, training=None):
        return self.task_heads(self._sequence_output(inputs, training), inputs, training=training)

    def task_outputs(self, inputs, task: str, training=None) -> Dict[str, Any]:
        """The outputs of one task's head only (evaluation and serving)."""
        sequence_output = self._sequence_output(inputs, training)
        return self.task_heads(sequence_output, inputs, training=training, only=task)[task]

    def get_config(self):
        config = super().get_config()
        config.update({"encoder_config": self.encoder_config, "tasks": self.tasks,
                       "head_dropout_prob": self.head_dropout_prob})
        return config


def summed_loss(outputs: Dict[str, Dict[str, Any]], task_ids, task_names: List[str]):
    """Official loss: Σ over the batch of each record's loss under its own task.

    Args:
        outputs: {task: {"loss": float32 [batch_size], ...}} (`FinetuningModel` outputs).
        task_ids: int32 [batch_size], the index of the record's task in `task_names`; padding
            records carry len(task_names) and so add nothing.
        task_names: task names in task-id order.

    Returns:
        float32 scalar.
    """
    total = ops.convert_to_tensor(0.0, "float32")
    for task_id, name in enumerate(task_names):
        mine = ops.cast(ops.equal(task_ids, task_id), "float32")
        total += ops.sum(ops.cast(outputs[name]["loss"], "float32") * mine)
    return total
