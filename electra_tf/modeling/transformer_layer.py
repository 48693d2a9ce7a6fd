"""One post-LN transformer block: keras-hub's `TransformerEncoder` as the official BERT block.

`TransformerLayer` is `keras_hub.layers.TransformerEncoder` (normalize_first=False, i.e. post-LN
as BERT), which computes exactly the official block (spec section 7):
    a = LN(dropout(Dense_H(attention(x))) + x);  out = LN(dropout(Dense_H(gelu(Dense_I(a)))) + a)
with separate Q/K/V projections with bias, scores / sqrt(head_size), softmax, dropout on the
attention probabilities, LayerNorm epsilon 1e-12 and the exact (erf) GELU. The tests check it
numerically against an independent float64 numpy transcription of the official block.
`encoder.ElectraEncoder` stacks these blocks.

Where keras-hub differs from the official code, and what this module does about it:
- One dropout rate for the attention probabilities and the residual branches. The official config
  has two (`attention_probs_dropout_prob`, `hidden_dropout_prob`), so `TransformerLayer` below adds
  `attention_dropout` and sets each Dropout sublayer's rate after building them. This touches
  keras-hub / keras private attributes (`_self_attention_dropout`, `_feedforward_dropout`,
  `_self_attention_layer._dropout{,_layer}`), valid for the pinned keras-hub 0.32 / keras 3.15;
  tests/test_modeling_reference.py checks the behaviour, so an upgrade that breaks it fails there.
- Padding mask: keras replaces masked scores by -1e9 and zeroes their probabilities; official adds
  -10000. Both give exactly the same float32 probabilities whenever a sequence has at least one
  real token (exp(-10000) underflows to 0). They differ only for a sequence whose input_mask is all
  zeros (keras: zero attention; official: attention over all positions), which ELECTRA data never
  contains ([CLS] is always real).
- Under mixed_bfloat16 keras-hub's call and `_fused_call` run the attention softmax in bfloat16
  (keras' choice); `_xla_call` and `_ops_call` run all elementwise work in float32. LayerNorm
  always computes in float32.

Backends and kernels (`kernel_settings.KERNELS`): `TransformerLayer` computes its block three ways,
the same function each time. On TensorFlow, `_xla_call` (training calls, KERNELS "xla", the
default: xla_clusters.py) and `_fused_call` (inference, or KERNELS "tf": fused.py) run
TensorFlow kernels, the speed path. JAX and PyTorch run `_ops_call`, the block in `keras.ops`
(ops_kernels.py), which TensorFlow runs too with KERNELS "ops". keras-hub's own call would draw
dropout from each backend's generator; `_ops_call` draws the hash stream from the same seed
generators, so a block drops the same elements on every backend
(tests/modeling/test_backend_parity.py).

Randomness: every keras Dropout layer owns a seed generator whose seed is drawn from Python's
`random` when the layer is constructed, so call `keras.utils.set_random_seed(seed)` before building
for reproducible dropout. The states are in `non_trainable_variables` (not in `weights`, and not
followed by tf.train.Checkpoint through the layer: a trainer that wants exact resumes saves them
itself). Under MirroredStrategy both replicas hold the same state, so they draw the same masks.
"""

from __future__ import annotations

from typing import Optional

import keras
import keras_hub
from keras import ops

from electra_tf.modeling import kernel_settings, ops_kernels, tf_kernels

# When True (default), `TransformerLayer` runs its own forward pass (`_xla_call`, `_fused_call`
# or `_ops_call`, after `kernel_settings.KERNELS` and the backend); False runs keras-hub's own
# `TransformerEncoder.call` on the same variables. They compute the same function, with the same
# dropout masks under DROPOUT_RNG "philox" on TensorFlow (tests/training/test_speed_equivalence.py);
# the switch exists so tests can compare them.
FUSED_BLOCK = True

# keras.layers.Softmax replaces masked attention scores by these values (keras
# `_large_negative_number`: -3e4 in float16, which cannot hold -1e9); the fused block adds them
# instead, which gives the same float probabilities whenever a row has at least one unmasked key
# (score + large negative rounds to the large negative, whose exp underflows to 0).
_MASKED_SCORE = ops_kernels.MASKED_SCORE
_MASKED_SCORE_FLOAT16 = -3e4
# Compute dtypes in which the FFN's exact GELU runs as `gelu` below (float32 math, closed-form
# gradient) instead of keras' op-by-op erf form: half-precision Eigen kernels are slow on CPU.
_CUSTOM_GELU_DTYPES = ("bfloat16", "float16")


@keras.saving.register_keras_serializable(package="electra_tf")
class TransformerLayer(keras_hub.layers.TransformerEncoder):
    """keras-hub's TransformerEncoder with its own dropout rate for the attention probabilities.

    Args:
        intermediate_dim: int. FFN width (official intermediate_size).
        num_heads: int. Attention heads.
        dropout: float. Dropout on the two residual branches (official hidden_dropout_prob).
        attention_dropout: float or None. Dropout on the attention probabilities (official
            attention_probs_dropout_prob); None means the same as `dropout`.
        fused_attention: bool. Compute softmax(QK^T + mask) V with
            `keras.ops.dot_product_attention` (on JAX: cuDNN flash attention where the GPU and
            shapes allow it, else XLA's own) in the keras.ops block (`_ops_call`, which then
            runs on TensorFlow too). The same function (equal to float rounding); it has no
            dropout on the probabilities, so `attention_dropout` must be 0. Default False.
        **kwargs: forwarded to `keras_hub.layers.TransformerEncoder` (activation,
            layer_norm_epsilon, kernel_initializer, normalize_first, name, dtype, ...).

    Raises:
        ValueError: `fused_attention` with an `attention_dropout` above 0.
    """

    def __init__(self, intermediate_dim: int, num_heads: int, dropout: float = 0.0,
                 attention_dropout: Optional[float] = None, fused_attention: bool = False,
                 **kwargs):
        super().__init__(intermediate_dim, num_heads, dropout=dropout, **kwargs)
        self.attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.fused_attention = fused_attention
        if fused_attention and self.attention_dropout > 0:
            raise ValueError(
                f"{self.name}: fused_attention computes attention with "
                "keras.ops.dot_product_attention, which has no dropout on the attention "
                f"probabilities; set the attention dropout (attention_probs_dropout_prob) to 0, "
                f"got {self.attention_dropout}")

    def build(self, inputs_shape):
        # The parent builds all three Dropout layers (two residual, one inside the attention)
        # with `self.dropout`. A keras Dropout built with rate 0 has no seed generator and can
        # never be switched on, so build them with the larger rate, then give each its own.
        hidden_rate = self.dropout
        self.dropout = max(hidden_rate, self.attention_dropout)
        try:
            super().build(inputs_shape)
        finally:
            self.dropout = hidden_rate
        self._self_attention_dropout.rate = hidden_rate
        self._feedforward_dropout.rate = hidden_rate
        # keras.layers.MultiHeadAttention reads `_dropout` at call time (it takes the fused
        # dot-product path only when it is 0) and applies `_dropout_layer` to the probabilities.
        attention = self._self_attention_layer
        attention._dropout = self.attention_dropout
        attention._dropout_layer.rate = self.attention_dropout

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None,
             return_attention_scores=False):
        if (not FUSED_BLOCK or attention_mask is not None or return_attention_scores
                or self.normalize_first or inputs.shape[-1] is None):
            return super().call(inputs, padding_mask=padding_mask, attention_mask=attention_mask,
                                training=training, return_attention_scores=return_attention_scores)
        if self.fused_attention:  # keras.ops.dot_product_attention, on every backend
            return self._ops_call(inputs, padding_mask, bool(training))
        if kernel_settings.use_xla(training):
            return self._xla_call(inputs, padding_mask, True)
        if kernel_settings.use_tensorflow_kernels():
            return self._fused_call(inputs, padding_mask, bool(training))
        return self._ops_call(inputs, padding_mask, bool(training))

    def _fused_call(self, x, padding_mask, training):
        """keras-hub's post-LN block on the same variables, with fewer and larger kernels.

        Same function and same dropout masks as `TransformerEncoder.call` (each Dropout layer's
        seed generator is advanced and used exactly as keras does), computed with:
        - one [tokens, H] x [H, 3H] matmul for Q, K and V instead of three einsums;
        - batched matmuls on [batch, heads, seq, head_size] (one transpose in, one out);
        - the padding mask added to the scores as a [batch, 1, 1, seq] bias instead of two
          selects over [batch, heads, seq, seq];
        - dropout as one multiply by a mask of 0 / (1 / (1 - rate)) (gradient: the same multiply);
        - LayerNorm with a hand-written gradient (`layer_norm`), in float32 as keras.
        Measured on ELECTRA-small (2-core CPU): see docs/benchmarks.md.
        """
        tf, fused, streams, _ = tf_kernels.load()
        dtype = self.compute_dtype
        attention = self._self_attention_layer
        heads, head_size = attention._num_heads, attention._key_dim
        width = x.shape[-1]
        shape = tf.shape(x)
        batch, seq = shape[0], shape[1]
        rows = tf.reshape(x, [-1, width])  # [B*L, H]

        def kernel(layer, new_shape):
            return tf.reshape(tf.cast(layer.kernel, dtype), new_shape)

        def bias(layer):
            return tf.reshape(tf.cast(layer.bias, dtype), [-1])

        projections = (attention._query_dense, attention._key_dense, attention._value_dense)
        qkv_kernel = tf.concat([kernel(p, [width, heads * head_size]) for p in projections], 1)
        qkv_bias = tf.concat([bias(p) for p in projections], 0)
        qkv = tf.nn.bias_add(tf.matmul(rows, qkv_kernel), qkv_bias)  # [B*L, 3*heads*hs]
        qkv = tf.transpose(tf.reshape(qkv, [batch, seq, 3, heads, head_size]), [2, 0, 3, 1, 4])
        # unstack, not qkv[i]: a slice's gradient would materialise three full-size zero tensors.
        query, key, value = tf.unstack(qkv, 3)  # [B, heads, L, hs]
        query = query * tf.cast(attention._inverse_sqrt_key_dim, dtype)  # keras scales the query
        scores = tf.matmul(query, key, transpose_b=True)  # [B, heads, L, L]
        if padding_mask is not None:
            masked_score = _MASKED_SCORE_FLOAT16 if dtype == "float16" else _MASKED_SCORE
            keep = tf.cast(padding_mask, tf.bool)[:, tf.newaxis, tf.newaxis, :]
            scores = scores + tf.where(keep, tf.constant(0.0, dtype),
                                       tf.constant(masked_score, dtype))
        probs = tf.nn.softmax(scores, axis=-1)
        probs = streams.dropout(probs, attention._dropout_layer, training)
        context = tf.matmul(probs, value)  # [B, heads, L, hs]
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, heads * head_size])
        out = attention._output_dense
        attended = tf.nn.bias_add(tf.matmul(context, kernel(out, [heads * head_size, width])),
                                  bias(out))
        attended = streams.dropout(attended, self._self_attention_dropout, training) + rows
        attended = fused.layer_norm(attended, self._self_attention_layer_norm, dtype)
        return tf.reshape(self._fused_feedforward(attended, dtype, training), shape)

    def _fused_feedforward(self, attended, dtype, training):
        """`_fused_call`'s feed-forward half on rows [B*L, H]: dense, GELU, dense, dropout,
        residual, LayerNorm."""
        tf, fused, streams, _ = tf_kernels.load()
        inner, outer = self._feedforward_intermediate_dense, self._feedforward_output_dense

        def bias(layer):
            return tf.reshape(tf.cast(layer.bias, dtype), [-1])

        hidden = tf.nn.bias_add(tf.matmul(attended, tf.cast(inner.kernel, dtype)), bias(inner))
        if inner.activation is keras.activations.gelu and dtype in _CUSTOM_GELU_DTYPES:
            hidden = fused.gelu(hidden)
        elif inner.activation is not None:
            hidden = inner.activation(hidden)
        hidden = tf.nn.bias_add(tf.matmul(hidden, tf.cast(outer.kernel, dtype)), bias(outer))
        hidden = streams.dropout(hidden, self._feedforward_dropout, training) + attended
        return fused.layer_norm(hidden, self._feedforward_layer_norm, dtype)

    def _xla_call(self, x, padding_mask, training):
        """The same block with the elementwise work between the matmuls in XLA clusters
        (`kernel_settings.KERNELS` = "xla", training calls): the matmuls stay TensorFlow's (oneDNN
        on CPU), and each stretch between two of them is one compiled loop forward and one
        backward (see xla_clusters.py): QKV bias + head split + query scaling; mask + softmax +
        dropout; bias + dropout + residual + LayerNorm (twice); bias + GELU. The four dense
        products go through `fused.matmul`, whose input gradient follows
        `kernel_settings.DENSE_GRAD`.
        """
        tf, fused, streams, clusters = tf_kernels.load()
        dtype = self.compute_dtype
        attention = self._self_attention_layer
        heads, head_size = attention._num_heads, attention._key_dim
        width = x.shape[-1]
        shape = tf.shape(x)
        rows = tf.reshape(x, [-1, width])  # [B*L, H]

        def kernel(layer, new_shape):
            return tf.reshape(tf.cast(layer.kernel, dtype), new_shape)

        def bias(layer):
            return tf.reshape(tf.cast(layer.bias, tf.float32), [-1])

        projections = (attention._query_dense, attention._key_dense, attention._value_dense)
        qkv_kernel = tf.concat([kernel(p, [width, heads * head_size]) for p in projections], 1)
        qkv = tf.reshape(fused.matmul(rows, qkv_kernel), [shape[0], shape[1], -1])  # [B, L, 3H]
        query, key, value = clusters.split_heads(
            qkv, tf.concat([bias(p) for p in projections], 0), heads,
            float(attention._inverse_sqrt_key_dim))  # [B, heads, L, hs] each, query scaled
        scores = tf.matmul(query, key, transpose_b=True)  # [B, heads, L, L]
        if padding_mask is None:
            mask_bias = tf.zeros([1, 1, 1, 1], tf.float32)
        else:
            keep = tf.cast(padding_mask, tf.bool)[:, tf.newaxis, tf.newaxis, :]
            mask_bias = tf.where(keep, 0.0, _MASKED_SCORE)  # [B, 1, 1, L] float32
        probs = clusters.attention_probs(
            scores, mask_bias,
            streams.draw_noise(attention._dropout_layer, tf.shape(scores), dtype, training))
        context = tf.matmul(probs, value)  # [B, heads, L, hs]
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, heads * head_size])
        out = attention._output_dense
        attended = self._matmul_norm(context, kernel(out, [heads * head_size, width]), bias(out),
                                     rows, self._self_attention_dropout,
                                     self._self_attention_layer_norm, training)
        inner, outer = self._feedforward_intermediate_dense, self._feedforward_output_dense
        hidden = fused.matmul(attended, tf.cast(inner.kernel, dtype))
        if inner.activation is keras.activations.gelu:
            hidden = clusters.bias_gelu(hidden, bias(inner))
        else:
            hidden = tf.nn.bias_add(hidden, tf.cast(inner.bias, dtype))
            if inner.activation is not None:
                hidden = inner.activation(hidden)
        hidden = self._matmul_norm(hidden, tf.cast(outer.kernel, dtype), bias(outer), attended,
                                   self._feedforward_dropout, self._feedforward_layer_norm,
                                   training)
        return tf.reshape(hidden, shape)

    @staticmethod
    def _matmul_norm(x, kernel, bias, residual, dropout_layer, norm, training):
        """LayerNorm(dropout(x @ kernel + bias) + residual), the elementwise part one cluster."""
        tf, fused, streams, clusters = tf_kernels.load()
        h = fused.matmul(x, kernel)
        return clusters.bias_dropout_residual_norm(
            h, bias, residual, tf.cast(norm.gamma, tf.float32), tf.cast(norm.beta, tf.float32),
            norm.epsilon, streams.draw_noise(dropout_layer, tf.shape(h), h.dtype, training))

    def _ops_call(self, x, padding_mask, training):
        """`_fused_call`'s block in `keras.ops`, the forward pass of every backend (ops_kernels.py).

        The same function as `_fused_call` and `_xla_call`, computed as `_xla_call` computes it:
        one [tokens, H] x [H, 3H] matmul for Q, K and V, the query scaled, the padding mask a
        -1e9 score bias, and the elementwise work between the matmuls in float32 (softmax,
        dropout, residual adds, LayerNorm, GELU) rounded to the compute dtype once. The three
        Dropout layers' seed generators are advanced once each, in `_fused_call`'s order
        (attention probabilities, attention output, FFN output), so with DROPOUT_RNG "hash" the
        masks are those of the TensorFlow paths on every backend.
        """
        dtype = self.compute_dtype
        attention = self._self_attention_layer
        heads, head_size = attention._num_heads, attention._key_dim
        width = x.shape[-1]
        shape = ops.shape(x)
        rows = ops.reshape(x, (-1, width))  # [B*L, H]

        def kernel(layer, new_shape):
            return ops.reshape(ops.cast(layer.kernel, dtype), new_shape)

        def bias(layer):
            return ops.reshape(ops.cast(layer.bias, "float32"), (-1,))

        projections = (attention._query_dense, attention._key_dense, attention._value_dense)
        qkv_kernel = ops.concatenate([kernel(p, (width, heads * head_size)) for p in projections],
                                     axis=1)
        qkv = ops.cast(ops.matmul(rows, qkv_kernel), "float32") + ops.concatenate(
            [bias(p) for p in projections], axis=0)  # [B*L, 3*heads*hs]
        qkv = ops.reshape(qkv, (shape[0], shape[1], 3, heads, head_size))
        # The core under its own name scope: profiles (benchmarks/profile_step.py) find it there.
        with keras.name_scope("attention"):
            if self.fused_attention:
                context = self._dot_product_attention(qkv, padding_mask, dtype)
            else:
                context = self._attention_core(qkv, padding_mask, dtype, training)
        context = ops.reshape(context, (-1, heads * head_size))
        out = attention._output_dense
        attended = self._ops_matmul_norm(
            context, kernel(out, (heads * head_size, width)), bias(out), rows,
            self._self_attention_dropout, self._self_attention_layer_norm, training)
        inner, outer = self._feedforward_intermediate_dense, self._feedforward_output_dense
        hidden = ops_kernels.bias_activation(ops.matmul(attended, ops.cast(inner.kernel, dtype)),
                                             bias(inner), inner.activation)
        hidden = self._ops_matmul_norm(hidden, ops.cast(outer.kernel, dtype), bias(outer),
                                       attended, self._feedforward_dropout,
                                       self._feedforward_layer_norm, training)
        return ops.reshape(hidden, shape)

    def _attention_core(self, qkv, padding_mask, dtype, training):
        """dropout(softmax(Q K^T + mask)) V from float32 qkv [B, L, 3, heads, hs]: the query
        scaled in float32 and both matmuls in the compute dtype, as `_xla_call`.

        Returns:
            [B, L, heads, hs] in the compute dtype.
        """
        attention = self._self_attention_layer
        query, key, value = ops.unstack(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3, axis=0)
        query = ops.cast(query * attention._inverse_sqrt_key_dim, dtype)  # keras scales queries
        scores = ops.matmul(query, ops.swapaxes(ops.cast(key, dtype), -1, -2))  # [B, heads, L, L]
        probs = ops_kernels.attention_probs(
            scores, None if padding_mask is None else ops_kernels.padding_bias(padding_mask),
            ops_kernels.draw(attention._dropout_layer, ops.shape(scores), dtype, training))
        context = ops.matmul(probs, ops.cast(value, dtype))  # [B, heads, L, hs]
        return ops.transpose(context, (0, 2, 1, 3))

    def _dot_product_attention(self, qkv, padding_mask, dtype):
        """`_attention_core` (without dropout: `attention_dropout` is 0) as one
        `keras.ops.dot_product_attention` call on the [B, L, heads, hs] layout it takes.

        The query is scaled in float32 before the cast as in `_attention_core` (scale 1 then);
        the padding mask is the same -1e9 score bias (`ops_kernels.padding_bias`, cast to the
        compute dtype by keras), broadcast to [B, 1, L, L]: cuDNN's fused kernel takes a bias
        only with both sequence axes whole (jax's `check_layout`). flash_attention None lets
        keras choose that kernel where it is usable (JAX on an Ampere or newer GPU) and XLA's
        otherwise.
        """
        attention = self._self_attention_layer
        query, key, value = ops.unstack(qkv, 3, axis=2)  # [B, L, heads, hs] each, float32
        query = ops.cast(query * attention._inverse_sqrt_key_dim, dtype)
        bias = None
        if padding_mask is not None:
            batch, length = ops.shape(qkv)[0], ops.shape(qkv)[1]
            bias = ops.broadcast_to(ops_kernels.padding_bias(padding_mask),
                                    (batch, 1, length, length))
        return ops.dot_product_attention(query, ops.cast(key, dtype), ops.cast(value, dtype),
                                         bias=bias, scale=1.0)

    @staticmethod
    def _ops_matmul_norm(x, kernel, bias, residual, dropout_layer, norm, training):
        """LayerNorm(dropout(x @ kernel + bias) + residual) in `keras.ops` (`_matmul_norm`'s)."""
        h = ops.matmul(x, kernel)
        return ops_kernels.bias_dropout_residual_norm(
            h, bias, residual, ops.cast(norm.gamma, "float32"), ops.cast(norm.beta, "float32"),
            norm.epsilon, ops_kernels.draw(dropout_layer, ops.shape(h), h.dtype, training))

    def get_config(self):
        config = super().get_config()
        config["attention_dropout"] = self.attention_dropout
        config["fused_attention"] = self.fused_attention
        return config
