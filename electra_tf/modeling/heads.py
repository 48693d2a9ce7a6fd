"""The generator's masked-LM head and the discriminator's replaced-token-detection head.

Official `run_pretraining.py`:
- `_get_masked_lm_output` / `get_token_logits`, scope `generator_predictions` (spec 5.3):
  dense(E, gelu, truncated normal) -> LayerNorm(1e-12) -> hidden . word_embeddings^T + output_bias.
  The vocab matrix is the shared input word-embedding table (a three-way tie).
- `_get_discriminator_output`, scope `discriminator_predictions` (spec 5.5):
  dense(H, gelu, truncated normal) -> dense(1, Glorot-uniform: official passes no initializer)
  -> squeeze.

Written here rather than taken from keras-hub: `keras_hub.layers.MaskedLMHead` gathers the
positions itself and owns its tie through a `token_embedding` constructor argument (a layer
cannot be serialised into two configs), and keras-hub has no discriminator head. The generator
head takes the table at call time instead, so the tie is a call-time relation and `get_config`
stays self-contained.

Variable paths (default names = official scopes):
    generator_predictions/dense/{kernel [Hg, E], bias [E]}
    generator_predictions/LayerNorm/{gamma, beta} [E]
    generator_predictions/output_bias [V]
    discriminator_predictions/dense/{kernel [H, H], bias [H]}
    discriminator_predictions/dense_1/{kernel [H, 1], bias [1]}

Both heads return float32 logits whatever the dtype policy, because the logits feed softmax /
sigmoid losses and the generator's sampling: the matmuls run in the compute dtype (bfloat16 under
mixed_bfloat16) and are cast to float32; the generator's [V] output_bias is kept and added in
float32.
"""

from __future__ import annotations

import keras
from keras import ops

from electra_tf.modeling import kernel_settings, ops_kernels, tf_kernels
from electra_tf.modeling.embeddings import LAYER_NORM_EPSILON, get_activation, truncated_normal


@keras.saving.register_keras_serializable(package="electra_tf")
class GeneratorHead(keras.layers.Layer):
    """Masked-LM head tied to the word-embedding table (official `generator_predictions`).

    Args:
        embedding_size: int. Width E of the word-embedding table (128 for small).
        vocab_size: int. Rows V of the table; the size of `output_bias`.
        hidden_act: str. Activation of the dense layer ("gelu" = exact erf GELU).
        initializer_range: float. Stddev of the dense kernel's truncated-normal initializer.
        **kwargs: forwarded to `keras.layers.Layer`; `name` defaults to "generator_predictions".

    Call arguments:
        hidden: float tensor `[batch_size, num_positions, generator_hidden_size]`: the
            generator's final hidden states, already gathered at masked_lm_positions.
        word_embeddings_table: the `[vocab_size, embedding_size]` table (tensor or variable,
            e.g. `encoder.embeddings.word_embeddings.embeddings`). Gradients flow into it.

    Returns:
        float32 logits `[batch_size, num_positions, vocab_size]`.
    """

    def __init__(self, embedding_size: int, vocab_size: int, hidden_act: str = "gelu",
                 initializer_range: float = 0.02, **kwargs):
        kwargs.setdefault("name", "generator_predictions")
        super().__init__(**kwargs)
        self.embedding_size = embedding_size
        self.vocab_size = vocab_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.dense = keras.layers.Dense(
            embedding_size, activation=get_activation(hidden_act),
            kernel_initializer=truncated_normal(initializer_range), bias_initializer="zeros",
            dtype=self.dtype_policy, name="dense")
        self.layer_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=LAYER_NORM_EPSILON, dtype=self.dtype_policy, name="LayerNorm")

    def build(self, hidden_shape, word_embeddings_table_shape=None):
        self.dense.build(hidden_shape)
        self.layer_norm.build(tuple(hidden_shape[:-1]) + (self.embedding_size,))
        # autocast=False: the bias is added to the float32 logits, in float32.
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.vocab_size,), initializer="zeros", autocast=False)

    def call(self, hidden, word_embeddings_table):
        table = ops.cast(word_embeddings_table, self.compute_dtype)  # [V, E]
        if len(table.shape) != 2 or table.shape[-1] != self.embedding_size:
            raise ValueError(f"{self.name}: word_embeddings_table must be [vocab_size, "
                             f"{self.embedding_size}], got {tuple(table.shape)}")
        x = self.layer_norm(self.dense(hidden))  # [B, N, E]
        shape = ops.shape(x)
        flat = ops.reshape(x, (-1, self.embedding_size))
        if kernel_settings.use_tensorflow_kernels():
            tf, *_ = tf_kernels.load()
            # transpose_b lets the matmul read the table in place instead of materialising
            # table^T (TensorFlow's MatMul; the other backends' compilers fold the transpose).
            logits = tf.matmul(flat, table, transpose_b=True)  # [B*N, V]
        else:
            logits = ops.matmul(flat, ops.transpose(table))
        logits = ops.cast(logits, "float32") + ops.cast(self.output_bias.value, "float32")
        return ops.reshape(logits, tuple(shape[:-1]) + (self.vocab_size,))

    def compute_output_spec(self, hidden, word_embeddings_table):
        return keras.KerasTensor(tuple(hidden.shape[:-1]) + (self.vocab_size,), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "embedding_size": self.embedding_size,
            "vocab_size": self.vocab_size,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
        })
        return config


@keras.saving.register_keras_serializable(package="electra_tf")
class DiscriminatorHead(keras.layers.Layer):
    """Replaced-token-detection head (official `discriminator_predictions`).

    Args:
        hidden_size: int. Width H of the first dense layer (the discriminator's hidden size).
        hidden_act: str. Activation of the first dense layer ("gelu" = exact erf GELU).
        initializer_range: float. Stddev of the first kernel's truncated-normal initializer.
        **kwargs: forwarded to `keras.layers.Layer`; `name` defaults to
            "discriminator_predictions".

    Call arguments:
        sequence_output: float tensor `[batch_size, seq_length, hidden_size]`.
        training: bool. Only selects the kernels (TensorFlow's xla_clusters.py in
            training calls); the head has no dropout.

    Returns:
        float32 logits `[batch_size, seq_length]` (> 0 means "replaced").
    """

    def __init__(self, hidden_size: int, hidden_act: str = "gelu",
                 initializer_range: float = 0.02, **kwargs):
        kwargs.setdefault("name", "discriminator_predictions")
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.dense = keras.layers.Dense(
            hidden_size, activation=get_activation(hidden_act),
            kernel_initializer=truncated_normal(initializer_range), bias_initializer="zeros",
            dtype=self.dtype_policy, name="dense")
        # Official passes no initializer here, so TF's default Glorot-uniform applies.
        self.dense_1 = keras.layers.Dense(
            1, kernel_initializer="glorot_uniform", bias_initializer="zeros",
            dtype=self.dtype_policy, name="dense_1")

    def build(self, sequence_output_shape):
        self.dense.build(sequence_output_shape)
        self.dense_1.build(tuple(sequence_output_shape[:-1]) + (self.hidden_size,))

    def call(self, sequence_output, training=None):
        dense = self.dense
        dtype = self.compute_dtype
        if kernel_settings.use_xla(training) and dense.activation is keras.activations.gelu:
            # bias + GELU as one compiled loop after the matmul (TensorFlow's xla_clusters.py).
            tf, _, _, clusters = tf_kernels.load()
            shape = tf.shape(sequence_output)
            flat = tf.reshape(tf.cast(sequence_output, dtype), [-1, self.hidden_size])
            hidden = clusters.bias_gelu(tf.matmul(flat, tf.cast(dense.kernel, dtype)),
                                        tf.cast(dense.bias, tf.float32))
            hidden = tf.reshape(hidden, shape)
        elif kernel_settings.use_tensorflow_kernels():
            hidden = dense(sequence_output)
        else:
            # keras.ops: bias + activation as xla_clusters.bias_gelu computes them (float32 GELU).
            hidden = ops_kernels.bias_activation(
                ops.matmul(ops.cast(sequence_output, dtype), ops.cast(dense.kernel, dtype)),
                ops.cast(dense.bias, "float32"), dense.activation)
        logits = self.dense_1(hidden)  # [B, L, 1]
        return ops.cast(ops.squeeze(logits, axis=-1), "float32")

    def compute_output_spec(self, sequence_output, training=None):
        return keras.KerasTensor(tuple(sequence_output.shape[:-1]), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "hidden_size": self.hidden_size,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
        })
        return config
