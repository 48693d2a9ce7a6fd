"""The optimizers, the schedule and the clip on TensorFlow, JAX and PyTorch (issue 32).

The same weights and gradients (tests/training/optimizer_steps.py) go through three clipped steps
of `AdamWeightDecay` and of `Lamb` on every backend: TensorFlow in this process (its default, the
fused ResourceApplyAdam kernel), JAX and PyTorch in children that cannot import TensorFlow. On
TensorFlow the fused kernel and the keras.ops update, and tf.clip_by_global_norm and the keras.ops
clip, are compared directly.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.training import optimization, optimizers
from electra_tf.training.tf import update as tf_update
from tests import backends
from tests.training import optimizer_steps as steps

_CHILD = """
from tests.training import optimizer_steps
out.update(optimizer_steps.run_all(inp))
"""


def _assert_same(theirs, ours, prefix, rtol=1e-5, atol=1e-8):
    keys = sorted(k for k in ours if k.startswith(prefix))
    assert keys, prefix
    for key in keys:
        np.testing.assert_allclose(theirs[key], ours[key], rtol=rtol, atol=atol, err_msg=key)


@pytest.fixture(scope="module")
def inputs():
    inputs = steps.make_inputs()
    norms = [steps.joint_norm(inputs, s) for s in range(len(steps.GRADIENT_SCALES))]
    assert norms[1] > 1.0 > max(norms[0], norms[2]), norms  # one clipped step, two unclipped
    return inputs


@pytest.fixture(scope="module")
def tensorflow_run(inputs):
    return steps.run_all(inputs)


@pytest.fixture(scope="module", params=backends.BACKENDS)
def other_run(request, inputs):
    backends.require(request.param)
    return request.param, backends.run_on_backend(request.param, _CHILD, inputs)


# ------------------------------------------------------------------------------------------------
# Every backend computes what TensorFlow computes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", steps.OPTIMIZER_NAMES)
def test_three_clipped_steps_equal_tensorflows(name, other_run, tensorflow_run, inputs):
    backend, theirs = other_run
    ours = tensorflow_run
    assert int(ours[f"{name}/iterations"]) == int(theirs[f"{name}/iterations"]) == 3
    np.testing.assert_allclose(ours[f"{name}/norms"],
                               [steps.joint_norm(inputs, s) for s in range(3)], rtol=1e-6)
    _assert_same(theirs, ours, f"{name}/")
    # The steps moved every weight (lr(0) = 0, then two steps), so equal weights mean something.
    for i in range(len(steps.PATHS)):
        assert np.abs(ours[f"{name}/w_{i}"] - inputs[f"w_{i}"]).min() > 1e-5, (name, i)


@pytest.mark.parametrize("name", steps.OPTIMIZER_NAMES)
def test_stateless_apply_equals_apply(name, other_run):
    # Keras' JAX fit() updates through stateless_apply (jitted here on JAX), after the keras.ops
    # clip: the same weights and slots as apply_gradients' stateful steps.
    backend, theirs = other_run
    for i in range(len(steps.PATHS)):
        for kind in ("w", "adam_m", "adam_v"):
            key = f"{name}/{kind}_{i}"
            np.testing.assert_allclose(theirs[f"stateless/{key}"], theirs[key], rtol=1e-6,
                                       atol=1e-9, err_msg=f"{backend} {key}")


def test_schedule_values_equal_tensorflows(other_run, tensorflow_run):
    backend, theirs = other_run
    ours = tensorflow_run
    expected = [1e-2 * (1 - min(t, 10) / 10) ** 0.5 * min(1.0, t / 2)
                for t in steps.SCHEDULE_STEPS]
    np.testing.assert_allclose(ours["schedule"], expected, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(ours["official_schedule"],
                               [0.0, 2.4875e-4, 4.95e-4, 2.5e-4, 0.0, 0.0], rtol=1e-6)
    assert float(ours["official_schedule_int64"]) == pytest.approx(2.4875e-4, rel=1e-6)
    _assert_same(theirs, ours, "schedule", rtol=1e-6, atol=0)
    _assert_same(theirs, ours, "official_schedule", rtol=1e-6, atol=0)


def test_clip_equals_tensorflows(other_run, tensorflow_run, inputs):
    backend, theirs = other_run
    ours = tensorflow_run
    norm = steps.joint_norm(inputs, 1)
    np.testing.assert_allclose(ours["clip_norm"], norm, rtol=1e-6)
    np.testing.assert_allclose(ours["clip_0"], inputs["g1_0"] / norm, rtol=1e-5)
    np.testing.assert_allclose(ours["unclipped_0"], inputs["g1_0"], rtol=1e-6)  # under the clip
    assert bool(theirs["clip_none_kept"]) and bool(ours["clip_none_kept"])
    assert np.isnan(theirs["inf_clipped"]).all() and not np.isfinite(theirs["inf_norm"])
    _assert_same(theirs, ours, "clip_", rtol=1e-6, atol=0)
    _assert_same(theirs, ours, "unclipped_", rtol=1e-6, atol=0)


def test_configs_round_trip_on_every_backend(other_run, tensorflow_run):
    backend, theirs = other_run
    for key in ("adamw", "lamb", "schedule"):
        for run, where in ((tensorflow_run, "tensorflow"), (theirs, backend)):
            config, restored, deserialized, class_name = json.loads(str(run[f"config/{key}"]))
            assert restored == config and deserialized == config, (where, key)
            assert class_name == {"adamw": "AdamWeightDecay", "lamb": "Lamb",
                                  "schedule": "WarmupPolynomialDecay"}[key]
        # The same config whichever backend wrote it (a checkpoint's config.json moves freely).
        assert str(theirs[f"config/{key}"]) == str(tensorflow_run[f"config/{key}"]), key
    adamw = json.loads(str(theirs["config/adamw"]))[0]
    assert adamw["lr_multipliers"] == steps.LR_MULTIPLIERS
    assert adamw["exclude_from_weight_decay"] == ["LayerNorm", "layer_norm", "bias"]


# ------------------------------------------------------------------------------------------------
# TensorFlow: the fast paths compute the keras.ops functions
# ------------------------------------------------------------------------------------------------
def _count_fused_calls(monkeypatch):
    calls = []
    real = tf_update.fused_adamw_update
    monkeypatch.setattr(tf_update, "fused_adamw_update",
                        lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    return calls


@pytest.mark.parametrize("name", ["adamw", "adamw_bc"])
def test_fused_update_equals_keras_ops_update(name, monkeypatch, inputs):
    calls = _count_fused_calls(monkeypatch)
    fused = steps.train(name, inputs)
    assert len(calls) == 3 * len(steps.PATHS)  # the TF default runs the fused kernel
    with monkeypatch.context() as m:
        m.setattr(optimizers, "_fusable_handles", lambda *args: None)
        ops_path = steps.train(name, inputs)
    assert len(calls) == 3 * len(steps.PATHS)  # ...and the forced run did not
    _assert_same(ops_path, fused, f"{name}/", rtol=1e-6, atol=1e-9)
    if name == "adamw_bc":  # the correction changed the steps (it is not a no-op)
        official = steps.train("adamw", inputs)
        assert not np.allclose(official["adamw/w_0"], fused["adamw_bc/w_0"], rtol=1e-3)


def _dense_of(grad):
    return tf.convert_to_tensor(grad).numpy()


@pytest.mark.parametrize("clip_norm", [1.0, 100.0])
def test_dense_clip_equals_tf_clip_by_global_norm(clip_norm, inputs):
    # IndexedSlices with a repeated row: TensorFlow sums the repeated rows before the norm; the
    # keras.ops clip gets the dense gradient (what JAX and PyTorch give an embedding).
    values = tf.constant(inputs["g1_0"][:4])
    indices = tf.constant([1, 4, 1, 2])
    sliced = tf.IndexedSlices(values, indices, tf.constant([6, 3]))
    grads = [sliced, tf.constant(inputs["g1_1"]), None, tf.constant(inputs["g1_2"])]
    dense = [None if g is None else tf.convert_to_tensor(g) for g in grads]
    tf_clipped, tf_norm = optimization.clip_by_global_norm(grads, clip_norm)
    ops_clipped, ops_norm = optimization.dense_clip_by_global_norm(dense, clip_norm)
    assert isinstance(tf_clipped[0], tf.IndexedSlices) and tf_clipped[2] is ops_clipped[2] is None
    np.testing.assert_allclose(ops_norm.numpy(), tf_norm.numpy(), rtol=1e-6)
    for a, b in zip(ops_clipped, tf_clipped):
        if a is not None:
            np.testing.assert_allclose(_dense_of(a), _dense_of(b), rtol=1e-6, atol=1e-9)
    if clip_norm == 1.0:
        assert float(tf_norm) > 1.0  # the clip was active


def test_dense_clip_of_a_non_finite_norm_is_nan():
    grads = [tf.constant([np.inf, 1.0]), tf.constant([2.0])]
    clipped, norm = optimization.dense_clip_by_global_norm(grads, 1.0)
    assert not np.isfinite(norm.numpy())
    assert all(np.isnan(g.numpy()).all() for g in clipped)
    clipped, norm = optimization.dense_clip_by_global_norm([None], 1.0)
    assert clipped == [None] and float(norm) == 0.0
