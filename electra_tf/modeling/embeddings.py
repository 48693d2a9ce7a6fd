"""The ELECTRA embedding block, shared between generator and discriminator.

Official `modeling.embedding_postprocessor` (google-research/electra, model/modeling.py):
    out = word_embeddings[input_ids] + token_type_embeddings[segment_ids] + position_embeddings[0:L]
    out = dropout(LayerNorm(out), hidden_dropout_prob)
The E->H `embeddings_project` is NOT part of this block: each encoder owns its own projection
(official scope `electra/embeddings_project` vs `generator/embeddings_project`), while the whole
block here (three tables and the LayerNorm) is shared (spec sections 5.2 and 7).

Built from keras / keras-hub layers, which match the spec exactly here:
- `keras_hub.layers.ReversibleEmbedding` (tie_weights=True) for the word table, so the [V, E]
  variable can also produce tied vocab logits (`word_embeddings(x, reverse=True)`).
- `keras_hub.layers.PositionEmbedding` for the position table (slices rows 0:L, as official).
- `keras.layers.Embedding` for the token-type table (official uses a one-hot matmul on TPU and a
  gather otherwise: the same numbers).
- `keras.layers.LayerNormalization(epsilon=1e-12)` (official contrib layer_norm hard-codes 1e-12).

Variable paths (an `ElectraEncoder` named "electra" builds its block as "electra/embeddings"):
    electra/embeddings/word_embeddings/embeddings         [V, E]    official .../word_embeddings
    electra/embeddings/token_type_embeddings/embeddings   [2, E]    official .../token_type_embeddings
    electra/embeddings/position_embeddings/embeddings     [512, E]  official .../position_embeddings
    electra/embeddings/LayerNorm/{gamma,beta}             [E]       same

This module also holds the small helpers every modeling module uses (initializers, activations,
the LayerNorm epsilon), so `encoder.py` and `heads.py` import them from here.
"""

from __future__ import annotations

import keras
import keras_hub
from keras import ops

from electra_tf.modeling import kernel_settings, ops_kernels, tf_kernels

# Official `tf.contrib.layers.layer_norm` hard-codes variance_epsilon = 1e-12 (spec section 7).
LAYER_NORM_EPSILON = 1e-12

# Official `modeling.get_activation`: the BertConfig activation names and their functions.
# "gelu" is the exact erf form, x * 0.5 * (1 + erf(x / sqrt(2))): `keras.activations.gelu`
# defaults to approximate=False (tests check it against erf, not the tanh form).
_ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "tanh": "tanh",
    "linear": "linear",
}


def get_activation(hidden_act: str):
    """Maps an official `hidden_act` name to a Keras activation function.

    Args:
        hidden_act: str. One of "gelu" (exact erf GELU), "relu", "tanh", "linear".

    Returns:
        A callable activation (serialisable by `keras.activations.serialize`).

    Raises:
        ValueError: the name is not an official activation.
    """
    if hidden_act not in _ACTIVATIONS:
        raise ValueError(
            f"hidden_act must be one of {', '.join(sorted(_ACTIVATIONS))}, got {hidden_act!r}")
    return keras.activations.get(_ACTIVATIONS[hidden_act])


def truncated_normal(initializer_range: float) -> keras.initializers.Initializer:
    """Official `modeling.create_initializer`: truncated normal, stddev = initializer_range.

    Keras' TruncatedNormal, like TF1's, re-draws values beyond 2 standard deviations. A new
    instance is returned on every call on purpose: an unseeded Keras initializer draws its seed
    once, so sharing one instance between layers would give them identical weights.
    """
    return keras.initializers.TruncatedNormal(mean=0.0, stddev=initializer_range)


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraEmbeddings(keras.layers.Layer):
    """Word + token-type + position embeddings, then LayerNorm and dropout (no projection).

    Args:
        vocab_size: int. Rows V of the word-embedding table.
        embedding_size: int. Width E of all three tables.
        max_position_embeddings: int. Rows of the position table; sequences may not be longer.
        type_vocab_size: int. Rows of the token-type table.
        hidden_dropout_prob: float. Dropout rate after the LayerNorm (training only).
        initializer_range: float. Stddev of the truncated-normal initializer of the tables.
        **kwargs: forwarded to `keras.layers.Layer` (`name`, `dtype`, ...).

    Call arguments:
        input_ids: int tensor `[batch_size, seq_length]`.
        segment_ids: int tensor `[batch_size, seq_length]`, values < type_vocab_size.
        training: bool. Dropout is applied only when True.

    Returns:
        A float tensor `[batch_size, seq_length, embedding_size]` in the compute dtype.

    Attributes:
        word_embeddings: the `ReversibleEmbedding` owning the [V, E] table
            (`word_embeddings.embeddings` is the variable the generator head is tied to).
        token_type_embeddings, position_embeddings, layer_norm, dropout: the other sublayers.

    The variables are created lazily (on first call or `build()`); an `ElectraEncoder` builds
    its block at construction so its variables exist immediately.
    """

    def __init__(self, vocab_size: int, embedding_size: int, max_position_embeddings: int = 512,
                 type_vocab_size: int = 2, hidden_dropout_prob: float = 0.1,
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.hidden_dropout_prob = hidden_dropout_prob
        self.initializer_range = initializer_range

        self.word_embeddings = keras_hub.layers.ReversibleEmbedding(
            vocab_size, embedding_size, tie_weights=True,
            embeddings_initializer=truncated_normal(initializer_range),
            dtype=self.dtype_policy, name="word_embeddings")
        self.token_type_embeddings = keras.layers.Embedding(
            type_vocab_size, embedding_size,
            embeddings_initializer=truncated_normal(initializer_range),
            dtype=self.dtype_policy, name="token_type_embeddings")
        self.position_embeddings = keras_hub.layers.PositionEmbedding(
            max_position_embeddings, initializer=truncated_normal(initializer_range),
            dtype=self.dtype_policy, name="position_embeddings")
        self.layer_norm = keras.layers.LayerNormalization(
            axis=-1, epsilon=LAYER_NORM_EPSILON, dtype=self.dtype_policy, name="LayerNorm")
        self.dropout = keras.layers.Dropout(
            hidden_dropout_prob, dtype=self.dtype_policy, name="dropout")

    def build(self, input_ids_shape=None, segment_ids_shape=None):
        # Every shape is known from the constructor, so the input shapes are not needed.
        self.word_embeddings.build((None, None))
        self.token_type_embeddings.build((None, None))
        self.position_embeddings.build((None, None, self.embedding_size))
        self.layer_norm.build((None, None, self.embedding_size))

    def call(self, input_ids, segment_ids, training=None):
        seq_length = input_ids.shape[1]
        if seq_length is not None and seq_length > self.max_position_embeddings:
            raise ValueError(
                f"{self.name}: sequence length {seq_length} exceeds max_position_embeddings "
                f"{self.max_position_embeddings}")
        words = self.word_embeddings(input_ids)  # [B, L, E]
        # The position layer only reads its input's shape: give it one row, [1, L, E], so the
        # [L, E] slice is broadcast by the addition instead of being tiled to [B, L, E].
        positions = self.position_embeddings(words[:1])
        out = words + self.token_type_embeddings(segment_ids) + positions
        norm = self.layer_norm
        if not kernel_settings.use_tensorflow_kernels():
            # JAX, PyTorch, or KERNELS "ops": float32 LayerNorm + dropout, the masks of the
            # TensorFlow kernels below (ops_kernels.py).
            return ops_kernels.norm_dropout(
                out, ops.cast(norm.gamma, "float32"), ops.cast(norm.beta, "float32"),
                norm.epsilon, ops_kernels.draw(self.dropout, ops.shape(out), out.dtype, training))
        tf, _, streams, clusters = tf_kernels.load()
        if kernel_settings.use_xla(training):  # LayerNorm + dropout as one compiled loop
            return clusters.norm_dropout(
                out, tf.cast(norm.gamma, tf.float32), tf.cast(norm.beta, tf.float32),
                norm.epsilon, streams.draw_noise(self.dropout, tf.shape(out), out.dtype,
                                                 bool(training)))
        if kernel_settings.DROPOUT_RNG != "philox":
            return streams.dropout(norm(out), self.dropout, bool(training))
        return self.dropout(norm(out), training=training)

    def compute_output_shape(self, input_ids_shape, segment_ids_shape=None):
        return tuple(input_ids_shape) + (self.embedding_size,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size,
            "embedding_size": self.embedding_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "initializer_range": self.initializer_range,
        })
        return config


# Gradient-disentangled embedding sharing (DeBERTaV3, He et al., ICLR 2023): the variables of the
# shared block the discriminator reads as stop_gradient(shared) + delta, in the block's order.
DELTA_NAMES = ("word_delta", "token_type_delta", "position_delta", "gamma_delta", "beta_delta")


def block_variables(block: ElectraEmbeddings) -> tuple:
    """A block's variables in `DELTA_NAMES` order: word [V, E], token type [T, E], position
    [P, E], LayerNorm gamma [E] and beta [E]."""
    return (block.word_embeddings.embeddings, block.token_type_embeddings.embeddings,
            block.position_embeddings.position_embeddings, block.layer_norm.gamma,
            block.layer_norm.beta)


@keras.saving.register_keras_serializable(package="electra_tf")
class DisentangledEmbeddings(keras.layers.Layer):
    """The discriminator's view of a shared `ElectraEmbeddings` under GDES (`embedding_sharing`
    "gdes"): every variable of the block is read as `stop_gradient(shared) + delta`.

    DeBERTaV3's gradient-disentangled embedding sharing (He et al., ICLR 2023; microsoft/DeBERTa
    `apps/tasks/rtd_task.py`, `register_discriminator_fw_hook`): the discriminator's loss has no
    gradient into the shared block, which only the generator's masked-LM loss updates; the
    discriminator learns its own zero-initialised `delta`s instead, so at initialisation it
    computes exactly what the tied (official) model computes. DeBERTa shares only the word and
    position tables (its type table and embedding LayerNorm were never shared); ELECTRA shares the
    whole block, so here all five of its variables (three tables, LayerNorm gamma and beta) are
    disentangled, and no gradient of the RTD loss reaches any variable the generator reads.

    The LayerNorm and dropout compute as in `ElectraEmbeddings.call`, with the block's dropout
    layer (the same seed generator: the same masks as the tied model's second call of the block).

    Args:
        shared: the `ElectraEmbeddings` block the generator reads (built).
        **kwargs: forwarded to `keras.layers.Layer` (`name`, `dtype`, ...).

    Call arguments and returns: as `ElectraEmbeddings` ([batch_size, seq_length] ids ->
    [batch_size, seq_length, embedding_size]).

    Attributes:
        shared: the block. word_delta [V, E], token_type_delta [T, E], position_delta [P, E],
        gamma_delta [E], beta_delta [E]: the discriminator's deltas (float32, zeros at start).
    """

    def __init__(self, shared: ElectraEmbeddings, **kwargs):
        # No autocast: the block's variables and the deltas are read and added in float32 (as
        # the block's own Embedding and LayerNorm read theirs), then cast once.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        if not isinstance(shared, ElectraEmbeddings):
            raise TypeError(f"{self.name}: shared must be an ElectraEmbeddings, got "
                            f"{type(shared).__name__}")
        self.shared = shared
        # The encoder reads these to check its sizes (as for a shared block).
        for key in ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size"):
            setattr(self, key, getattr(shared, key))

    def build(self, input_ids_shape=None, segment_ids_shape=None):
        if not self.shared.built:
            self.shared.build()
        for name, variable in zip(DELTA_NAMES, self.shared_variables()):
            setattr(self, name, self.add_weight(shape=tuple(variable.shape), initializer="zeros",
                                                dtype=variable.dtype, autocast=False, name=name))

    def shared_variables(self) -> tuple:
        """The shared block's variables (`block_variables`)."""
        return block_variables(self.shared)

    def deltas(self) -> tuple:
        """The deltas, in `DELTA_NAMES` order."""
        return tuple(getattr(self, name) for name in DELTA_NAMES)

    def merged(self) -> tuple:
        """The discriminator's tables, stop_gradient(shared) + delta, float32, in `DELTA_NAMES`
        order (what exports and converters write as the discriminator's embedding block)."""
        return tuple(ops.stop_gradient(ops.convert_to_tensor(variable)) + ops.convert_to_tensor(delta)
                     for variable, delta in zip(self.shared_variables(), self.deltas()))

    def call(self, input_ids, segment_ids, training=None):
        block = self.shared
        seq_length = input_ids.shape[1]
        if seq_length is not None and seq_length > block.max_position_embeddings:
            raise ValueError(
                f"{self.name}: sequence length {seq_length} exceeds max_position_embeddings "
                f"{block.max_position_embeddings}")
        word, token_type, position, gamma, beta = self.merged()
        dtype = self.compute_dtype
        # As keras' Embedding and keras-hub's PositionEmbedding: gather, then cast.
        words = ops.cast(ops.take(word, ops.cast(input_ids, "int32"), axis=0), dtype)  # [B, L, E]
        types = ops.cast(ops.take(token_type, ops.cast(segment_ids, "int32"), axis=0), dtype)
        positions = ops.cast(position[: ops.shape(words)[1]], dtype)[None]  # [1, L, E]
        out = words + types + positions
        gamma, beta = ops.cast(gamma, "float32"), ops.cast(beta, "float32")
        epsilon = block.layer_norm.epsilon
        if not kernel_settings.use_tensorflow_kernels():
            return ops_kernels.norm_dropout(
                out, gamma, beta, epsilon,
                ops_kernels.draw(block.dropout, ops.shape(out), out.dtype, training))
        tf, _, streams, clusters = tf_kernels.load()
        if kernel_settings.use_xla(training):
            return clusters.norm_dropout(out, gamma, beta, epsilon,
                                         streams.draw_noise(block.dropout, tf.shape(out),
                                                            out.dtype, bool(training)))
        # keras' LayerNormalization computes ops.layer_normalization, then casts.
        normed = ops.cast(ops.layer_normalization(out, gamma, beta, -1, epsilon), dtype)
        if kernel_settings.DROPOUT_RNG != "philox":
            return streams.dropout(normed, block.dropout, bool(training))
        return block.dropout(normed, training=training)

    def compute_output_shape(self, input_ids_shape, segment_ids_shape=None):
        return tuple(input_ids_shape) + (self.embedding_size,)
