"""The optimised training step computes what the unoptimised one computes (issue 5).

The fast path is three changes, each switched off here to rebuild the unoptimised step:
- `encoder.FUSED_BLOCK`: the fused transformer block (one QKV matmul, additive mask, mask-multiply
  dropout with keras' own seeds, LayerNorm / bfloat16 GELU with closed-form gradients) vs
  keras-hub's `TransformerEncoder.call` on the same variables;
- `losses._softmax_cross_entropy` (softmax-based NLL with a hand-written gradient) vs
  `tf.nn.sparse_softmax_cross_entropy_with_logits` + argmax;
- the fused `ResourceApplyAdam` update of `AdamWeightDecay` vs its per-op update.
A fixed-seed short run (dropout on, masking and sampling from the step seed) must give the same
losses, gradient norms and weights up to float rounding.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.modeling import encoder
from electra_tf.pretraining import losses
from electra_tf.pretraining.pretrainer import ElectraPretrainer
from electra_tf.training import optimization, optimizers
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
VOCAB = 100
SEQ = 32
BATCH = 4
HPARAMS = {
    "vocab_size": VOCAB, "max_seq_length": SEQ, "embedding_size": 32,
    "model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2},
    "learning_rate": 1e-3, "num_warmup_steps": 0, "num_train_steps": 100,
}


def _reference_cross_entropy(logits, labels):
    """The unoptimised MLM kernel: TensorFlow's sparse cross-entropy and a separate argmax."""
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return nll, tf.argmax(logits, axis=-1, output_type=tf.int32)


@contextlib.contextmanager
def _unoptimised(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(encoder, "FUSED_BLOCK", False)
        m.setattr(losses, "_softmax_cross_entropy", _reference_cross_entropy)
        m.setattr(optimizers, "_fusable_handles", lambda *args: None)
        yield


def _batches(steps):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(steps):
        ids = rng.integers(5, VOCAB, (BATCH, SEQ))
        lengths = [SEQ, SEQ - 5, 20, 12]
        mask = (np.arange(SEQ)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
        ids[:, 0] = SPECIAL.cls_id
        for b, n in enumerate(lengths):
            ids[b, n - 1] = SPECIAL.sep_id
        ids = ids * mask
        segment = ((np.arange(SEQ)[None, :] >= 10) & (mask > 0)).astype(np.int32)
        out.append({"input_ids": tf.constant(ids, tf.int32), "input_mask": tf.constant(mask),
                    "segment_ids": tf.constant(segment)})
    return out


def _run(steps, policy):
    """Builds the model and optimizer from seed 0 and trains `steps` steps; returns the history."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        config = PretrainingConfig.create("equivalence", "/nonexistent-data-dir", HPARAMS)
        keras.utils.set_random_seed(0)
        model = ElectraPretrainer.from_pretraining_config(config, SPECIAL)
        model.build_from_sequence_length()
        optimizer, _ = optimization.create_optimizer(config)
        variables = model.trainable_variables
        optimizer.build(variables)

        @tf.function
        def step(batch):
            seed = tf.stack([tf.constant(0, tf.int64), tf.cast(optimizer.iterations, tf.int64)])
            with tf.GradientTape() as tape:
                outputs = model(batch, seed=seed, training=True)
            grads = tape.gradient(outputs["total_loss"], variables)
            norm = optimization.apply_gradients(optimizer, grads, variables)
            return [outputs[k] for k in ("total_loss", "masked_lm_loss", "disc_loss")] + [norm]

        history = [np.array([float(v) for v in step(b)]) for b in _batches(steps)]
        return np.stack(history), [v.numpy() for v in variables]
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_fused_float32_run_matches_unoptimised_run(monkeypatch):
    fast, fast_weights = _run(3, "float32")
    with _unoptimised(monkeypatch):
        slow, slow_weights = _run(3, "float32")
    # Same masks, samples and dropout: the losses agree to float rounding, step after step.
    np.testing.assert_allclose(fast, slow, rtol=2e-5)
    assert np.all(np.abs(np.diff(fast[:, 0])) > 1e-4)  # the weights did move between steps
    for a, b in zip(fast_weights, slow_weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)


def test_fused_bfloat16_run_tracks_unoptimised_run(monkeypatch):
    fast, _ = _run(2, "mixed_bfloat16")
    with _unoptimised(monkeypatch):
        slow, _ = _run(2, "mixed_bfloat16")
    # bfloat16 rounds differently in the two graphs (GELU in float32 here): a looser tolerance.
    np.testing.assert_allclose(fast, slow, rtol=3e-2)


def test_fused_block_is_the_default():
    assert encoder.FUSED_BLOCK is True


@pytest.mark.parametrize("training", [False, True])
def test_fused_block_matches_keras_hub_call_with_padding(training, monkeypatch):
    keras.utils.set_random_seed(3)
    layer = encoder.TransformerLayer(64, 4, dropout=0.1, attention_dropout=0.2,
                                     activation=keras.activations.gelu, layer_norm_epsilon=1e-12)
    layer.build((None, None, 32))
    x = tf.random.stateless_normal([3, 9, 32], [1, 2])
    mask = tf.constant([[1] * 9, [1] * 5 + [0] * 4, [1] * 2 + [0] * 7])
    state = [v.numpy() for v in layer.non_trainable_variables]

    def forward():
        with tf.GradientTape() as tape:
            y = layer(x, padding_mask=mask, training=training)
            loss = tf.reduce_sum(y * tf.random.stateless_normal(tf.shape(y), [3, 4]))
        return y.numpy(), [g.numpy() for g in tape.gradient(loss, layer.trainable_variables)]

    fast_y, fast_g = forward()
    for v, s in zip(layer.non_trainable_variables, state):
        v.assign(s)  # rewind the dropout seed generators: the same masks again
    monkeypatch.setattr(encoder, "FUSED_BLOCK", False)
    slow_y, slow_g = forward()
    np.testing.assert_allclose(fast_y, slow_y, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast_g, slow_g):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_fused_block_half_precision_padding_is_finite_and_tracks_keras(policy, monkeypatch):
    # float16 cannot hold the -1e9 mask value: keras uses -3e4 there, and so must the fused block
    # (0 * -inf would turn every kept score into NaN).
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(4)
        layer = encoder.TransformerLayer(64, 4, activation=keras.activations.gelu,
                                         layer_norm_epsilon=1e-12)
        layer.build((None, None, 32))
        x = tf.random.stateless_normal([2, 7, 32], [5, 6])
        mask = tf.constant([[1] * 7, [1] * 3 + [0] * 4])
        fast = tf.cast(layer(x, padding_mask=mask), tf.float32).numpy()
        monkeypatch.setattr(encoder, "FUSED_BLOCK", False)
        slow = tf.cast(layer(x, padding_mask=mask), tf.float32).numpy()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert np.all(np.isfinite(fast))
    np.testing.assert_allclose(fast, slow, atol=0.1)
