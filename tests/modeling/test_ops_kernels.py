"""The keras.ops kernels (ops_kernels.py, `TransformerLayer._ops_call`: what JAX and PyTorch run,
and TensorFlow with KERNELS "ops") against TensorFlow's own kernels (fused.py: `_fused_call`,
`_xla_call`) on TensorFlow: the same function with the same dropout masks, forward and backward."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.modeling import kernel_settings, tf_kernels
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead
from electra_tf.modeling.transformer_layer import TransformerLayer

METHODS = ("_ops_call", "_fused_call", "_xla_call")


def _block(policy="float32"):
    """A block with both dropouts on, its input with padding, and its seed-generator states."""
    keras.utils.set_random_seed(3)
    layer = TransformerLayer(64, 4, dropout=0.1, attention_dropout=0.1, dtype=policy,
                             activation=keras.activations.gelu, layer_norm_epsilon=1e-12)
    layer.build((None, None, 32))
    x = tf.random.stateless_normal([3, 9, 32], [1, 2])
    mask = tf.constant([[1] * 9, [1] * 5 + [0] * 4, [1] * 2 + [0] * 7])
    return layer, x, mask, [v.numpy() for v in layer.non_trainable_variables]


def _rewind(layer, state):
    """Seed generators back to `state`: the next calls draw the same masks again."""
    for variable, value in zip(layer.non_trainable_variables, state):
        variable.assign(value)


def _forward_backward(layer, x, fn):
    """fn()'s output, and the gradients of a fixed projection of it for x and every weight."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.cast(fn(), tf.float32)
        loss = tf.reduce_sum(y * tf.random.stateless_normal(tf.shape(y), [3, 4]))
    grads = tape.gradient(loss, [x] + layer.trainable_variables)
    return y.numpy(), [tf.cast(g, tf.float32).numpy() for g in grads]


def assert_gradients_close(actual, expected, names, err_msg):
    """Float32 rounding of gradients: rtol 1e-4, atol 1e-5 of each gradient's largest value.

    The attention key biases' gradients are zero in exact arithmetic (softmax ignores a constant
    added to all of a query's scores), so both sides hold only rounding noise there: checked to
    be below 1e-6 of the largest gradient instead.
    """
    scale = max(np.abs(b).max() for b in expected)
    for a, b, name in zip(actual, expected, names):
        if name.endswith("key/bias"):
            assert max(np.abs(a).max(), np.abs(b).max()) < 1e-6 * scale, name
        else:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max(),
                                       err_msg=f"{err_msg}: {name}")


@pytest.mark.parametrize("dropout_rng", kernel_settings.DROPOUT_RNG_CHOICES)
@pytest.mark.parametrize("training", [True, False])
def test_ops_block_equals_fused_and_xla_blocks(training, dropout_rng):
    layer, x, mask, state = _block()
    results, states = {}, {}
    with kernel_settings.kernel_options(dropout_rng=dropout_rng):
        for method in METHODS:
            _rewind(layer, state)
            results[method] = _forward_backward(
                layer, x, lambda: getattr(layer, method)(x, mask, training))
            states[method] = [v.numpy() for v in layer.non_trainable_variables]
    # Each Dropout layer's seed generator advanced as often by every path (once per call).
    for method in METHODS[1:]:
        for a, b in zip(states["_ops_call"], states[method]):
            np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(states["_ops_call"], state)) == training
    ops_y, ops_grads = results["_ops_call"]
    for method in METHODS[1:]:
        y, grads = results[method]
        np.testing.assert_allclose(ops_y, y, rtol=1e-5, atol=1e-6, err_msg=method)
        assert_gradients_close(ops_grads, grads,
                                ["input"] + [v.path for v in layer.trainable_variables], method)
    if training:  # the dropout masks matter: without them the block computes something else
        clean, _ = _forward_backward(layer, x, lambda: layer._ops_call(x, mask, False))
        assert np.abs(clean - ops_y).max() > 1e-2


# Under mixed_bfloat16 the kernels round in different places: `_ops_call` and `_xla_call` do the
# elementwise work in float32 and round once (measured: the same outputs, gradients within 1.6%
# of their largest value), `_fused_call` runs the softmax, bias adds, dropout and residual adds
# in bfloat16 (outputs within 0.023 of LayerNorm'd values |y| ~ 1, i.e. a few bfloat16 ulps;
# gradients within 3.3%). Tolerances: about twice what was measured, relative to max(1, |max|).
BF16_ATOL = {"xla": 3e-2, "tf": 6e-2}


@pytest.mark.parametrize("kernels, training", [("xla", True), ("tf", True), ("tf", False)])
def test_ops_block_tracks_tensorflow_kernels_under_mixed_bfloat16(kernels, training):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        layer, x, mask, state = _block("mixed_bfloat16")
        out = {}
        for choice in ("ops", kernels):
            _rewind(layer, state)
            with kernel_settings.kernel_options(choice, "hash"):
                out[choice] = _forward_backward(
                    layer, x, lambda: layer(x, padding_mask=mask, training=training))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    (ops_y, ops_grads), (y, grads) = out["ops"], out[kernels]
    assert np.all(np.isfinite(ops_y))
    np.testing.assert_allclose(ops_y, y, atol=BF16_ATOL[kernels])
    for a, b in zip(ops_grads, grads):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=BF16_ATOL[kernels] * max(1.0, np.abs(b).max()))


def _pretraining_layers():
    """Discriminator and generator encoders sharing one embedding block (E != H: the
    discriminator's projection exists), and both heads, with dropout on."""
    keras.utils.set_random_seed(1)
    disc = ElectraEncoder(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=64, embedding_size=16,
                          max_position_embeddings=16)
    gen = ElectraEncoder(vocab_size=60, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32, embedding_size=16,
                         max_position_embeddings=16, embeddings=disc.embeddings, name="generator")
    disc_head, gen_head = DiscriminatorHead(32), GeneratorHead(16, 60)
    disc_head.build((None, None, 32))
    gen_head.build((None, None, 16))
    return disc, gen, disc_head, gen_head


def _pretraining_outputs(layers, training):
    disc, gen, disc_head, gen_head = layers
    ids = tf.constant(np.random.default_rng(2).integers(5, 60, (3, 12)), tf.int32)
    mask = tf.constant((np.arange(12)[None, :] < np.array([[12], [7], [3]])).astype(np.int32))
    inputs = {"input_ids": ids * mask, "input_mask": mask, "segment_ids": tf.zeros_like(ids)}
    variables = []
    for layer in layers:  # the shared embeddings once
        variables += [v for v in layer.trainable_variables if all(v is not w for w in variables)]
    with tf.GradientTape() as tape:
        disc_out = disc(inputs, training=training)["sequence_output"]
        gen_out = gen(inputs, training=training)["sequence_output"]
        outputs = [disc_out, gen_out, disc_head(disc_out, training=training),
                   gen_head(gen_out, disc.embeddings.word_embeddings.embeddings)]
        loss = sum(tf.reduce_sum(y * tf.random.stateless_normal(tf.shape(y), [i, 9]))
                   for i, y in enumerate(outputs))
    grads = tape.gradient(loss, variables)  # embedding tables: IndexedSlices
    return ([y.numpy() for y in outputs], [tf.convert_to_tensor(g).numpy() for g in grads],
            [v.path for v in variables])


@pytest.mark.parametrize("training", [True, False])
def test_ops_encoders_and_heads_equal_tensorflow_kernels(training):
    """Embeddings (LayerNorm + dropout), projection, blocks and both heads, generator and
    discriminator sharing the embeddings: "ops" against "xla" and "tf", values and gradients."""
    layers = _pretraining_layers()
    state = [[v.numpy() for v in layer.non_trainable_variables] for layer in layers]
    out = {}
    for kernels in kernel_settings.KERNEL_CHOICES:
        for layer, values in zip(layers, state):
            _rewind(layer, values)
        with kernel_settings.kernel_options(kernels, "hash"):
            out[kernels] = _pretraining_outputs(layers, training)
    for kernels in ("xla", "tf"):
        for a, b in zip(out["ops"][0], out[kernels][0]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=kernels)
        assert_gradients_close(out["ops"][1], out[kernels][1], out[kernels][2], kernels)


def test_ops_kernels_never_reach_tensorflow_kernels(monkeypatch):
    """With KERNELS "ops" no layer takes a TensorFlow kernel path (as on JAX and PyTorch, where
    `tf_kernels.load` could not import): training and inference calls, forward and backward."""
    def unreachable():
        raise AssertionError("a TensorFlow kernel path was taken under KERNELS 'ops'")

    layers = _pretraining_layers()
    monkeypatch.setattr(tf_kernels, "load", unreachable)
    with kernel_settings.kernel_options("ops"):
        for training in (True, False):
            _pretraining_outputs(layers, training)
    with kernel_settings.kernel_options("xla"), pytest.raises(AssertionError, match="kernel path"):
        _pretraining_outputs(layers, True)
