"""The fine-tuning model: the ELECTRA encoder plus one classification head per task.

Official (`run_finetuning.FinetuningModel` + `ClassificationTask.get_prediction_module`):

    pooled = sequence_output[:, 0]                  (the [CLS] vector; ELECTRA has no pooler)
    logits = dense_num_labels(dropout_0.1(pooled))  (dropout only in training; Glorot kernel,
                                                     zero bias: tf.layers.dense defaults)
    loss   = SUM over the batch of each example's softmax cross-entropy under its own task

The loss is a `reduce_sum`, not a mean (official). With the global-norm clip at 1.0 this makes
the effective step size depend on the batch size less than a mean would; electra-tf keeps it for
parity (docs/finetuning.md).

Variable paths follow the official scopes: the encoder is "electra/..." (as in pretraining, so
weights map one-to-one) and the heads are "task_specific/<task>/dense/{kernel,bias}", which the
layer-wise learning rate (optimization.py) keys on.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import keras
import tensorflow as tf

from electra_tf.modeling.encoder import ElectraEncoder

# Official ClassificationTask: tf.nn.dropout(reprs, keep_prob=0.9) in training.
HEAD_DROPOUT_PROB = 0.1
ENCODER_NAME = "electra"  # official BertModel scope
TASK_SCOPE = "task_specific"  # official variable scope of the task heads


@keras.saving.register_keras_serializable(package="electra_tf")
class ClassificationHead(keras.layers.Layer):
    """dropout -> dense(num_labels) on the pooled [CLS] vector.

    Args:
        num_labels: int.
        dropout_prob: float. Applied only when training.
        **kwargs: forwarded to keras.layers.Layer (name = the task name).

    Call args:
        pooled_output: float [batch_size, hidden_size].
        training: bool.

    Returns:
        float32 logits [batch_size, num_labels].
    """

    def __init__(self, num_labels: int, dropout_prob: float = HEAD_DROPOUT_PROB, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.dropout_prob = dropout_prob
        self.dropout = keras.layers.Dropout(dropout_prob, dtype=self.dtype_policy, name="dropout")
        self.dense = keras.layers.Dense(num_labels, kernel_initializer="glorot_uniform",
                                        bias_initializer="zeros", dtype=self.dtype_policy,
                                        name="dense")

    def build(self, pooled_shape):
        self.dense.build(pooled_shape)

    def call(self, pooled_output, training=None):
        return tf.cast(self.dense(self.dropout(pooled_output, training=training)), tf.float32)

    def get_config(self):
        config = super().get_config()
        config.update({"num_labels": self.num_labels, "dropout_prob": self.dropout_prob})
        return config


@keras.saving.register_keras_serializable(package="electra_tf")
class TaskHeads(keras.layers.Layer):
    """One `ClassificationHead` per task, under the official "task_specific" scope.

    Args:
        tasks: list of {"name": str, "num_labels": int}, in task-id order.
        hidden_size: int. Width of the pooled output.
        dropout_prob: float.
    """

    def __init__(self, tasks: Sequence[Mapping[str, Any]], hidden_size: int,
                 dropout_prob: float = HEAD_DROPOUT_PROB, **kwargs):
        kwargs.setdefault("name", TASK_SCOPE)
        super().__init__(**kwargs)
        self.tasks = [{"name": str(t["name"]), "num_labels": int(t["num_labels"])} for t in tasks]
        self.hidden_size = hidden_size
        self.dropout_prob = dropout_prob
        self.heads = {}
        for task in self.tasks:
            head = ClassificationHead(task["num_labels"], dropout_prob, dtype=self.dtype_policy,
                                      name=task["name"])
            # One attribute per head (Keras tracks attributes; checkpoints follow them).
            setattr(self, f"head_{len(self.heads)}", head)
            self.heads[task["name"]] = head
        self.build()

    def build(self, input_shape=None):
        # Keras' build wrapper opens this layer's name scope and each head's own, so the
        # variables are "task_specific/<task>/dense/..." (official scope).
        for head in self.heads.values():
            if not head.built:
                head.build((None, self.hidden_size))

    def call(self, pooled_output, training=None):
        return {name: head(pooled_output, training=training) for name, head in self.heads.items()}

    def get_config(self):
        config = super().get_config()
        config.update({"tasks": self.tasks, "hidden_size": self.hidden_size,
                       "dropout_prob": self.dropout_prob})
        return config


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraClassifier(keras.Model):
    """Encoder + per-task heads.

    Args:
        encoder_config: dict of `ElectraEncoder` arguments (the official BertConfig sizes:
            `ModelConfig.to_dict()` of the pretrained discriminator).
        tasks: list of {"name", "num_labels"}, in task-id order.
        head_dropout_prob: float.

    Call args:
        inputs: dict of int32 [batch_size, seq_length] `input_ids`, `input_mask`, `segment_ids`.
        training: bool.

    Returns:
        {task name: float32 logits [batch_size, num_labels]}.
    """

    def __init__(self, encoder_config: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]],
                 head_dropout_prob: float = HEAD_DROPOUT_PROB, **kwargs):
        super().__init__(**kwargs)
        self.encoder_config = dict(encoder_config)
        self.tasks = [{"name": str(t["name"]), "num_labels": int(t["num_labels"])} for t in tasks]
        self.head_dropout_prob = head_dropout_prob
        self.encoder = ElectraEncoder(**self.encoder_config, name=ENCODER_NAME)
        self.task_heads = TaskHeads(self.tasks, self.encoder.hidden_size, head_dropout_prob,
                                    name=TASK_SCOPE)

    def call(self, inputs, training=None):
        pooled = self.encoder({"input_ids": inputs["input_ids"], "input_mask": inputs["input_mask"],
                               "segment_ids": inputs["segment_ids"]},
                              training=training)["pooled_output"]
        return self.task_heads(pooled, training=training)

    def get_config(self):
        config = super().get_config()
        config.update({"encoder_config": self.encoder_config, "tasks": self.tasks,
                       "head_dropout_prob": self.head_dropout_prob})
        return config


def summed_loss(logits: Dict[str, tf.Tensor], label_ids: tf.Tensor, task_ids: tf.Tensor,
                task_names: List[str]) -> tf.Tensor:
    """Official loss: Σ over the batch of the cross-entropy under each example's own task.

    Args:
        logits: {task: float32 [batch_size, num_labels_task]}.
        label_ids: int32 [batch_size], the label index within the example's task.
        task_ids: int32 [batch_size], the index of the example's task in `task_names`.
        task_names: task names in task-id order.

    Returns:
        float32 scalar.
    """
    total = tf.constant(0.0, tf.float32)
    for task_id, name in enumerate(task_names):
        task_logits = logits[name]
        mine = tf.equal(task_ids, task_id)
        # Labels of other tasks' examples may exceed this head's size: clamp, then mask out.
        safe_labels = tf.where(mine, label_ids, tf.zeros_like(label_ids))
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe_labels, logits=task_logits)
        total += tf.reduce_sum(losses * tf.cast(mine, tf.float32))
    return total
