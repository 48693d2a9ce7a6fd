"""The regression head (official `RegressionTask.get_prediction_module`).

    prediction = dense_1(dropout_0.1(sequence_output[:, 0]))     no output activation
    loss       = (prediction - target)^2                          per record (summed by the model)

The target is the label scaled to [0, 1] (`sts.py`); dropout only in training; the dense layer
is Glorot-uniform with a zero bias (TF1 `tf.layers.dense` defaults).
"""

from __future__ import annotations

import keras
from keras import ops

from electra_tf.finetuning.task import feature_or_zeros
from electra_tf.modeling import ops_kernels


@keras.saving.register_keras_serializable(package="electra_tf")
class RegressionHead(keras.layers.Layer):
    """dropout -> dense(1) on the [CLS] vector.

    Args:
        dropout_prob: float. Applied only when training.
        **kwargs: forwarded to keras.layers.Layer (name = the task name).

    Call args:
        sequence_output: float [batch_size, seq_length, hidden_size].
        features: dict; reads `<task>_targets` float [batch_size] (zeros when absent).
        training: bool.

    Returns:
        {"predictions": float32 [batch_size], "loss": float32 [batch_size]}.
    """

    def __init__(self, dropout_prob: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.dropout_prob = dropout_prob
        self.dropout = keras.layers.Dropout(dropout_prob, dtype=self.dtype_policy, name="dropout")
        self.dense = keras.layers.Dense(1, kernel_initializer="glorot_uniform",
                                        bias_initializer="zeros", dtype=self.dtype_policy,
                                        name="dense")

    def build(self, sequence_shape):
        self.dense.build((None, sequence_shape[-1]))

    def call(self, sequence_output, features, training=None):
        cls = sequence_output[:, 0]
        # The encoder's dropout stream (`kernel_settings.DROPOUT_RNG`): the same masks on
        # every backend with the default "hash".
        pooled = ops_kernels.dropout(
            cls, ops_kernels.draw(self.dropout, ops.shape(cls), cls.dtype, training))
        predictions = ops.cast(ops.squeeze(self.dense(pooled), -1), "float32")
        targets = feature_or_zeros(features, f"{self.name}_targets", predictions, "float32")
        return {"predictions": predictions, "loss": ops.square(predictions - targets)}

    def get_config(self):
        config = super().get_config()
        config.update({"dropout_prob": self.dropout_prob})
        return config
