"""The ELECTRA transformer encoder (official `modeling.BertModel`, as ELECTRA uses it).

    embeddings (shared block, see embeddings.py) -> [embeddings_project E->H if E != H]
    -> num_hidden_layers post-LN blocks -> {"sequence_output", "pooled_output"}

Each block is a `transformer_layer.TransformerLayer` (keras-hub's `TransformerEncoder` computing
the official block; that module says where keras-hub differs and how the block is computed on
each backend).

Variable names: keras-hub fixes the sublayer names and stores Q/K/V kernels as
[H, heads, head_size] and the attention output kernel as [heads, head_size, H] (EinsumDense). The
mapping to the official checkpoint names of spec 5.9 is mechanical: keras `{enc}/layer_{i}/X` <-
official `{scope}/encoder/layer_{i}/Y` (reshape the attention kernels and Q/K/V biases), with
X <- Y:
    self_attention_layer/{query,key,value}/{kernel,bias}  <- attention/self/{query,key,value}/...
    self_attention_layer/attention_output/{kernel,bias}   <- attention/output/dense/...
    self_attention_layer_norm/{gamma,beta}                <- attention/output/LayerNorm/...
    feedforward_intermediate_dense/{kernel,bias}          <- intermediate/dense/...
    feedforward_output_dense/{kernel,bias}                <- output/dense/...
    feedforward_layer_norm/{gamma,beta}                   <- output/LayerNorm/...
`{enc}/embeddings_project/{kernel,bias}` keeps the official name, and the shared block keeps
the discriminator's paths, "electra/embeddings/...", in both encoders, as official (see
embeddings.py). tests/test_modeling_reference.py loads official-layout weights this way.

Dropout draws from each block's seed generators, seeded from Python's `random` when the encoder
is constructed: call `keras.utils.set_random_seed(seed)` before building for reproducible
dropout (transformer_layer.py, "Randomness").

Not needed from keras-hub: `ElectraBackbone` adds a tanh pooler and uses the tanh-approximate GELU,
so it does not match; this encoder has no pooler (pooled_output = sequence_output[:, 0]).
"""

from __future__ import annotations

from typing import Optional, Union

import keras

from electra_tf.modeling.embeddings import (
    LAYER_NORM_EPSILON,
    DisentangledEmbeddings,
    ElectraEmbeddings,
    block_variables,
    get_activation,
    truncated_normal,
)
from electra_tf.modeling.transformer_layer import TransformerLayer


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraEncoder(keras.layers.Layer):
    """Official BertModel as used by ELECTRA: embeddings, optional projection, post-LN blocks.

    Args:
        vocab_size: int. Rows of the word-embedding table.
        hidden_size: int. Transformer width H.
        num_hidden_layers: int. Number of blocks.
        num_attention_heads: int. Heads per block; must divide hidden_size.
        intermediate_size: int. FFN width.
        embedding_size: int or None. Embedding width E; None means hidden_size. When E != H a
            linear `embeddings_project` (Glorot-uniform kernel, zero bias) maps E to H.
        hidden_act: str. FFN activation: "gelu" (exact erf), "relu", "tanh" or "linear".
        hidden_dropout_prob: float. Dropout on embeddings and residual branches.
        attention_probs_dropout_prob: float. Dropout on the attention probabilities.
        max_position_embeddings: int. Rows of the position table.
        type_vocab_size: int. Rows of the token-type table.
        initializer_range: float. Stddev of the truncated-normal initializer (tables and all
            transformer kernels).
        embeddings: an existing `ElectraEmbeddings` to share (the generator passes the
            discriminator's `encoder.embeddings`: same variables, official embedding sharing).
            It must have the same vocab_size, embedding_size, max_position_embeddings and
            type_vocab_size. None builds a new block. `embeddings_project` is never shared.
            A `DisentangledEmbeddings` (GDES, `embedding_sharing` "gdes") reads its block
            through zero-initialised deltas: the discriminator under GDES.
        fused_attention: bool. Each block computes its attention core with
            `keras.ops.dot_product_attention` (`TransformerLayer`; needs
            attention_probs_dropout_prob 0). Default False.
        **kwargs: forwarded to `keras.layers.Layer`. `name` defaults to "electra", the official
            scope (the generator should pass name="generator").

    Call arguments:
        inputs: dict of int32 tensors `[batch_size, seq_length]`: "input_ids", "input_mask"
            (1 = real token, 0 = padding), "segment_ids".
        training: bool. All dropout is applied only when True.

    Returns:
        dict with "sequence_output" `[batch_size, seq_length, hidden_size]` (the last layer) and
        "pooled_output" `[batch_size, hidden_size]` (= sequence_output[:, 0]; no pooler, as
        official), both in the compute dtype.

    All variables are created at construction. `get_config()` does not carry a shared
    `embeddings` block (one layer cannot live in two configs): `from_config` builds a fresh
    block, and the owner of both encoders re-ties them by passing `embeddings=` itself.
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_hidden_layers: int,
                 num_attention_heads: int, intermediate_size: int,
                 embedding_size: Optional[int] = None, hidden_act: str = "gelu",
                 hidden_dropout_prob: float = 0.1, attention_probs_dropout_prob: float = 0.1,
                 max_position_embeddings: int = 512, type_vocab_size: int = 2,
                 initializer_range: float = 0.02,
                 embeddings: Optional[Union[ElectraEmbeddings, DisentangledEmbeddings]] = None,
                 fused_attention: bool = False, **kwargs):
        kwargs.setdefault("name", "electra")
        super().__init__(**kwargs)
        if embedding_size is None:
            embedding_size = hidden_size
        if hidden_size % num_attention_heads:
            raise ValueError(f"{self.name}: hidden_size {hidden_size} is not a multiple of "
                             f"num_attention_heads {num_attention_heads}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.embedding_size = embedding_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.fused_attention = fused_attention

        if embeddings is None:
            embeddings = ElectraEmbeddings(
                vocab_size, embedding_size, max_position_embeddings=max_position_embeddings,
                type_vocab_size=type_vocab_size, hidden_dropout_prob=hidden_dropout_prob,
                initializer_range=initializer_range, dtype=self.dtype_policy, name="embeddings")
        else:
            self._check_shared_embeddings(embeddings)
        self.embeddings = embeddings

        if embedding_size != hidden_size:
            # Official: a plain tf.layers.dense, so Glorot-uniform kernel, zero bias, no activation.
            self.embeddings_project = keras.layers.Dense(
                hidden_size, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                dtype=self.dtype_policy, name="embeddings_project")
        else:
            self.embeddings_project = None

        activation = get_activation(hidden_act)
        for i in range(num_hidden_layers):
            # One attribute per block, not a list: Keras 3 wraps list attributes in a TrackedList
            # that tf.train.Checkpoint does not follow, so blocks held only in a list would be
            # silently missing from checkpoints. The attribute names are the official "layer_{i}".
            setattr(self, f"layer_{i}", TransformerLayer(
                intermediate_size, num_attention_heads,
                dropout=hidden_dropout_prob, attention_dropout=attention_probs_dropout_prob,
                activation=activation, layer_norm_epsilon=LAYER_NORM_EPSILON,
                kernel_initializer=truncated_normal(initializer_range), bias_initializer="zeros",
                normalize_first=False, fused_attention=fused_attention, dtype=self.dtype_policy,
                name=f"layer_{i}"))
        self.build()

    @property
    def encoder_layers(self) -> list:
        """The transformer blocks `layer_0 ... layer_{num_hidden_layers-1}`, in order."""
        return [getattr(self, f"layer_{i}") for i in range(self.num_hidden_layers)]

    def _check_shared_embeddings(self, embeddings):
        if not isinstance(embeddings, (ElectraEmbeddings, DisentangledEmbeddings)):
            raise TypeError(f"{self.name}: embeddings must be an ElectraEmbeddings or a "
                            f"DisentangledEmbeddings, got {type(embeddings).__name__}")
        for key in ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size"):
            mine, theirs = getattr(self, key), getattr(embeddings, key)
            if mine != theirs:
                raise ValueError(f"{self.name}: shared embeddings {embeddings.name!r} have "
                                 f"{key}={theirs}, but this encoder has {key}={mine}")

    @classmethod
    def from_model_config(cls, model_config, embeddings: Optional[ElectraEmbeddings] = None,
                          **kwargs) -> "ElectraEncoder":
        """Builds an encoder from a `model_config.ModelConfig` (official BertConfig sizes).

        Args:
            model_config: `ModelConfig`, e.g. from `get_bert_config` or `get_generator_config`.
            embeddings: optional `ElectraEmbeddings` to share (see class docstring).
            **kwargs: forwarded to the constructor (`name`, `dtype`, ...).
        """
        return cls(**model_config.to_dict(), embeddings=embeddings, **kwargs)

    def with_merged_embeddings(self) -> "ElectraEncoder":
        """This encoder with an embedding block of its own: what exports and fine-tuning take.

        Returns:
            `self`, unless its embeddings are a `DisentangledEmbeddings` (GDES); then a new
            encoder of the same sizes, name and dtype policy whose block holds the merged tables
            stop_gradient(shared) + delta and whose other weights are copies of this one's (it
            computes the same outputs, with the variables of a tied discriminator).
        """
        if not isinstance(self.embeddings, DisentangledEmbeddings):
            return self
        plain = ElectraEncoder.from_config(self.get_config())
        for target, value in zip(block_variables(plain.embeddings), self.embeddings.merged()):
            target.assign(value)
        for target, source in zip(_own_weights(plain), _own_weights(self)):
            target.assign(source)
        return plain

    def build(self, inputs_shape=None):
        # Every shape follows from the constructor arguments; building here (not lazily) lets a
        # generator share the variables, and checkpoints restore, before any forward pass. A
        # shared block is already built, under the path of the encoder that created it. A GDES
        # block is built first, so its variables keep the paths of a tied one ({name}/embeddings).
        shared = getattr(self.embeddings, "shared", None)
        if shared is not None and not shared.built:
            shared.build()
        if not self.embeddings.built:
            self.embeddings.build()
        if self.embeddings_project is not None and not self.embeddings_project.built:
            self.embeddings_project.build((None, None, self.embedding_size))
        for layer in self.encoder_layers:
            if not layer.built:
                layer.build((None, None, self.hidden_size))

    def call(self, inputs, training=None):
        hidden = self.embeddings(inputs["input_ids"], inputs["segment_ids"], training=training)
        if self.embeddings_project is not None:
            hidden = self.embeddings_project(hidden)
        padding_mask = inputs["input_mask"]
        for layer in self.encoder_layers:
            hidden = layer(hidden, padding_mask=padding_mask, training=training)
        return {"sequence_output": hidden, "pooled_output": hidden[:, 0]}

    def compute_output_spec(self, inputs, training=None):
        ids = inputs["input_ids"]
        batch, seq = ids.shape[0], ids.shape[1]
        dtype = self.compute_dtype
        return {
            "sequence_output": keras.KerasTensor((batch, seq, self.hidden_size), dtype=dtype),
            "pooled_output": keras.KerasTensor((batch, self.hidden_size), dtype=dtype),
        }

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "embedding_size": self.embedding_size,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "initializer_range": self.initializer_range,
            "fused_attention": self.fused_attention,
        })
        return config


def _own_weights(encoder: ElectraEncoder) -> list:
    """An encoder's weights outside its embedding block: projection, then blocks in order."""
    layers = ([encoder.embeddings_project] if encoder.embeddings_project is not None else [])
    return [w for layer in layers + encoder.encoder_layers for w in layer.weights]
