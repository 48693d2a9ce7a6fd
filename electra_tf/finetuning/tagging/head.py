"""The tagging head (official `TaggingTask.get_prediction_module`).

    reprs  = sequence_output gathered at `labeled_positions`   [batch, seq, hidden] (each word's
                                                                first sub-token; padding -> 0)
    logits = dense_num_labels(reprs)                           no dropout, no CRF
    loss   = SUM over positions of softmax_CE(label, logits) * labels_mask   (per sentence)

The loss is a sum over words, not a mean (official), and is then summed over the batch.
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="electra_tf")
class TaggingHead(keras.layers.Layer):
    """dense(num_labels) on the first sub-token of every word.

    Args:
        num_labels: int. Size of the tag set.
        **kwargs: forwarded to keras.layers.Layer (name = the task name).

    Call args:
        sequence_output: float [batch_size, seq_length, hidden_size].
        features: dict; reads `<task>_labeled_positions` int [batch_size, n] (required),
            `<task>_labels` int [batch_size, n] and `<task>_labels_mask` float [batch_size, n]
            (zeros when absent).
        training: bool (unused: the official head has no dropout).

    Returns:
        {"logits": float32 [batch_size, n, num_labels], "predictions": int32 [batch_size, n],
         "loss": float32 [batch_size]}.
    """

    def __init__(self, num_labels: int, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.dense = keras.layers.Dense(num_labels, kernel_initializer="glorot_uniform",
                                        bias_initializer="zeros", dtype=self.dtype_policy,
                                        name="dense")

    def build(self, sequence_shape):
        self.dense.build((None, None, sequence_shape[-1]))

    def call(self, sequence_output, features, training=None):
        positions = tf.cast(features[f"{self.name}_labeled_positions"], tf.int32)
        reprs = tf.gather(sequence_output, positions, batch_dims=1)
        logits = tf.cast(self.dense(reprs), tf.float32)
        labels_key, mask_key = f"{self.name}_labels", f"{self.name}_labels_mask"
        labels = (tf.cast(features[labels_key], tf.int32) if labels_key in features
                  else tf.zeros_like(positions))
        mask = (tf.cast(features[mask_key], tf.float32) if mask_key in features
                else tf.zeros_like(positions, tf.float32))
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        return {"logits": logits, "predictions": tf.argmax(logits, axis=-1, output_type=tf.int32),
                "loss": tf.reduce_sum(losses * mask, axis=-1)}

    def get_config(self):
        config = super().get_config()
        config.update({"num_labels": self.num_labels})
        return config
