"""The question-answering head (official `QATask.get_prediction_module`), h = sequence output.

1. Answer mask m = input_mask * segment_ids, plus 1 at position 0: 1 on [CLS], the context
   window and the final [SEP]; 0 on the question, the first [SEP] and padding. Masking is
   additive, logits + 1000 (m - 1) (official: not -inf; the -1000s are visible in the outputs).
2. start_logits = dense(h) [batch, seq], masked.
3. joint_prediction (default): the end is conditioned on the start,
       end_logits[j] = dense_1(gelu(qa_hidden(concat(h[start], h[j]))))   masked;
   in training `start` is the gold start (teacher forcing); at inference it is each of the
   `beam_size` best starts (top-k of log_softmax(start_logits)), and for each the `beam_size`
   best ends (top-k of log_softmax over j) are returned; `end_logits` is then all zeros
   (official). Without joint prediction, end_logits = dense_1(h), masked.
4. answerable_classifier (default): answerable_logit = dense_3(gelu(dense_2(concat(h[CLS],
   sum_i softmax(start_logits)_i h_i)))) with `answerable_uses_start_logits`, else dense_2(h[CLS]).
   A positive value means "unanswerable" (its label is is_impossible). Built and trained for
   every QA task, squadv1 and MRQA included, where every label is 0 (official).
5. loss = (CE(start_logits, start) + CE(end_logits, end)) / 2
          + answerable_weight * sigmoid_CE(answerable_logit, is_impossible)     per record.

Variables under `task_specific/<task>/`: dense [H, 1], qa_hidden [2H, 512], dense_1 [512, 1],
dense_2 [2H, 512], dense_3 [512, 1] (the official TF1 names). No dropout (official).

qa_hidden(concat(a, b)) is computed as a @ K[:H] + b @ K[H:] + bias: the same function, without
materialising the [batch, (beam,) seq, 2H] concatenation; at inference the beam is looped
(`keras.ops.map`: `tf.map_fn` on TensorFlow, `jax.lax.map` on JAX) so memory stays at
[batch, seq, 512] per start, and h @ K[H:] (the same for every start) is computed once.

`keras.ops`, so the head trains and predicts on every backend (`portable_runner`). On
TensorFlow the batched gather and h @ K[H:] keep TensorFlow's own ops (`gather_positions`,
`times_kernel`): the outputs and gradients there are those of the TensorFlow-ops head this one
replaced, to the bit, and the exported SavedModel runs them as before.
"""

from __future__ import annotations

import keras
from keras import ops

from electra_tf.finetuning.task import feature_or_zeros

QA_HIDDEN_SIZE = 512  # official width of qa_hidden and of the answerable classifier's hidden layer
MASK_PENALTY = 1000.0  # official additive mask


def _dense(units, name, dtype, activation=None):
    return keras.layers.Dense(units, activation=activation, kernel_initializer="glorot_uniform",
                              bias_initializer="zeros", dtype=dtype, name=name)


def _gelu(x):
    return keras.activations.gelu(x, approximate=False)  # exact erf form (official modeling.gelu)


def answer_mask(input_mask, segment_ids):
    """float32 [batch, seq]: 1 at [CLS], the context window and the final [SEP], else 0."""
    mask = ops.cast(input_mask, "float32") * ops.cast(segment_ids, "float32")
    return mask + ops.cast(ops.equal(ops.arange(ops.shape(mask)[1]), 0), "float32")


def gather_positions(values, positions):
    """values[b, positions[b]] for each row b (tf.gather with batch_dims=1).

    Args:
        values: [batch, seq] or [batch, seq, hidden].
        positions: int [batch] or [batch, k].

    Returns:
        [batch] / [batch, hidden] for positions [batch]; [batch, k] / [batch, k, hidden] for
        positions [batch, k].
    """
    if keras.backend.backend() == "tensorflow":
        # lazy: TensorFlow backend only. Its batched gather, as this head always had: the same
        # gradients to the bit (take_along_axis's sums h's gradient in another order, 1 ulp).
        import tensorflow as tf

        return tf.gather(values, positions, batch_dims=1)
    index = positions if ops.ndim(positions) == 2 else positions[:, None]
    if ops.ndim(values) == 3:
        index = ops.broadcast_to(index[:, :, None],
                                 (ops.shape(index)[0], ops.shape(index)[1], ops.shape(values)[2]))
    gathered = ops.take_along_axis(values, index, axis=1)
    return gathered if ops.ndim(positions) == 2 else gathered[:, 0]


def times_kernel(h, kernel):
    """h @ kernel over the last axis: [batch, seq, hidden] x [hidden, k] -> [batch, seq, k]."""
    if keras.backend.backend() == "tensorflow":
        # lazy: TensorFlow backend only. Its einsum, as this head always had (keras' einsum is a
        # broadcast batched matmul there, whose gradients differ by an ulp).
        import tensorflow as tf

        return tf.einsum("bsh,hk->bsk", h, kernel)
    return ops.einsum("bsh,hk->bsk", h, kernel)


def position_cross_entropy(logits, positions):
    """-log_softmax(logits)[position], float32 [batch]."""
    return -gather_positions(ops.log_softmax(logits, axis=-1), positions)


@keras.saving.register_keras_serializable(package="electra_tf")
class QAHead(keras.layers.Layer):
    """Start/end (joint) span prediction and the answerable classifier (module docstring).

    Args:
        beam_size: int. Starts, and ends per start, kept at inference (joint prediction).
        joint_prediction: bool.
        answerable_classifier: bool.
        answerable_uses_start_logits: bool.
        answerable_weight: float.
        **kwargs: forwarded to keras.layers.Layer (name = the task name).

    Call args:
        sequence_output: float [batch_size, seq_length, hidden_size].
        features: dict with int `input_mask`, `segment_ids` [batch_size, seq_length]; reads
            `<task>_start_positions`, `<task>_end_positions`, `<task>_is_impossible`
            [batch_size] (zeros when absent).
        training: bool. Teacher forcing (gold start) instead of the beam.

    Returns:
        float32 `start_logits`, `end_logits` [batch, seq]; `answerable_logit` [batch];
        `start_top_log_probs` [batch, beam], int32 `start_top_index` [batch, beam];
        `end_top_log_probs` [batch, beam, beam], int32 `end_top_index` [batch, beam, beam]
        (zeros without joint prediction); `loss` [batch].
    """

    def __init__(self, beam_size: int = 20, joint_prediction: bool = True,
                 answerable_classifier: bool = True, answerable_uses_start_logits: bool = True,
                 answerable_weight: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.beam_size = beam_size
        self.joint_prediction = joint_prediction
        self.answerable_classifier = answerable_classifier
        self.answerable_uses_start_logits = answerable_uses_start_logits
        self.answerable_weight = answerable_weight
        dtype = self.dtype_policy
        # Official TF1 auto-names in creation order: dense, [qa_hidden], dense_1, dense_2, dense_3.
        self.start_dense = _dense(1, "dense", dtype)
        self.qa_hidden = _dense(QA_HIDDEN_SIZE, "qa_hidden", dtype) if joint_prediction else None
        self.end_dense = _dense(1, "dense_1", dtype)
        self.answerable_hidden = None
        self.answerable_dense = None
        if answerable_classifier:
            if answerable_uses_start_logits:
                self.answerable_hidden = _dense(QA_HIDDEN_SIZE, "dense_2", dtype)
                self.answerable_dense = _dense(1, "dense_3", dtype)
            else:
                self.answerable_dense = _dense(1, "dense_2", dtype)

    def build(self, sequence_shape):
        hidden = sequence_shape[-1]
        self.start_dense.build((None, hidden))
        if self.joint_prediction:
            self.qa_hidden.build((None, 2 * hidden))
            self.end_dense.build((None, QA_HIDDEN_SIZE))
        else:
            self.end_dense.build((None, hidden))
        if self.answerable_hidden is not None:
            self.answerable_hidden.build((None, 2 * hidden))
            self.answerable_dense.build((None, QA_HIDDEN_SIZE))
        elif self.answerable_dense is not None:
            self.answerable_dense.build((None, hidden))

    def _end_logits_given_start(self, kernel, from_end, start_features, penalty):
        """dense_1(gelu(qa_hidden(concat(start_features, h_j)))) + penalty, float32.

        Args:
            kernel: qa_hidden's kernel [2 * hidden, 512] in h's dtype.
            from_end: [batch, seq, 512]: h @ kernel[hidden:] (the same for every start).
            start_features: [batch, hidden].
            penalty: float32 [batch, seq].
        """
        bias = ops.cast(self.qa_hidden.bias, kernel.dtype)
        from_start = ops.matmul(start_features, kernel[:start_features.shape[-1]])[:, None, :]
        hidden = _gelu(from_start + from_end + bias)  # [batch, seq, 512]
        return ops.cast(ops.squeeze(self.end_dense(hidden), -1), "float32") + penalty

    def call(self, sequence_output, features, training=None):
        h = sequence_output
        batch = ops.shape(h)[0]
        seq = ops.shape(h)[1]
        penalty = MASK_PENALTY * (answer_mask(features["input_mask"], features["segment_ids"]) - 1.0)
        start_positions = feature_or_zeros(features, f"{self.name}_start_positions", h, "int32")
        end_positions = feature_or_zeros(features, f"{self.name}_end_positions", h, "int32")
        is_impossible = feature_or_zeros(features, f"{self.name}_is_impossible", h, "float32")

        start_logits = ops.cast(ops.squeeze(self.start_dense(h), -1), "float32") + penalty
        beam = self.beam_size
        start_top_log_probs = ops.zeros((batch, beam), "float32")
        start_top_index = ops.zeros((batch, beam), "int32")
        end_top_log_probs = ops.zeros((batch, beam, beam), "float32")
        end_top_index = ops.zeros((batch, beam, beam), "int32")
        if self.joint_prediction:
            start_top_log_probs, start_top_index = ops.top_k(
                ops.log_softmax(start_logits, axis=-1), k=beam)
            start_top_index = ops.cast(start_top_index, "int32")
            # The gathers before h @ K[H:]: TensorFlow sums h's gradients in this order.
            if training:
                start_features = gather_positions(h, start_positions)  # [batch, hidden]
            else:
                starts = gather_positions(h, start_top_index)  # [batch, beam, hidden]
            kernel = ops.cast(self.qa_hidden.kernel, h.dtype)
            from_end = times_kernel(h, kernel[h.shape[-1]:])  # [batch, seq, 512]
            if training:
                end_logits = self._end_logits_given_start(kernel, from_end, start_features,
                                                          penalty)
            else:
                def end_log_probs(start_features):
                    logits = self._end_logits_given_start(kernel, from_end, start_features,
                                                          penalty)
                    return ops.log_softmax(logits, axis=-1)

                per_start = ops.map(end_log_probs, ops.transpose(starts, (1, 0, 2)))  # [beam, batch, seq]
                end_top_log_probs, end_top_index = ops.top_k(
                    ops.transpose(per_start, (1, 0, 2)), k=beam)
                end_top_index = ops.cast(end_top_index, "int32")
                end_logits = ops.zeros((batch, seq), "float32")
        else:
            end_logits = ops.cast(ops.squeeze(self.end_dense(h), -1), "float32") + penalty

        losses = (position_cross_entropy(start_logits, start_positions)
                  + position_cross_entropy(end_logits, end_positions)) / 2.0
        answerable_logit = ops.zeros((batch,), "float32")
        if self.answerable_classifier:
            representation = h[:, 0]
            if self.answerable_uses_start_logits:
                start_p = ops.cast(ops.softmax(start_logits, axis=-1), h.dtype)
                context = ops.sum(start_p[:, :, None] * h, axis=1)
                representation = _gelu(self.answerable_hidden(
                    ops.concatenate([representation, context], -1)))
            answerable_logit = ops.cast(ops.squeeze(self.answerable_dense(representation), -1),
                                        "float32")
            losses += self.answerable_weight * ops.binary_crossentropy(
                is_impossible, answerable_logit, from_logits=True)
        return {"start_logits": start_logits, "end_logits": end_logits,
                "answerable_logit": answerable_logit,
                "start_top_log_probs": start_top_log_probs, "start_top_index": start_top_index,
                "end_top_log_probs": end_top_log_probs, "end_top_index": end_top_index,
                "loss": losses}

    def get_config(self):
        config = super().get_config()
        config.update({"beam_size": self.beam_size, "joint_prediction": self.joint_prediction,
                       "answerable_classifier": self.answerable_classifier,
                       "answerable_uses_start_logits": self.answerable_uses_start_logits,
                       "answerable_weight": self.answerable_weight})
        return config
