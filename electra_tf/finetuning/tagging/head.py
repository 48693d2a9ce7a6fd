"""The tagging head (official `TaggingTask.get_prediction_module`).

    reprs  = sequence_output gathered at `labeled_positions`   [batch, seq, hidden] (each word's
                                                                first sub-token; padding -> 0)
    logits = dense_num_labels(reprs)                           no dropout, no CRF
    loss   = SUM over positions of softmax_CE(label, logits) * labels_mask   (per sentence)

The loss is a sum over words, not a mean (official), and is then summed over the batch.
Written in `keras.ops`, so it runs on every backend (fine-tuning on JAX and PyTorch).
"""

from __future__ import annotations

import keras
from keras import ops


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
        positions = ops.cast(features[f"{self.name}_labeled_positions"], "int32")
        # [batch, n, 1] indices broadcast over the hidden axis: tf.gather(batch_dims=1).
        reprs = ops.take_along_axis(sequence_output, ops.expand_dims(positions, -1), axis=1)
        logits = ops.cast(self.dense(reprs), "float32")
        labels_key, mask_key = f"{self.name}_labels", f"{self.name}_labels_mask"
        labels = (ops.cast(features[labels_key], "int32") if labels_key in features
                  else ops.zeros_like(positions))
        mask = (ops.cast(features[mask_key], "float32") if mask_key in features
                else ops.zeros(ops.shape(positions), "float32"))
        losses = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return {"logits": logits, "predictions": ops.cast(ops.argmax(logits, axis=-1), "int32"),
                "loss": ops.sum(losses * mask, axis=-1)}

    def get_config(self):
        config = super().get_config()
        config.update({"num_labels": self.num_labels})
        return config
