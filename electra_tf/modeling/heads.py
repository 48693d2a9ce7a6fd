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

Vocabulary padding (`GeneratorHead(vocab_padding_multiple=128)`, issue 45; off by default): the
projection onto the vocabulary runs on the table padded with zero rows to a multiple of
`vocab_padding_multiple` (30522 -> 30592), a matmul shape GPUs tile without a ragged edge. The
variables are unchanged ([V, E] table, [V] output_bias: checkpoints and names as without it). The
padded columns' logits are `PADDED_LOGIT`: with `padded_logits=True` the caller gets all
[..., V_padded] columns (the pretraining model's loss, argmax and Gumbel sampling run on them:
exp(PADDED_LOGIT - max) is exactly 0 in float32, so no pad column is ever sampled or predicted
and the softmax sums gain exact zeros); otherwise the pad columns are sliced off.
"""

from __future__ import annotations

import keras
from keras import ops

from electra_tf.modeling import kernel_settings, ops_kernels, tf_kernels
from electra_tf.modeling.embeddings import LAYER_NORM_EPSILON, get_activation, truncated_normal

# The logit of a padded vocabulary column: exp(PADDED_LOGIT - max logit) underflows to exactly 0
# in float32 (as the attention's masked scores, ops_kernels.MASKED_SCORE), and it stays below
# any real logit after the sampler's temperature and -1000 disallow penalty.
PADDED_LOGIT = -1e9


@keras.saving.register_keras_serializable(package="electra_tf")
class GeneratorHead(keras.layers.Layer):
    """Masked-LM head tied to the word-embedding table (official `generator_predictions`).

    Args:
        embedding_size: int. Width E of the word-embedding table (128 for small).
        vocab_size: int. Rows V of the table; the size of `output_bias`.
        hidden_act: str. Activation of the dense layer ("gelu" = exact erf GELU).
        initializer_range: float. Stddev of the dense kernel's truncated-normal initializer.
        vocab_padding_multiple: int. The projection runs on the table padded to a multiple of
            this many rows (module docstring); 1 (default) pads nothing.
        **kwargs: forwarded to `keras.layers.Layer`; `name` defaults to "generator_predictions".

    Call arguments:
        hidden: float tensor `[batch_size, num_positions, generator_hidden_size]`: the
            generator's final hidden states, already gathered at masked_lm_positions.
        word_embeddings_table: the `[vocab_size, embedding_size]` table (tensor or variable,
            e.g. `encoder.embeddings.word_embeddings.embeddings`). Gradients flow into it.
        padded_logits: bool. Return the padded columns too (`PADDED_LOGIT` each).

    Returns:
        float32 logits `[batch_size, num_positions, vocab_size]`, or
        `[batch_size, num_positions, padded_vocab_size]` with `padded_logits`.

    Raises:
        ValueError: `vocab_padding_multiple` is not a positive int.
    """

    def __init__(self, embedding_size: int, vocab_size: int, hidden_act: str = "gelu",
                 initializer_range: float = 0.02, vocab_padding_multiple: int = 1, **kwargs):
        kwargs.setdefault("name", "generator_predictions")
        super().__init__(**kwargs)
        if (isinstance(vocab_padding_multiple, bool) or not isinstance(vocab_padding_multiple, int)
                or vocab_padding_multiple < 1):
            raise ValueError(f"{self.name}: vocab_padding_multiple must be an int >= 1, got "
                             f"{vocab_padding_multiple!r}")
        self.embedding_size = embedding_size
        self.vocab_size = vocab_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.vocab_padding_multiple = vocab_padding_multiple
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

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary size rounded up to a multiple of `vocab_padding_multiple`."""
        return -(-self.vocab_size // self.vocab_padding_multiple) * self.vocab_padding_multiple

    def call(self, hidden, word_embeddings_table, padded_logits=False):
        table = ops.cast(word_embeddings_table, self.compute_dtype)  # [V, E]
        if len(table.shape) != 2 or table.shape[-1] != self.embedding_size:
            raise ValueError(f"{self.name}: word_embeddings_table must be [vocab_size, "
                             f"{self.embedding_size}], got {tuple(table.shape)}")
        pad = self.padded_vocab_size - self.vocab_size
        bias = ops.cast(self.output_bias.value, "float32")
        if pad:
            # Zero rows, so the pad columns' products are 0 and their logit is the bias's pad:
            # PADDED_LOGIT. The gradient into the table is the padded one's first V rows.
            table = ops.pad(table, ((0, pad), (0, 0)))
            bias = ops.concatenate([bias, ops.full((pad,), PADDED_LOGIT, "float32")])
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
        logits = ops.cast(logits, "float32") + bias  # [B*N, V or V_padded]
        if pad and not padded_logits:
            logits = logits[:, :self.vocab_size]
        width = self.padded_vocab_size if padded_logits else self.vocab_size
        return ops.reshape(logits, tuple(shape[:-1]) + (width,))

    def compute_output_spec(self, hidden, word_embeddings_table, padded_logits=False):
        width = self.padded_vocab_size if padded_logits else self.vocab_size
        return keras.KerasTensor(tuple(hidden.shape[:-1]) + (width,), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "embedding_size": self.embedding_size,
            "vocab_size": self.vocab_size,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
            "vocab_padding_multiple": self.vocab_padding_multiple,
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
