"""`modeling.deferred_init` (issue 45, the time to the first step): on JAX a pretraining model
built from shapes, its variables initialized in a few compiled calls, has the values of the eager
build (a forward pass on a dummy batch, every variable's initializer op by op), bit for bit, and
compiles a fraction of the programs. In a JAX child, TensorFlow unimportable there."""

import numpy as np
import pytest

from tests import backends

_CHILD = """
import re
import jax
import keras
from keras import ops

from electra_tf.config import PretrainingConfig
from electra_tf.modeling import deferred_init
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
config = PretrainingConfig.create("t", "/tmp/unused", {
    "vocab_size": 100, "max_seq_length": 24, "embedding_size": 32,
    "model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2}})
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(event)
    if event == "/jax/core/compile/backend_compile_duration" else None)


def eager():  # the build before deferred_init: an eager forward pass, initializers op by op
    model = ElectraPretrainer.from_pretraining_config(config, SPECIAL)
    dummy = ops.ones((1, 8), "int32")
    model({"input_ids": dummy * SPECIAL.cls_id, "input_mask": dummy, "segment_ids": dummy * 0},
          seed=ops.zeros((2,), "int32"), training=False)
    return model


def deferred():
    with deferred_init.deferred_variables():
        model = ElectraPretrainer.from_pretraining_config(config, SPECIAL)
        model.build_from_sequence_length()
    return model


for name, build in (("eager", eager), ("deferred", deferred)):
    keras.utils.set_random_seed(5)
    del compiles[:]
    model = build()
    out[name + "/compiles"] = np.array(len(compiles))
    out[name + "/built"] = np.array(model.built)
    for v in model.variables:  # seed generators and models are numbered per process
        out[name + "/" + re.sub(r"(seed_generator|electra_pretrainer)_\\d+", r"\\1", v.path)] = (
            np.asarray(v.value))

# A failure inside leaves no variable without a value.
try:
    with deferred_init.deferred_variables():
        layer = keras.layers.Dense(3)
        layer.build((None, 2))
        raise RuntimeError("stop")
except RuntimeError:
    pass
out["after_error"] = np.asarray(layer.kernel.value)
"""


def _runs(got):
    return {name: {k.split("/", 1)[1]: v for k, v in got.items() if k.startswith(name + "/")}
            for name in ("eager", "deferred")}


@pytest.mark.slow  # two builds in a JAX child, 345 eager compilations: 40-50 s at load 4 on 2 cores
def test_deferred_build_equals_the_eager_build_with_fewer_compilations():
    backends.require("jax")
    got = backends.run_on_backend("jax", _CHILD, timeout=300)
    runs = _runs(got)
    eager, deferred = runs["eager"], runs["deferred"]
    assert deferred.pop("built") and eager.pop("built")
    eager_compiles, deferred_compiles = int(eager.pop("compiles")), int(deferred.pop("compiles"))
    assert sorted(deferred) == sorted(eager) and len(eager) > 50
    for key in eager:
        np.testing.assert_array_equal(deferred[key], eager[key], err_msg=key)
    # Eagerly every op of a new shape compiles; deferred, one program per initializer
    # signature (this model: measured 27 against 345).
    assert deferred_compiles * 4 < eager_compiles, (deferred_compiles, eager_compiles)
    assert got["after_error"].shape == (2, 3)


_DATA_PARALLEL_CHILD = """
import re
import keras
from keras import ops

from electra_tf.config import PretrainingConfig
from electra_tf.modeling import deferred_init
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import SpecialTokens

SPECIAL = SpecialTokens(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
config = PretrainingConfig.create("t", "/tmp/unused", {
    "vocab_size": 100, "max_seq_length": 24, "embedding_size": 32,
    "model_hparam_overrides": {"hidden_size": 64, "num_hidden_layers": 2}})
keras.distribution.set_distribution(keras.distribution.DataParallel(
    devices=keras.distribution.list_devices()))
for name in ("eager", "deferred"):
    keras.utils.set_random_seed(5)
    if name == "eager":
        model = ElectraPretrainer.from_pretraining_config(config, SPECIAL)
        dummy = ops.ones((1, 8), "int32")
        model({"input_ids": dummy * SPECIAL.cls_id, "input_mask": dummy,
               "segment_ids": dummy * 0}, seed=ops.zeros((2,), "int32"), training=False)
    else:
        with deferred_init.deferred_variables():
            model = ElectraPretrainer.from_pretraining_config(config, SPECIAL)
            model.build_from_sequence_length()
    for v in model.variables:
        key = name + "/" + re.sub(r"(seed_generator|electra_pretrainer)_\\d+", r"\\1", v.path)
        out[key] = np.asarray(v.value)
        out[key + "@sharding"] = np.array(str(v.value.sharding))
out["compiled"] = np.array(len(deferred_init._COMPILED))
"""


@pytest.mark.slow  # two builds in a JAX child on 2 CPU devices: ~40 s at load 8 on 2 cores
def test_deferred_build_on_two_devices_equals_the_eager_one():
    backends.require("jax")
    got = backends.run_on_backend(
        "jax", _DATA_PARALLEL_CHILD, timeout=300,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    runs = _runs(got)
    eager, deferred = runs["eager"], runs["deferred"]
    assert sorted(deferred) == sorted(eager) and len(eager) > 100
    for key in eager:  # values, and the replicated layouts of keras.distribution
        np.testing.assert_array_equal(deferred[key], eager[key], err_msg=key)
    assert "'batch': 2" in str(deferred[next(k for k in deferred if k.endswith("@sharding"))])
    assert 0 < int(got["compiled"]) < 50  # the replicated variables took the compiled path
