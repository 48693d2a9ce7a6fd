"""Tests for electra_tf.training.optimization and .optimizers (official parity items 30-32)."""

import contextlib
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.training import optimization as opt_lib, optimizers

# The official constants as the float32 values TensorFlow computes with (1 - float32(0.999)
# differs from 0.001 by 1.3e-5 relative), so the float64 references below can be tight.
B1, B2, EPS, WD = (float(np.float32(x)) for x in (0.9, 0.999, 1e-6, 0.01))


def make_var(path, value):
    """A Keras variable whose `.path` is `path` (nested name scopes, since '/' is not allowed)."""
    *scopes, name = path.split("/")
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(keras.name_scope(scope))
        var = keras.Variable(np.asarray(value, np.float32), name=name)
    assert var.path == path
    return var


def dense(g):
    return tf.convert_to_tensor(g).numpy().astype(np.float64)


# ------------------------------------------------------------------------------------------------
# Schedule (parity item 30)
# ------------------------------------------------------------------------------------------------
def test_schedule_official_values():
    s = opt_lib.WarmupPolynomialDecay(5e-4, num_train_steps=1_000_000, num_warmup_steps=10_000)
    np.testing.assert_allclose(float(s(0)), 0.0, atol=0)
    np.testing.assert_allclose(float(s(5000)), 2.4875e-4, rtol=1e-6)
    np.testing.assert_allclose(float(s(10000)), 4.95e-4, rtol=1e-6)
    np.testing.assert_allclose(float(s(500_000)), 2.5e-4, rtol=1e-6)  # after warmup: pure decay
    assert float(s(1_000_000)) == 0.0
    assert float(s(2_000_000)) == 0.0  # past T: stays 0 (no cycling, no negative rates)
    assert float(s(tf.constant(5000, tf.int64))) == pytest.approx(2.4875e-4, rel=1e-6)


def test_schedule_power_and_proportion():
    s = opt_lib.WarmupPolynomialDecay(1e-3, num_train_steps=1000, num_warmup_steps=10,
                                      warmup_proportion=0.1, lr_decay_power=2.0)
    assert s.warmup_steps == 100.0  # max(10, 0.1 * 1000)
    for t in (0, 37, 100, 250, 999, 1000, 1500):
        expected = 1e-3 * (1 - min(t, 1000) / 1000) ** 2 * min(1.0, t / 100)
        np.testing.assert_allclose(float(s(t)), expected, rtol=1e-5, atol=1e-12)


def test_schedule_zero_warmup_is_no_warmup_not_nan():
    # The official code divides by the warmup length: 0/0 = NaN at t = 0.
    s = opt_lib.WarmupPolynomialDecay(1e-3, num_train_steps=100)
    assert float(s(0)) == pytest.approx(1e-3)
    assert float(s(50)) == pytest.approx(5e-4)


def test_schedule_config_round_trip():
    s = opt_lib.WarmupPolynomialDecay(2e-4, 500, num_warmup_steps=7, warmup_proportion=0.05,
                                      lr_decay_power=0.5)
    config = s.get_config()
    assert config == {"learning_rate": 2e-4, "num_train_steps": 500, "num_warmup_steps": 7,
                      "warmup_proportion": 0.05, "lr_decay_power": 0.5}
    assert opt_lib.WarmupPolynomialDecay.from_config(config).get_config() == config
    restored = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(s))
    assert isinstance(restored, opt_lib.WarmupPolynomialDecay)
    assert float(restored(60)) == float(s(60))


def test_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="num_train_steps"):
        opt_lib.WarmupPolynomialDecay(1e-3, 0)
    with pytest.raises(ValueError, match="num_warmup_steps"):
        opt_lib.WarmupPolynomialDecay(1e-3, 10, num_warmup_steps=-1)


# ------------------------------------------------------------------------------------------------
# AdamWeightDecay (parity item 31)
# ------------------------------------------------------------------------------------------------
PATHS = {
    "ln": "electra/encoder/layer_0/attention/output/LayerNorm/gamma",
    "bias": "electra/encoder/layer_0/attention/output/dense/bias",
    "kernel": "electra/encoder/layer_0/attention/output/dense/kernel",
    "emb": "electra/embeddings/word_embeddings",
}


def f32(x):
    """Rounds to float32 and back, so float64 references start from the variables' values."""
    return np.asarray(x, np.float32).astype(np.float64)


def make_params(rng):
    return {
        "ln": f32(1.0 + 0.1 * rng.standard_normal(4)),
        "bias": f32(0.1 * rng.standard_normal(4)),
        "kernel": f32(rng.standard_normal((3, 4))),
        "emb": f32(rng.standard_normal((6, 3))),
    }


def make_grads(rng):
    """Dense gradients plus an IndexedSlices embedding gradient with a duplicated row."""
    emb_values = rng.standard_normal((3, 3)).astype(np.float32)
    emb_indices = np.array([1, 4, 1], np.int64)
    emb_dense = np.zeros((6, 3))
    np.add.at(emb_dense, emb_indices, emb_values)
    grads = {k: f32(rng.standard_normal(shape)) for k, shape in
             (("ln", (4,)), ("bias", (4,)), ("kernel", (3, 4)))}
    tf_grads = {k: tf.constant(g, tf.float32) for k, g in grads.items()}
    tf_grads["emb"] = tf.IndexedSlices(tf.constant(emb_values), tf.constant(emb_indices),
                                       tf.constant([6, 3], tf.int64))
    grads["emb"] = emb_dense
    return grads, tf_grads


def numpy_adamw_step(params, grads, m, v, lr, decayed):
    """The official AdamWeightDecayOptimizer, in float64."""
    for k in params:
        m[k] = B1 * m[k] + (1 - B1) * grads[k]
        v[k] = B2 * v[k] + (1 - B2) * grads[k] ** 2
        update = m[k] / (np.sqrt(v[k]) + EPS)
        if decayed[k]:
            update = update + WD * params[k]
        params[k] = params[k] - lr * update


def test_adamw_two_steps_match_numpy_without_bias_correction():
    rng = np.random.default_rng(0)
    params = make_params(rng)
    variables = {k: make_var(PATHS[k], p) for k, p in params.items()}
    keys = list(PATHS)
    schedule = opt_lib.WarmupPolynomialDecay(1e-2, num_train_steps=100, num_warmup_steps=10)
    optimizer = optimizers.AdamWeightDecay(schedule)
    m = {k: np.zeros_like(p) for k, p in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    decayed = {"ln": False, "bias": False, "kernel": True, "emb": True}

    for step in range(2):
        grads, tf_grads = make_grads(rng)
        optimizer.apply([tf_grads[k] for k in keys], [variables[k] for k in keys])
        lr = 1e-2 * (1 - step / 100) * min(1.0, step / 10)
        numpy_adamw_step(params, grads, m, v, lr, decayed)
        if step == 0:
            # lr(0) = 0: the first update leaves every weight exactly where it was...
            for k in keys:
                np.testing.assert_array_equal(variables[k].numpy(), params[k].astype(np.float32))
            # ...but m and v have moved (including the embedding rows never looked up: zero).
            assert np.abs(optimizer.get_slot(variables["kernel"], "adam_m").numpy()).min() > 0
        for k in keys:
            np.testing.assert_allclose(variables[k].numpy(), params[k], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{k} after step {step}")
            np.testing.assert_allclose(optimizer.get_slot(variables[k], "adam_m").numpy(), m[k],
                                       rtol=1e-5, atol=1e-8)
            np.testing.assert_allclose(optimizer.get_slot(variables[k], "adam_v").numpy(), v[k],
                                       rtol=1e-5, atol=1e-10)
    assert int(optimizer.iterations) == 2
    # Step 1 (lr > 0) did move the weights.
    assert not np.allclose(variables["bias"].numpy(), make_params(np.random.default_rng(0))["bias"])


def test_adamw_bias_correction_matches_numpy_and_leaves_the_decay_uncorrected():
    # adam_bias_correction: the Adam part times sqrt(1 - b2^t) / (1 - b1^t) at t = iterations + 1;
    # the decoupled decay stays lr * wd * param. TensorFlow's fused kernel path (one device).
    rng = np.random.default_rng(3)
    params = make_params(rng)
    variables = {k: make_var(PATHS[k], p) for k, p in params.items()}
    keys = list(PATHS)
    schedule = opt_lib.WarmupPolynomialDecay(1e-2, num_train_steps=100, num_warmup_steps=2)
    optimizer = optimizers.AdamWeightDecay(schedule, bias_correction=True)
    m = {k: np.zeros_like(p) for k, p in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    decayed = {"ln": False, "bias": False, "kernel": True, "emb": True}
    for step in range(4):
        grads, tf_grads = make_grads(rng)
        optimizer.apply([tf_grads[k] for k in keys], [variables[k] for k in keys])
        lr = 1e-2 * (1 - step / 100) * min(1.0, step / 2)
        t = step + 1
        correction = np.sqrt(1 - B2 ** t) / (1 - B1 ** t)
        for k in params:
            m[k] = B1 * m[k] + (1 - B1) * grads[k]
            v[k] = B2 * v[k] + (1 - B2) * grads[k] ** 2
            update = correction * m[k] / (np.sqrt(v[k]) + EPS)
            if decayed[k]:
                update = update + WD * params[k]
            params[k] = params[k] - lr * update
        for k in keys:
            np.testing.assert_allclose(variables[k].numpy(), params[k], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{k} after step {step}")
    # The official update (no correction) of the same steps differs: the flag is not a no-op.
    assert optimizer.get_config()["bias_correction"] is True
    assert "bias_correction" not in optimizers.AdamWeightDecay(schedule).get_config()
    restored = optimizers.AdamWeightDecay.from_config(optimizer.get_config())
    assert restored.bias_correction is True


def test_create_optimizer_passes_adam_bias_correction_and_lamb_refuses_it():
    config = PretrainingConfig.create("unit", "/nonexistent-data-dir",
                                      {"adam_bias_correction": True})
    optimizer, _ = opt_lib.create_optimizer(config)
    assert optimizer.bias_correction is True
    assert opt_lib.create_optimizer(
        PretrainingConfig.create("unit", "/nonexistent-data-dir"))[0].bias_correction is False
    with pytest.raises(ConfigError, match="adam_bias_correction applies to optimizer adamw"):
        PretrainingConfig.create("unit", "/nonexistent-data-dir",
                                 {"adam_bias_correction": True, "optimizer": "lamb"})


def test_adamw_step_at_official_step_5000():
    config = PretrainingConfig.create("unit", "/nonexistent-data-dir")
    optimizer, schedule = opt_lib.create_optimizer(config)
    kernel = make_var("electra/encoder/layer_3/intermediate/dense/kernel", [[0.5, -2.0]])
    beta = make_var("electra/embeddings/LayerNorm/beta", [0.25, 0.0])
    optimizer.build([kernel, beta])
    optimizer.iterations.assign(5000)
    g = np.array([[0.3, -0.1]])
    gb = np.array([0.0, 2.0])
    opt_lib.apply_gradients(optimizer, [tf.constant(g, tf.float32), tf.constant(gb, tf.float32)],
                            [kernel, beta], clip_norm=None)
    lr = 2.4875e-4
    m, v = (1 - B1) * g, (1 - B2) * g ** 2
    w0 = np.array([[0.5, -2.0]])
    expected = w0 - lr * (m / (np.sqrt(v) + EPS) + WD * w0)
    np.testing.assert_allclose(kernel.numpy(), expected, rtol=1e-6)
    mb, vb = (1 - B1) * gb, (1 - B2) * gb ** 2
    np.testing.assert_allclose(beta.numpy(), np.array([0.25, 0.0]) - lr * mb / (np.sqrt(vb) + EPS),
                               rtol=1e-6)
    assert float(schedule(5000)) == pytest.approx(lr, rel=1e-6)


def test_weight_decay_exclusion_patterns():
    optimizer = optimizers.AdamWeightDecay(1e-3)
    decayed = {
        "electra/embeddings/word_embeddings": True,
        "electra/embeddings/position_embeddings": True,
        "electra/encoder/layer_0/attention/self/query/kernel": True,
        "discriminator_predictions/dense_1/kernel": True,
        "electra/encoder/layer_0/attention/output/LayerNorm/gamma": False,
        "electra/embeddings/LayerNorm/beta": False,
        "electra/encoder/layer_0/attention/self/query/bias": False,
        "generator_predictions/output_bias": False,
        "transformer_layer_0/self_attention_layer_norm/gamma": False,  # keras-hub naming
    }
    for path, expected in decayed.items():
        assert optimizer.use_weight_decay(make_var(path, [1.0])) is expected, path
    raw = tf.Variable([1.0], name="dense/bias")  # raw tf.Variable: matched by name
    assert not optimizer.use_weight_decay(raw)

    custom = optimizers.AdamWeightDecay(1e-3, exclude_from_weight_decay=["^head/"])
    assert not custom.use_weight_decay(make_var("head/kernel", [1.0]))
    assert custom.use_weight_decay(make_var("body/bias", [1.0]))
    everything = optimizers.AdamWeightDecay(1e-3, exclude_from_weight_decay=None)
    assert everything.use_weight_decay(make_var("x/LayerNorm/gamma", [1.0]))
    assert not optimizers.AdamWeightDecay(1e-3, weight_decay_rate=0.0).use_weight_decay(
        make_var("y/kernel", [1.0]))


def test_weight_decay_applied_only_to_non_excluded_variables():
    # Zero gradient: m = v = 0, so the Adam part is 0 and only the decay moves the weights.
    kernel = make_var("net/dense/kernel", [2.0, -4.0])
    bias = make_var("net/dense/bias", [2.0, -4.0])
    optimizer = optimizers.AdamWeightDecay(0.5)
    optimizer.apply([tf.zeros(2), tf.zeros(2)], [kernel, bias])
    np.testing.assert_allclose(kernel.numpy(), [2.0 - 0.5 * WD * 2.0, -4.0 + 0.5 * WD * 4.0])
    np.testing.assert_array_equal(bias.numpy(), [2.0, -4.0])


@pytest.mark.parametrize("multipliers", [
    {"layer_0/": 0.25, "layer_": 0.5},  # first match in order wins
    lambda path: 0.25 if "layer_0/" in path else (0.5 if "layer_" in path else 1.0),
])
def test_lr_multipliers(multipliers):
    paths = ["enc/layer_0/dense/kernel", "enc/layer_1/dense/kernel", "head/dense/kernel"]
    start = np.array([1.0, -1.0])
    g = tf.constant([0.5, 0.25])
    plain = [make_var(p, start) for p in paths]
    scaled = [make_var(p, start) for p in paths]
    optimizers.AdamWeightDecay(0.1).apply([g] * 3, plain)
    opt = optimizers.AdamWeightDecay(0.1, lr_multipliers=multipliers)
    opt.apply([g] * 3, scaled)
    assert [opt.lr_multiplier(v) for v in scaled] == [0.25, 0.5, 1.0]
    for p, s, mult in zip(plain, scaled, (0.25, 0.5, 1.0)):
        np.testing.assert_allclose(start - s.numpy(), mult * (start - p.numpy()), rtol=1e-6)


def test_optimizer_config_round_trip():
    schedule = opt_lib.WarmupPolynomialDecay(1e-3, 100, num_warmup_steps=5)
    for optimizer in (
        optimizers.AdamWeightDecay(schedule, weight_decay_rate=0.02, epsilon=1e-7,
                                exclude_from_weight_decay=["bias"], lr_multipliers={"a/": 0.5},
                                name="adamw"),
        optimizers.Lamb(schedule, exclude_from_layer_adaptation=[], name="lamb"),
    ):
        config = optimizer.get_config()
        restored = type(optimizer).from_config(config)
        assert restored.get_config() == config
        again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        assert type(again) is type(optimizer)
        assert again.get_config() == config
        json.dumps(config)  # JSON-clean
    with pytest.raises(ValueError, match="callable lr_multipliers"):
        optimizers.AdamWeightDecay(1e-3, lr_multipliers=lambda p: 1.0).get_config()
    with pytest.raises(ValueError, match="weight_decay_rate"):
        optimizers.AdamWeightDecay(1e-3, weight_decay=0.1)


def test_optimizer_state_checkpoint_round_trip(tmp_path):
    kernel = make_var("cp/dense/kernel", [1.0, 2.0])
    optimizer = optimizers.AdamWeightDecay(0.1)
    optimizer.apply([tf.constant([0.5, -0.5])], [kernel])
    path = tf.train.Checkpoint(optimizer=optimizer, kernel=kernel.value).save(str(tmp_path / "c"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("iteration" in n for n in names)
    other = optimizers.AdamWeightDecay(0.1)
    other.build([kernel])
    tf.train.Checkpoint(optimizer=other, kernel=kernel.value).restore(path).assert_consumed()
    assert int(other.iterations) == 1
    np.testing.assert_array_equal(other.get_slot(kernel, "adam_m").numpy(),
                                  optimizer.get_slot(kernel, "adam_m").numpy())
    assert optimizer.get_slot(kernel, "adam_v").path.endswith("cp_dense_kernel_adam_v")


# ------------------------------------------------------------------------------------------------
# LAMB
# ------------------------------------------------------------------------------------------------
def test_lamb_two_steps_match_numpy():
    rng = np.random.default_rng(3)
    start = {"w": f32(rng.standard_normal((3, 2))), "b": f32(0.1 * rng.standard_normal(2)),
             "z": np.zeros(2)}
    paths = {"w": "lamb/dense/kernel", "b": "lamb/dense/bias", "z": "lamb/zero/kernel"}
    variables = {k: make_var(paths[k], start[k]) for k in start}
    optimizer = optimizers.Lamb(0.05)
    params = {k: p.copy() for k, p in start.items()}
    m = {k: np.zeros_like(p) for k, p in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    for t in (1, 2):
        grads = {k: f32(rng.standard_normal(p.shape)) for k, p in params.items()}
        optimizer.apply([tf.constant(grads[k], tf.float32) for k in start],
                        [variables[k] for k in start])
        for k in params:
            m[k] = B1 * m[k] + (1 - B1) * grads[k]
            v[k] = B2 * v[k] + (1 - B2) * grads[k] ** 2
            update = (m[k] / (1 - B1 ** t)) / (np.sqrt(v[k] / (1 - B2 ** t)) + EPS)
            ratio = 1.0
            if k != "b":  # bias: excluded from weight decay AND from layer adaptation
                update = update + WD * params[k]
                w_norm, u_norm = np.linalg.norm(params[k]), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[k] = params[k] - 0.05 * ratio * update
        for k in params:
            np.testing.assert_allclose(variables[k].numpy(), params[k], rtol=2e-5, atol=1e-7,
                                       err_msg=f"{k} at t={t}")
    assert optimizer.use_layer_adaptation(variables["w"])
    assert not optimizer.use_layer_adaptation(variables["b"])
    assert optimizers.Lamb(0.1, exclude_from_layer_adaptation=[]).use_layer_adaptation(
        variables["b"])


# ------------------------------------------------------------------------------------------------
# Clipping (parity item 32)
# ------------------------------------------------------------------------------------------------
def test_clip_by_global_norm_matches_numpy():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4))
    b = rng.standard_normal(5)
    values = rng.standard_normal((4, 2))
    indices = np.array([0, 3, 0, 2])
    emb = np.zeros((5, 2))
    np.add.at(emb, indices, values)  # duplicate row 0: the norm is the DENSE gradient's
    grads = [tf.constant(a, tf.float32), None, tf.constant(b, tf.float32),
             tf.IndexedSlices(tf.constant(values, tf.float32), tf.constant(indices),
                              tf.constant([5, 2]))]
    norm = np.sqrt((a ** 2).sum() + (b ** 2).sum() + (emb ** 2).sum())
    assert norm > 1.0

    clipped, global_norm = opt_lib.clip_by_global_norm(grads, 1.0)
    np.testing.assert_allclose(float(global_norm), norm, rtol=1e-6)
    assert clipped[1] is None
    assert isinstance(clipped[3], tf.IndexedSlices)
    for got, want in zip((clipped[0], clipped[2], clipped[3]), (a, b, emb)):
        np.testing.assert_allclose(dense(got), want / norm, rtol=1e-5, atol=1e-7)
    total = np.sqrt(sum((dense(g) ** 2).sum() for g in clipped if g is not None))
    assert total == pytest.approx(1.0, rel=1e-5)

    # Below the threshold: unchanged.
    same, same_norm = opt_lib.clip_by_global_norm(grads, 2 * norm)
    np.testing.assert_allclose(dense(same[0]), a, rtol=1e-6)
    assert float(same_norm) == pytest.approx(norm, rel=1e-6)


def test_clip_nonfinite_norm_gives_nan():
    clipped, norm = opt_lib.clip_by_global_norm([tf.constant([np.inf, 1.0])], 1.0)
    assert not np.isfinite(float(norm))
    assert np.isnan(clipped[0].numpy()).all()


# ------------------------------------------------------------------------------------------------
# apply_gradients: distributed equivalence with ACTIVE clipping
# ------------------------------------------------------------------------------------------------
VOCAB, EMB, GLOBAL_BATCH, SEQ = 11, 4, 8, 3


class TinyModel(keras.Model):
    """Embedding (IndexedSlices grads) -> dense -> LayerNorm -> dense; plus an unused head."""

    def __init__(self):
        super().__init__(name="tiny")
        self.embedding = keras.layers.Embedding(VOCAB, EMB, name="word_embeddings")
        self.hidden = keras.layers.Dense(5, activation="tanh", name="dense")
        self.norm = keras.layers.LayerNormalization(epsilon=1e-12, name="LayerNorm")
        self.out = keras.layers.Dense(1, name="output")
        self.unused = keras.layers.Dense(2, name="unused_head")  # gets None gradients

    def call(self, ids):
        x = tf.reduce_mean(self.embedding(ids), axis=1)
        return self.out(self.norm(self.hidden(x)))[:, 0]

    def build(self, input_shape=None):
        self.embedding.build((None, SEQ))
        self.hidden.build((None, EMB))
        self.norm.build((None, 5))
        self.out.build((None, 5))
        self.unused.build((None, 5))


def make_data():
    rng = np.random.default_rng(7)
    steps = [(rng.integers(0, VOCAB, (GLOBAL_BATCH, SEQ)).astype(np.int32),
              (10.0 * rng.standard_normal(GLOBAL_BATCH)).astype(np.float32)) for _ in range(3)]
    return steps


def init_weights(model):
    """Deterministic starting weights (the same for every strategy)."""
    if not model.built:
        model.build()
    rng = np.random.default_rng(11)
    return [rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in model.weights]


def loss_contribution(model, ids, targets):
    # The replica's share of the global mean loss: sum over its examples / GLOBAL batch size.
    return tf.reduce_sum(tf.square(model(ids) - targets)) / GLOBAL_BATCH


def train(strategy, variant="adamw"):
    """Three steps; returns (weights, norms, adam_v slots, iterations).

    Under 2 replicas each replica sees half of the global batch. `variant`: "adamw", "lamb",
    "loss_scale" (AdamW inside a LossScaleOptimizer, gradients of the scaled loss) or
    "naive_keras_clipping" (Keras' own global_clipnorm, which clips before the replica sum).
    """
    with strategy.scope():
        model = TinyModel()
        model.build()
        model.set_weights(init_weights(model))
        schedule = opt_lib.WarmupPolynomialDecay(0.05, num_train_steps=10)
        if variant == "naive_keras_clipping":
            optimizer = optimizers.AdamWeightDecay(schedule, global_clipnorm=1.0)
        elif variant == "lamb":
            optimizer = optimizers.Lamb(schedule)
        else:
            optimizer = optimizers.AdamWeightDecay(schedule)
        inner = optimizer
        if variant == "loss_scale":
            optimizer = keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0 ** 8)
        optimizer.build(model.trainable_variables)

    def replica_step(ids, targets):
        with tf.GradientTape() as tape:
            loss = loss_contribution(model, ids, targets)
            if variant == "loss_scale":
                loss = optimizer.scale_loss(loss)
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        if variant == "naive_keras_clipping":
            optimizer.apply([g for g in grads if g is not None],
                            [v for g, v in zip(grads, variables) if g is not None])
            return tf.constant(0.0)
        return opt_lib.apply_gradients(optimizer, grads, variables, clip_norm=1.0)

    @tf.function
    def step(ids, targets):
        norms = strategy.run(replica_step, args=(ids, targets))
        return strategy.experimental_local_results(norms)

    norms = []
    replicas = strategy.num_replicas_in_sync
    for ids, targets in make_data():
        if replicas > 1:
            per = GLOBAL_BATCH // replicas
            dist = strategy.experimental_distribute_values_from_function(
                lambda ctx: (ids[ctx.replica_id_in_sync_group * per:
                                 (ctx.replica_id_in_sync_group + 1) * per],
                             targets[ctx.replica_id_in_sync_group * per:
                                     (ctx.replica_id_in_sync_group + 1) * per]))
            local = step(*dist)
        else:
            local = step(tf.constant(ids), tf.constant(targets))
        values = [float(x) for x in local]
        assert all(v == values[0] for v in values)  # every replica saw the same global norm
        norms.append(values[0])
    slots = [inner.get_slot(v, "adam_v").numpy() for v in model.trainable_variables]
    return [w.numpy() for w in model.weights], norms, slots, int(inner.iterations.numpy())


@pytest.fixture(scope="module")
def single_device_run():
    return train(tf.distribute.OneDeviceStrategy("/cpu:0"))


@pytest.fixture(scope="module")
def mirrored(mirrored_strategy):
    # The session's one strategy (tests/conftest.py): a second MirroredStrategy running a different
    # graph in the same process aborts with "Shape mismatch in the collective instance 100".
    assert mirrored_strategy.num_replicas_in_sync == 2
    return mirrored_strategy


def test_mirrored_matches_one_device_with_active_clipping(single_device_run, mirrored):
    weights_1, norms_1, slots_1, iters_1 = single_device_run
    assert min(norms_1) > 1.0, "clipping must be active for this test to mean anything"
    weights_2, norms_2, slots_2, iters_2 = train(mirrored)
    assert iters_1 == iters_2 == 3
    np.testing.assert_allclose(norms_2, norms_1, rtol=1e-5)
    for a, b in zip(weights_2, weights_1):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(slots_2, slots_1):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
    # The weights did move (lr(0) = 0 only with warmup; this schedule has none).
    assert max(np.abs(a - b).max() for a, b in zip(weights_1, init_weights(TinyModel()))) > 1e-3


def test_per_replica_clipping_would_differ(single_device_run, mirrored):
    # Sanity check that the equivalence test can fail: Keras' own global_clipnorm clips each
    # replica's half-gradient before summing, which is not the official semantics.
    weights_1 = single_device_run[0]
    naive = train(mirrored, "naive_keras_clipping")[0]
    assert max(np.abs(a - b).max() for a, b in zip(naive, weights_1)) > 1e-4


@pytest.mark.parametrize("variant", ["lamb", "loss_scale"])
def test_mirrored_matches_one_device_other_optimizers(variant, mirrored):
    weights_1, norms_1, _, _ = train(tf.distribute.OneDeviceStrategy("/cpu:0"), variant)
    weights_2, norms_2, _, _ = train(mirrored, variant)
    assert min(norms_1) > 1.0
    np.testing.assert_allclose(norms_2, norms_1, rtol=1e-5)
    for a, b in zip(weights_2, weights_1):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_apply_gradients_with_loss_scale_optimizer():
    # mixed_float16: gradients of the scaled loss give the same step as plain gradients.
    start = np.array([1.0, -2.0, 3.0])
    g = np.array([3.0, 0.5, -4.0])  # norm > 1: clipping active
    plain_var = make_var("ls/plain/kernel", start)
    plain = optimizers.AdamWeightDecay(0.1)
    norm = opt_lib.apply_gradients(plain, [tf.constant(g, tf.float32)], [plain_var])
    assert float(norm) == pytest.approx(np.linalg.norm(g), rel=1e-6)

    scaled_var = make_var("ls/scaled/kernel", start)
    lso = keras.optimizers.LossScaleOptimizer(optimizers.AdamWeightDecay(0.1), initial_scale=2.0 ** 10)
    norm = opt_lib.apply_gradients(lso, [tf.constant(g * 2 ** 10, tf.float32)], [scaled_var])
    assert float(norm) == pytest.approx(np.linalg.norm(g), rel=1e-6)
    np.testing.assert_array_equal(scaled_var.numpy(), plain_var.numpy())

    # A non-finite gradient skips the step and halves the scale.
    before = scaled_var.numpy().copy()
    opt_lib.apply_gradients(lso, [tf.constant([np.inf, 0.0, 0.0], tf.float32)], [scaled_var])
    np.testing.assert_array_equal(scaled_var.numpy(), before)
    assert float(lso.dynamic_scale) == 2.0 ** 9
    assert int(lso.inner_optimizer.iterations) == 1


def test_apply_gradients_errors():
    var = make_var("err/kernel", [1.0])
    with pytest.raises(ValueError, match="1 gradients for 2 variables"):
        opt_lib.apply_gradients(optimizers.AdamWeightDecay(0.1), [tf.ones(1)], [var, var])
    with pytest.raises(ValueError, match="every gradient is None"):
        opt_lib.apply_gradients(optimizers.AdamWeightDecay(0.1), [None], [var])


# ------------------------------------------------------------------------------------------------
# create_optimizer
# ------------------------------------------------------------------------------------------------
def test_create_optimizer_from_config():
    config = PretrainingConfig.create("unit", "/nonexistent-data-dir", {
        "learning_rate": 2e-4, "lr_decay_power": 0.5, "weight_decay_rate": 0.02,
        "num_warmup_steps": 3, "num_train_steps": 30})
    optimizer, schedule = opt_lib.create_optimizer(config)
    assert isinstance(optimizer, optimizers.AdamWeightDecay)
    assert schedule.get_config() == {"learning_rate": 2e-4, "num_train_steps": 30,
                                     "num_warmup_steps": 3, "warmup_proportion": 0.0,
                                     "lr_decay_power": 0.5}
    assert optimizer.weight_decay_rate == 0.02
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.999, 1e-6)
    assert optimizer.exclude_from_weight_decay == ["LayerNorm", "layer_norm", "bias"]
    assert float(optimizer.learning_rate) == 0.0  # lr(0) = 0
    lamb, _ = opt_lib.create_optimizer(config, "lamb")
    assert isinstance(lamb, optimizers.Lamb)
    with pytest.raises(ValueError, match="optimizer_name must be one of adamw, lamb"):
        opt_lib.create_optimizer(config, "sgd")
