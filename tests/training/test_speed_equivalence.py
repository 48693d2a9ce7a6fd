"""The optimised training step computes what the unoptimised one computes (issues 5 and 19).

The fast path of issue 5 is three changes, each switched off here to rebuild the unoptimised
step (together with issue 19's kernels below):
- `transformer_layer.FUSED_BLOCK`: the fused transformer block (one QKV matmul, additive mask,
  mask-multiply dropout with keras' own seeds, LayerNorm / bfloat16 GELU with closed-form
  gradients) vs keras-hub's `TransformerEncoder.call` on the same variables;
- `losses._softmax_cross_entropy` (softmax-based NLL with a hand-written gradient) vs
  `tf.nn.sparse_softmax_cross_entropy_with_logits` + argmax;
- the fused `ResourceApplyAdam` update of `AdamWeightDecay` vs its per-op update.
A fixed-seed short run (dropout on, masking and sampling from the step seed) must give the same
losses, gradient norms and weights up to float rounding.

Issue 19 adds three switches in `electra_tf.modeling.fused`, each checked against the op-by-op path:
- `KERNELS` "xla": the elementwise work between the matmuls (bias + GELU; mask + softmax +
  dropout; bias + dropout + residual + LayerNorm; the embeddings' LayerNorm + dropout) as
  XLA-compiled clusters with hand-written gradients, vs "tf" (op by op);
- `DROPOUT_RNG` "hash": counter-based dropout bits, vs "philox" (keras' own draws). "hash" is
  another stream, so it is compared with the op-by-op path using the same stream, and its masks
  are checked for rate, independence and reproducibility.
- `SAMPLING_RNG` "hash": the generator's Gumbel noise from a keyed hash, fused with the sampling
  scores in one XLA loop, vs the same noise added op by op with the official one-hot formula
  (same samples, so the same run); "philox" is the per-example Philox stream. The stream itself
  is pinned and tested in tests/pretraining/test_sampling.py.
- `DENSE_GRAD` "einsum": the dense layers' input gradient dy @ W^T as an einsum instead of
  TensorFlow's MatMul gradient (transpose_b), the same product (`fused.matmul`).
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.modeling import (dropout_streams, encoder, fused, kernel_settings,
                                 transformer_layer, xla_clusters)
from electra_tf.pretraining import losses, sampling
from electra_tf.training import optimization, optimizers
from electra_tf.training.pretrainer import ElectraPretrainer
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
        m.setattr(transformer_layer, "FUSED_BLOCK", False)
        m.setattr(losses, "_softmax_cross_entropy", _reference_cross_entropy)
        m.setattr(optimizers, "_fusable_handles", lambda *args: None)
        m.setattr(kernel_settings, "KERNELS", "tf")
        m.setattr(kernel_settings, "DROPOUT_RNG", "philox")  # keras' own Dropout draws
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
    # Every optimisation on (XLA clusters too), with keras' dropout stream so the masks match.
    with kernel_settings.kernel_options("xla", "philox"):
        fast, fast_weights = _run(3, "float32")
    with _unoptimised(monkeypatch):
        slow, slow_weights = _run(3, "float32")
    # Same masks, samples and dropout: the losses agree to float rounding, step after step.
    np.testing.assert_allclose(fast, slow, rtol=2e-5)
    assert np.all(np.abs(np.diff(fast[:, 0])) > 1e-4)  # the weights did move between steps
    for a, b in zip(fast_weights, slow_weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)


def test_fused_bfloat16_run_tracks_unoptimised_run(monkeypatch):
    with kernel_settings.kernel_options("xla", "philox"):
        fast, _ = _run(2, "mixed_bfloat16")
    with _unoptimised(monkeypatch):
        slow, _ = _run(2, "mixed_bfloat16")
    # bfloat16 rounds differently in the two graphs (elementwise math in float32 here): a looser
    # tolerance.
    np.testing.assert_allclose(fast, slow, rtol=3e-2)


def test_fused_kernels_are_the_default():
    assert transformer_layer.FUSED_BLOCK is True
    # Chosen on the kernel A/B of docs/benchmarks.md (issue 19: the op time outside the matmuls
    # roughly halves) and equal to float rounding (below).
    assert (kernel_settings.DEFAULT_KERNELS, kernel_settings.DEFAULT_DROPOUT_RNG) == ("xla", "hash")
    assert kernel_settings.DEFAULT_SAMPLING_RNG == "hash"
    assert kernel_settings.DEFAULT_DENSE_GRAD == "einsum"


def _unfused_hash_scores(logits, keys, temperature, disallow_ids):
    """The official formula op by op (explicit one-hot) on the hash stream's noise."""
    one_hot = tf.one_hot(disallow_ids, tf.shape(logits)[-1], dtype=tf.float32)  # -1 -> zeros
    return ((logits / temperature - sampling.DISALLOW_PENALTY * one_hot)
            + sampling.gumbel_noise(logits.shape, keys))


def test_fused_hash_sampling_run_matches_op_by_op_sampling(monkeypatch):
    with kernel_settings.kernel_options(sampling_rng="hash"):
        fast, fast_weights = _run(3, "float32")
        with monkeypatch.context() as m:
            m.setattr(sampling, "_compiled_scores", lambda: _unfused_hash_scores)
            slow, slow_weights = _run(3, "float32")
    # The same samples: the same run (the step seed changes every step, so 3 steps draw 3 times).
    np.testing.assert_allclose(fast, slow, rtol=1e-6)
    for a, b in zip(fast_weights, slow_weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with kernel_settings.kernel_options(sampling_rng="philox"):
        philox, _ = _run(3, "float32")
    # Another stream: other samples, so other losses (the first step's MLM loss only depends on
    # the masks, not on the samples), of the same size.
    assert not np.allclose(philox[:, 2], fast[:, 2], rtol=1e-4)
    np.testing.assert_allclose(philox[0, 1], fast[0, 1], rtol=1e-6)
    np.testing.assert_allclose(philox[:, 0], fast[:, 0], rtol=0.2)


def _padded_dropout_block():
    """A small block with both dropout rates on, an input with padding: (layer, x, mask, the
    layer's seed generator states to rewind to)."""
    keras.utils.set_random_seed(3)
    layer = transformer_layer.TransformerLayer(64, 4, dropout=0.1, attention_dropout=0.2,
                                               activation=keras.activations.gelu,
                                               layer_norm_epsilon=1e-12)
    layer.build((None, None, 32))
    x = tf.random.stateless_normal([3, 9, 32], [1, 2])
    mask = tf.constant([[1] * 9, [1] * 5 + [0] * 4, [1] * 2 + [0] * 7])
    return layer, x, mask, [v.numpy() for v in layer.non_trainable_variables]


@pytest.mark.parametrize("training", [False, True])
def test_fused_block_matches_keras_hub_call_with_padding(training, monkeypatch):
    layer, x, mask, state = _padded_dropout_block()

    def forward():
        with tf.GradientTape() as tape:
            y = layer(x, padding_mask=mask, training=training)
            loss = tf.reduce_sum(y * tf.random.stateless_normal(tf.shape(y), [3, 4]))
        return y.numpy(), [g.numpy() for g in tape.gradient(loss, layer.trainable_variables)]

    monkeypatch.setattr(kernel_settings, "KERNELS", "tf")  # issue 5's op-by-op block, keras' masks
    monkeypatch.setattr(kernel_settings, "DROPOUT_RNG", "philox")
    fast_y, fast_g = forward()
    for v, s in zip(layer.non_trainable_variables, state):
        v.assign(s)  # rewind the dropout seed generators: the same masks again
    monkeypatch.setattr(transformer_layer, "FUSED_BLOCK", False)
    slow_y, slow_g = forward()
    np.testing.assert_allclose(fast_y, slow_y, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast_g, slow_g):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def _half_precision_block(policy):
    """A small block with padding under a mixed-precision policy: (layer, x, padding mask)."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(4)
        layer = transformer_layer.TransformerLayer(64, 4, activation=keras.activations.gelu,
                                                   layer_norm_epsilon=1e-12)
        layer.build((None, None, 32))
        yield (layer, tf.random.stateless_normal([2, 7, 32], [5, 6]),
               tf.constant([[1] * 7, [1] * 3 + [0] * 4]))
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_fused_block_half_precision_padding_is_finite_and_tracks_keras(policy, monkeypatch):
    # float16 cannot hold the -1e9 mask value: keras uses -3e4 there, and so must the fused block
    # (0 * -inf would turn every kept score into NaN).
    with _half_precision_block(policy) as (layer, x, mask):
        fast = tf.cast(layer(x, padding_mask=mask), tf.float32).numpy()
        monkeypatch.setattr(transformer_layer, "FUSED_BLOCK", False)
        slow = tf.cast(layer(x, padding_mask=mask), tf.float32).numpy()
    assert np.all(np.isfinite(fast))
    np.testing.assert_allclose(fast, slow, atol=0.1)


# ------------------------------------------------------------------------------------------------
# Issue 19: XLA elementwise clusters and counter-based dropout bits
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rng", ["hash", pytest.param("philox", marks=pytest.mark.slow)])
def test_xla_kernels_float32_run_matches_op_by_op_run(rng):
    with kernel_settings.kernel_options("xla", rng):
        fast, fast_weights = _run(3, "float32")
    with kernel_settings.kernel_options("tf", rng):
        slow, slow_weights = _run(3, "float32")
    # Same masks (the same draws, or the same hash), samples and dropout: float rounding only.
    np.testing.assert_allclose(fast, slow, rtol=2e-5)
    assert np.all(np.abs(np.diff(fast[:, 0])) > 1e-4)
    for a, b in zip(fast_weights, slow_weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)


@pytest.mark.slow
def test_xla_kernels_bfloat16_run_tracks_op_by_op_run():
    with kernel_settings.kernel_options("xla", "hash"):
        fast, _ = _run(2, "mixed_bfloat16")
    with kernel_settings.kernel_options("tf", "hash"):
        slow, _ = _run(2, "mixed_bfloat16")
    # The clusters do their elementwise math in float32 (op by op: bfloat16): a looser tolerance.
    np.testing.assert_allclose(fast, slow, rtol=3e-2)


def _layer_forward_backward(layer, x, mask, training):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, padding_mask=mask, training=training)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.random.stateless_normal(tf.shape(y),
                                                                                 [3, 4]))
    grads = tape.gradient(loss, [x] + layer.trainable_variables)
    return tf.cast(y, tf.float32), [tf.cast(g, tf.float32) for g in grads]


@pytest.mark.parametrize("dense_grad", kernel_settings.DENSE_GRAD_CHOICES)
@pytest.mark.parametrize("rng", kernel_settings.DROPOUT_RNG_CHOICES)
def test_xla_block_matches_op_by_op_block_with_padding(rng, dense_grad):
    layer, x, mask, state = _padded_dropout_block()
    results = {}
    for kernels in kernel_settings.KERNEL_CHOICES:
        for v, s in zip(layer.non_trainable_variables, state):
            v.assign(s)  # rewind the dropout seed generators: the same masks again
        with kernel_settings.kernel_options(kernels, rng, dense_grad=dense_grad):
            y, grads = tf.function(_layer_forward_backward)(layer, x, mask, True)
        results[kernels] = (y.numpy(), [g.numpy() for g in grads])
    (fast_y, fast_g), (slow_y, slow_g) = results["xla"], results["tf"]
    np.testing.assert_allclose(fast_y, slow_y, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast_g, slow_g):  # the input's gradient and every variable's
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_hash_dropout_is_another_stream_of_the_same_block():
    keras.utils.set_random_seed(5)
    layer = transformer_layer.TransformerLayer(64, 4, dropout=0.1,
                                               activation=keras.activations.gelu,
                                               layer_norm_epsilon=1e-12)
    layer.build((None, None, 32))
    x = tf.random.stateless_normal([4, 16, 32], [1, 2])
    state = [v.numpy() for v in layer.non_trainable_variables]
    out = {}
    for rng in kernel_settings.DROPOUT_RNG_CHOICES:
        for v, s in zip(layer.non_trainable_variables, state):
            v.assign(s)
        with kernel_settings.kernel_options("xla", rng):
            out[rng] = layer(x, training=True).numpy()
    with kernel_settings.kernel_options("xla"):
        clean = layer(x, training=False).numpy()
    # Other masks from the same seed generators, the same amount of dropout noise.
    assert not np.allclose(out["hash"], out["philox"], atol=1e-3)
    noise = {rng: np.abs(y - clean).mean() for rng, y in out.items()}
    assert 0.8 < noise["hash"] / noise["philox"] < 1.25, noise


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_xla_block_half_precision_is_finite_and_tracks_op_by_op(policy):
    out = {}
    with _half_precision_block(policy) as (layer, x, mask):
        for kernels in kernel_settings.KERNEL_CHOICES:
            with kernel_settings.kernel_options(kernels):
                y, grads = tf.function(_layer_forward_backward)(layer, x, mask, True)
            out[kernels] = [y.numpy()] + [g.numpy() for g in grads]
    for a, b in zip(out["xla"], out["tf"]):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=0.1 * max(1.0, np.abs(b).max()))


def _compiled_calls(graph_def):
    """Names of the functions a graph calls with _XlaMustCompile (the XLA clusters)."""
    library = {f.signature.name: f for f in graph_def.library.function}
    nodes = list(graph_def.node) + [n for f in library.values() for n in f.node_def]
    return {n.attr["f"].func.name for n in nodes
            if "f" in n.attr and library.get(n.attr["f"].func.name) is not None
            and library[n.attr["f"].func.name].attr["_XlaMustCompile"].b}


def test_xla_clusters_run_in_training_calls_only():
    keras.utils.set_random_seed(0)
    model = encoder.ElectraEncoder(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=64,
                                   embedding_size=16)
    ids = tf.ones([2, 8], tf.int32)
    inputs = {"input_ids": ids, "input_mask": ids, "segment_ids": ids * 0}
    with kernel_settings.kernel_options("xla"):
        traced = {training: tf.function(lambda: model(inputs, training=training)
                                         ["sequence_output"]).get_concrete_function()
                  for training in (False, True)}
    # Evaluation and export trace op-by-op kernels (no XLA JIT needed to serve a SavedModel);
    # training calls run the embeddings' and the block's clusters.
    assert not _compiled_calls(traced[False].graph.as_graph_def())
    assert len(_compiled_calls(traced[True].graph.as_graph_def())) >= 3


def test_xla_kernels_under_mirrored_strategy_match_one_device(mirrored_strategy):
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs the two logical CPU devices set up by conftest.py")
    from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead
    from tests.modeling.test_modeling_distribute import (BATCH as DIST_BATCH, CFG, GEN, _batch,
                                                         _per_example_loss, _unique_weights,
                                                         _variables)

    def build(rate):
        no_dropout = dict(hidden_dropout_prob=rate, attention_probs_dropout_prob=rate)
        disc = encoder.ElectraEncoder(**CFG, **no_dropout)
        gen = encoder.ElectraEncoder(**GEN, **no_dropout, embeddings=disc.embeddings,
                                     name="generator")
        disc_head, gen_head = DiscriminatorHead(16), GeneratorHead(8, 50)
        disc_head.build((None, None, 16))
        gen_head.build((None, None, 8))
        return disc, gen, disc_head, gen_head

    strategy = mirrored_strategy
    batch = _batch()
    dataset = tf.data.Dataset.from_tensors(batch).unbatch().batch(DIST_BATCH)
    dist_batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    with kernel_settings.kernel_options("xla", "hash"):
        # Training calls (the XLA clusters) without dropout: exactly the one-device step.
        keras.utils.set_random_seed(3)
        single = build(0.0)
        with strategy.scope():
            mirrored = build(0.0)
            dropped = build(0.1)
        for a, b in zip(_unique_weights(single), _unique_weights(mirrored)):
            b.assign(a)
        single_vars = _variables(single)

        @tf.function
        def single_step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(_per_example_loss(single, batch, True)) / DIST_BATCH
            return loss, tape.gradient(loss, single_vars)

        def make_step(models):
            variables = _variables(models)

            @tf.function
            def step(inputs):
                def replica_fn(inputs):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_sum(_per_example_loss(models, inputs, True)) / DIST_BATCH
                    grads = tape.gradient(loss, variables)
                    return loss, tf.distribute.get_replica_context().all_reduce("SUM", grads)
                loss, grads = strategy.run(replica_fn, args=(inputs,))
                return strategy.reduce("SUM", loss, axis=None), [
                    strategy.experimental_local_results(g) for g in grads]
            return step

        single_loss, single_grads = single_step()
        loss, grads = make_step(mirrored)(dist_batch)
        dropped_loss, _ = make_step(dropped)(dist_batch)  # hash dropout under the strategy
    np.testing.assert_allclose(loss.numpy(), single_loss.numpy(), rtol=1e-5)
    for copies, g in zip(grads, single_grads):
        first, second = (tf.convert_to_tensor(c).numpy() for c in copies)
        np.testing.assert_array_equal(first, second)
        np.testing.assert_allclose(first, tf.convert_to_tensor(g).numpy(), rtol=1e-4, atol=1e-6)
    assert np.isfinite(dropped_loss.numpy())


def test_hash_bits_are_the_same_in_and_out_of_xla_and_reproducible():
    seed = tf.constant([7, 11], tf.int32)
    plain = dropout_streams.hash_bits(seed, [3, 5, 7]).numpy()
    compiled = tf.function(lambda s: dropout_streams.hash_bits(s, [3, 5, 7]),
                           jit_compile=True)(seed)
    np.testing.assert_array_equal(plain, compiled.numpy())
    np.testing.assert_array_equal(plain, dropout_streams.hash_bits(seed, [3, 5, 7]).numpy())
    assert plain.dtype == np.uint32 and len(np.unique(plain)) == plain.size
    other = dropout_streams.hash_bits(tf.constant([7, 12], tf.int32), [3, 5, 7]).numpy()
    assert np.mean(plain == other) < 0.01


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_hash_dropout_masks_have_the_rate_and_no_correlations(rate):
    shape = [64, 4, 64, 64]  # [batch, heads, queries, keys]: 1M elements
    n = np.prod(shape)

    def keep(seed):
        noise = dropout_streams.Noise(rate, "hash", tf.constant(seed, tf.int32))
        return dropout_streams.keep_mask(noise, shape).numpy().astype(np.float64)

    k = keep([5, 0])
    p = 1 - rate
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(k.mean() - p) < 6 * sigma
    # Neighbours along every axis, and the next call of the same seed generator ([5, 1]) or
    # another layer's generator ([6, 0]), are independent: correlation ~ 0.
    centred = k - k.mean()
    for axis in range(4):
        a = np.moveaxis(centred, axis, 0)
        corr = np.mean(a[1:] * a[:-1]) / centred.var()
        assert abs(corr) < 0.01, (axis, corr)
    for seed in ([5, 1], [6, 0], [5, 2 ** 20]):
        corr = np.mean(centred * (keep(seed) - p)) / centred.var()
        assert abs(corr) < 0.01, (seed, corr)
    # No position is biased: per-row and per-column keep rates stay within binomial noise.
    per_key = k.reshape(-1, shape[-1]).mean(axis=0)
    assert np.abs(per_key - p).max() < 6 * np.sqrt(p * (1 - p) / (n / shape[-1]))


def test_hash_dropout_follows_the_layer_seed_generator():
    keras.utils.set_random_seed(1)
    layer = keras.layers.Dropout(0.3)
    layer.build((4, 8))
    x = tf.ones([4, 8])
    state = layer.seed_generator.state.numpy()
    with kernel_settings.kernel_options(dropout_rng="hash"):
        first = dropout_streams.dropout(x, layer, True).numpy()
        second = dropout_streams.dropout(x, layer, True).numpy()
        layer.seed_generator.state.assign(state)
        again = dropout_streams.dropout(x, layer, True).numpy()
        assert np.array_equal(dropout_streams.dropout(x, layer, False).numpy(), x.numpy())
    np.testing.assert_array_equal(first, again)  # seeded and reproducible
    assert not np.array_equal(first, second)  # a new mask at every call
    assert set(np.unique(first)) <= {0.0, np.float32(1 / 0.7)}


def test_kernel_switches_reject_unknown_choices():
    with pytest.raises(ValueError, match="kernels must be one of"):
        kernel_settings.configure(kernels="cuda")
    with pytest.raises(ValueError, match="dropout_rng must be one of"):
        kernel_settings.configure(dropout_rng="threefry")
    before = kernel_settings.KERNELS
    with pytest.raises(ValueError, match="sampling_rng must be one of"):
        kernel_settings.configure(kernels="tf" if before == "xla" else "xla", sampling_rng="threefry")
    assert kernel_settings.KERNELS in kernel_settings.KERNEL_CHOICES and kernel_settings.DROPOUT_RNG in kernel_settings.DROPOUT_RNG_CHOICES
    assert kernel_settings.KERNELS == before  # a rejected call changes nothing
    assert kernel_settings.SAMPLING_RNG in kernel_settings.SAMPLING_RNG_CHOICES
    dense_before = kernel_settings.DENSE_GRAD
    with pytest.raises(ValueError, match="dense_grad must be one of matmul, einsum, got 'bmm'"):
        kernel_settings.configure(dense_grad="bmm")
    assert kernel_settings.DENSE_GRAD == dense_before


def _op_types(concrete):
    graph = concrete.graph.as_graph_def()
    return {n.op for n in graph.node} | {n.op for f in graph.library.function
                                         for n in f.node_def}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("dense_grad", kernel_settings.DENSE_GRAD_CHOICES)
def test_dense_matmul_value_and_gradients_are_tensorflows(dense_grad, dtype):
    x = tf.cast(tf.random.stateless_normal([24, 16], [1, 2]), dtype)
    kernel = tf.cast(tf.random.stateless_normal([16, 40], [3, 4]), dtype)
    upstream = tf.cast(tf.random.stateless_normal([24, 40], [5, 6]), dtype)

    def forward_backward(product, x, kernel):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel])
            y = product(x, kernel)
        return [y] + tape.gradient(y, [x, kernel], output_gradients=upstream)

    with kernel_settings.kernel_options(dense_grad=dense_grad):
        fast_fn = tf.function(lambda x, k: forward_backward(fused.matmul, x, k))
        fast = fast_fn(x, kernel)
    reference = tf.function(lambda x, k: forward_backward(tf.matmul, x, k))(x, kernel)
    # dx = upstream @ kernel^T and dkernel = x^T @ upstream, the same products either way.
    for a, b in zip(fast, reference):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(tf.cast(a, tf.float32).numpy(),
                                   tf.cast(b, tf.float32).numpy(),
                                   rtol=1e-5 if dtype == "float32" else 1e-2, atol=1e-5)
    # The switch chooses the kernel that computes dx: an Einsum only with "einsum" (in bfloat16
    # only where the CPU multiplies bf16 natively: fused._onednn_bf16).
    ops = _op_types(fast_fn.get_concrete_function(x, kernel))
    einsum = dense_grad == "einsum" and (dtype == "float32" or fused._onednn_bf16())
    assert ("Einsum" in ops) == einsum, sorted(ops)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind,rate", [("none", 0.0), ("hash", 0.3), ("philox", 0.3),
                                       ("hash", 1.0)])
def test_attention_probs_gradient_is_autodiffs_of_the_same_mask(kind, rate, dtype):
    # The cluster's gradient reads the forward's output instead of the dropout mask; it must
    # still be TensorFlow's gradient of dropout(softmax(scores + mask_bias)) with that mask.
    shape = [2, 3, 5, 7]
    scores = tf.cast(3 * tf.random.stateless_normal(shape, [1, 2]), dtype)
    mask_bias = tf.constant([[0.0] * 7, [0.0] * 4 + [-10000.0] * 3])[:, None, None, :]
    upstream = tf.cast(tf.random.stateless_normal(shape, [3, 4]), dtype)
    seed = tf.constant([9, 2], tf.int32)
    noise = {"none": None, "hash": dropout_streams.Noise(rate, "hash", seed),
             "philox": dropout_streams.Noise(rate, "philox",
                                   tf.random.stateless_uniform(shape, seed, dtype=dtype))}[kind]

    def reference(s):  # op by op, float32 as the cluster, the same multiplier
        probs = tf.nn.softmax(tf.cast(s, tf.float32) + mask_bias, axis=-1)
        if noise is not None:
            probs = probs * dropout_streams.dropout_scale(noise, shape, tf.float32)
        return tf.cast(probs, dtype)

    results = []
    for function in (lambda s: xla_clusters.attention_probs(s, mask_bias, noise), reference):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            y = function(scores)
        results.append([tf.cast(t, tf.float32).numpy() for t in
                        (y, tape.gradient(y, scores, output_gradients=upstream))])
    (fast_y, fast_g), (ref_y, ref_g) = results
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=0.02, atol=0.02)
    np.testing.assert_allclose(fast_y, ref_y, **tolerance)
    np.testing.assert_allclose(fast_g, ref_g, **tolerance)
    dropped = ref_y == 0
    if rate == 1.0:
        assert dropped.all() and not fast_g.any()
    elif rate:
        assert dropped.any() and np.abs(ref_g).max() > 0.1  # the mask matters to the gradient
