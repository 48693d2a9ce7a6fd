"""Several training steps per compiled call on JAX (issue 45): `ElectraPretrainer.compile(
steps_per_execution=k)` (`portable_fit.jax_train_function`: a scan over k stacked batches) gives
the weights, optimizer state and metrics of k single steps, bit for bit, with a remainder
shorter than k and on two devices; the `steps_per_execution` hparam is strict and its automatic
value divides the loop and the checkpoint interval.

The trainer-level checks (`run_pretraining.py --backend jax` with k > 1 ends on the weights of
one step per call; a SIGTERM stops at a call's end and the rerun resumes exactly) are in
tests/training/test_portable_trainer.py."""

import copy
import json

import numpy as np
import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.training.portable import support as portable_support
from tests import backends
from tests.training.test_portable_fit import CONFIG, SEQ, SPECIAL, VOCAB

BATCH, STEPS = 8, 12
WITH_DROPOUT = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}

# One model per k from the same weights, each fit() on the same 12 batches from a generator (as
# the trainer feeds it); k = 5: two calls of 5 steps, then a remainder of 2 (one step a call).
_CHILD = """
import json
import keras
import numpy as np
from electra_tf.training import optimization
from electra_tf.training.optimizers import AdamWeightDecay
from electra_tf.training.pretrainer import ElectraPretrainer

config = json.loads(str(inp["config"]))
data = {k: inp[k] for k in ("input_ids", "input_mask", "segment_ids")}
batch, steps = int(inp["batch"]), int(inp["steps"])
if int(inp["devices"]) > 1:
    keras.distribution.set_distribution(keras.distribution.DataParallel())
keras.utils.set_random_seed(0)
start = ElectraPretrainer(**config)
start.build_from_sequence_length()
start = start.get_weights()


def batches():
    for i in range(steps):
        yield ({k: v[i * batch:(i + 1) * batch] for k, v in data.items()},)


for k in (1, 5):
    keras.utils.set_random_seed(0)
    m = ElectraPretrainer(**config)
    m.build_from_sequence_length()
    m.set_weights(start)
    schedule = optimization.WarmupPolynomialDecay(1e-2, num_train_steps=20, num_warmup_steps=2)
    m.compile(optimizer=AdamWeightDecay(schedule), steps_per_execution=k)
    history = m.fit(batches(), steps_per_epoch=steps, epochs=1, shuffle=False, verbose=0)
    for i, w in enumerate(m.get_weights() + [v.numpy() for v in m.optimizer.variables]):
        out[f"{k}:w{i}"] = np.asarray(w)
    logs = {name: values[-1] for name, values in history.history.items()}
    terms = {f"step_{n}": float(keras.ops.convert_to_numpy(mean.result()))
             for n, mean in m._fit_state.step_terms.items()}
    out[f"{k}:logs"] = np.array(json.dumps(dict(logs, **terms), sort_keys=True))
    out[f"{k}:iterations"] = np.asarray(keras.ops.convert_to_numpy(m.optimizer.iterations))
out["initial"] = start[0]
"""


def _data(devices):
    rng = np.random.default_rng(3)
    rows = BATCH * STEPS
    ids = rng.integers(5, VOCAB, (rows, SEQ)).astype(np.int32)
    lengths = rng.integers(6, SEQ + 1, rows)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    ids[:, 0] = SPECIAL["cls_id"]
    config = copy.deepcopy(CONFIG)
    for part in ("discriminator_config", "generator_config"):
        config[part].update(WITH_DROPOUT)  # the dropout seed states are carried too
    return {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids),
            "config": np.array(json.dumps(config)), "batch": np.array(BATCH),
            "steps": np.array(STEPS), "devices": np.array(devices)}


@pytest.mark.parametrize("devices", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_k_steps_per_call_equal_k_calls_bit_for_bit(devices):
    backends.require("jax")
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"} if devices > 1 else None
    out = backends.run_on_backend("jax", _CHILD, _data(devices), env=env)
    weights = sorted(k[2:] for k in out if k.startswith("1:w"))
    assert len(weights) > 10
    assert not np.array_equal(out["1:w0"], out["initial"])  # not vacuous: the steps trained
    assert int(out["5:iterations"]) == int(out["1:iterations"]) == STEPS
    for key in weights:  # the weights, then the optimizer's variables (moments, step counter)
        np.testing.assert_array_equal(out[f"5:{key}"], out[f"1:{key}"], err_msg=key)
    # the loss, the official metrics (disc_auc among them) and the per-step terms' means
    assert json.loads(str(out["5:logs"])) == json.loads(str(out["1:logs"]))


@pytest.mark.parametrize("hparams, expected", [
    ({}, 10),  # official: iterations_per_loop 200, save_checkpoints_steps 1000
    ({"iterations_per_loop": 1}, 1),
    ({"iterations_per_loop": 250, "save_checkpoints_steps": 500}, 10),
    ({"iterations_per_loop": 64, "save_checkpoints_steps": 1024}, 16),
    ({"iterations_per_loop": 7, "save_checkpoints_steps": 7}, 7),
    ({"iterations_per_loop": 13, "save_checkpoints_steps": 1000}, 1),
    ({"steps_per_execution": 25}, 25),
    ({"backend": "torch"}, 1),
])
def test_automatic_steps_per_call_divide_the_loop_and_the_checkpoint_interval(hparams, expected):
    config = PretrainingConfig.create("m", "/tmp/d", dict({"backend": "jax"}, **hparams))
    assert portable_support.steps_per_execution(config) == expected


@pytest.mark.parametrize("hparams, message", [
    ({"steps_per_execution": 0}, "steps_per_execution must be null (automatic) or >= 1, got 0"),
    ({"steps_per_execution": 30}, "steps_per_execution 30 must divide iterations_per_loop (200)"),
    ({"steps_per_execution": 40, "save_checkpoints_steps": 100},
     "steps_per_execution 40 must divide save_checkpoints_steps (100)"),
    ({"steps_per_execution": 4, "backend": "torch"}, "steps_per_execution 4 needs backend jax"),
    ({"steps_per_execution": 4, "backend": "tensorflow"}, "steps_per_execution is the JAX"),
])
def test_steps_per_execution_is_strict(hparams, message):
    hparams = dict({"backend": "jax", "iterations_per_loop": 200,
                    "save_checkpoints_steps": 1000}, **hparams)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PretrainingConfig.create("m", "/tmp/d", hparams)
