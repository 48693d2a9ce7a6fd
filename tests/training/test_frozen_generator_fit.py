"""A frozen generator with the temperature curriculum in Keras `fit()` (issue 34): on TensorFlow
(training/tf/keras_fit.py) and JAX (training/portable/fit.py) the generator's weights stay bit for
bit, the discriminator trains, the curriculum changes what it trains on, and a fit() split in two
equals one fit() (the temperature follows the optimizer's step, not the call)."""

import json

import numpy as np
import pytest

from tests import backends
from tests.training.test_portable_fit import CONFIG, _data

_CHILD = """
import json
import keras
import numpy as np
from electra_tf.training import optimization
from electra_tf.training.optimizers import AdamWeightDecay
from electra_tf.training.pretrainer import ElectraPretrainer

config = json.loads(str(inp["config"]))
variant = json.loads(str(inp["variant"]))
data = {k: inp[k] for k in ("input_ids", "input_mask", "segment_ids")}
batch = int(inp["batch"])


def model(**extra):
    keras.utils.set_random_seed(0)
    m = ElectraPretrainer(**config, **extra)
    m.build_from_sequence_length()
    schedule = optimization.WarmupPolynomialDecay(1e-2, num_train_steps=20, num_warmup_steps=1)
    m.compile(optimizer=AdamWeightDecay(schedule))
    return m


def weights(m, part):
    layers = (m.generator, m.generator_head) if part == "generator" else (
        m.discriminator, m.discriminator_head)
    return [keras.ops.convert_to_numpy(v.value) for layer in layers for v in layer.weights]


initial = model(**variant)
out["trainable_is_generator"] = np.array([
    any(v is w for w in initial.generator.weights + initial.generator_head.weights)
    for v in initial.trainable_variables])
whole = model(**variant)
whole.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
halves = model(**variant)
rows = data["input_ids"].shape[0] // 2
for part in (slice(0, rows), slice(rows, None)):
    halves.fit({k: v[part] for k, v in data.items()}, batch_size=batch, epochs=1, shuffle=False,
               verbose=0)
constant = model(frozen_generator=True)  # no curriculum: sampled at temperature 1 throughout
constant.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
for name, m in (("initial", initial), ("whole", whole), ("halves", halves),
                ("constant", constant)):
    for part in ("generator", "discriminator"):
        for i, w in enumerate(weights(m, part)):
            out[f"{name}:{part}:{i}"] = w
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_frozen_generator_with_curriculum_in_fit(backend):
    if backend != "tensorflow":
        backends.require(backend)
    variant = {"frozen_generator": True, "temperature_start": 4.0, "temperature_decay_steps": 4}
    # A generator initialised with large weights, as a trained one is confident: its logits are
    # far apart, so the temperature changes the samples (near-zero logits sample alike).
    config = dict(CONFIG, generator_config=dict(CONFIG["generator_config"], initializer_range=1.0))
    inputs = dict(_data(), config=np.array(json.dumps(config)),
                  variant=np.array(json.dumps(variant)))
    out = backends.run_on_backend(backend, _CHILD, inputs,
                                  block_tensorflow=backend != "tensorflow")
    assert not out["trainable_is_generator"].any()
    generator = sorted(k for k in out if k.startswith("initial:generator:"))
    assert generator
    for key in generator:
        for name in ("whole", "halves", "constant"):  # bit for bit
            np.testing.assert_array_equal(out[key.replace("initial", name)], out[key])
    moved, by_curriculum = [], []
    for key in sorted(k for k in out if k.startswith("initial:discriminator:")):
        end = out[key.replace("initial", "whole")]
        moved.append(np.abs(end - out[key]).max())
        by_curriculum.append(np.abs(end - out[key.replace("initial", "constant")]).max())
        np.testing.assert_allclose(out[key.replace("initial", "halves")], end, rtol=1e-5,
                                   atol=1e-6, err_msg=key)
    assert max(moved) > 1e-3  # the discriminator trained
    assert max(by_curriculum) > 1e-4  # on other samples than at temperature 1
