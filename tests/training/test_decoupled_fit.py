"""`decoupled_optimizers` in Keras `fit()` (issue 34): on TensorFlow (training/tf/keras_fit.py) and
JAX (training/portable/fit.py) the generator's variables move at the generator's rate (0 here:
they stay put) while the discriminator's move, a fit() split in two equals one fit(), and
gradient accumulation gives the whole batch's update."""

import numpy as np
import pytest

from tests import backends
from tests.training.test_portable_fit import BATCH, CHILD_PRELUDE, CONFIG, _data

_CHILD = CHILD_PRELUDE + """

def model(accumulation=1):
    keras.utils.set_random_seed(0)
    m = ElectraPretrainer(**config)
    m.build_from_sequence_length()
    schedule = optimization.WarmupPolynomialDecay(1e-2, num_train_steps=20, num_warmup_steps=1)
    frozen = optimization.WarmupPolynomialDecay(0.0, num_train_steps=20, num_warmup_steps=1)
    m.compile(optimizer=AdamWeightDecay(schedule, generator_learning_rate=frozen),
              gradient_accumulation_steps=accumulation)
    return m


initial = model()
generator = [any(v is w for w in initial.generator_variables()) for v in initial.trainable_variables]
out["generator"] = np.array(generator)
for i, v in enumerate(initial.trainable_variables):
    out[f"initial:{i}"] = keras.ops.convert_to_numpy(v.value)
whole = model()
whole.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
accumulated = model(accumulation=2)
accumulated.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
halves = model()
rows = data["input_ids"].shape[0] // 2
for part in (slice(0, rows), slice(rows, None)):
    halves.fit({k: v[part] for k, v in data.items()}, batch_size=batch, epochs=1, shuffle=False,
               verbose=0)
for name, m in (("whole", whole), ("accumulated", accumulated), ("halves", halves)):
    for i, v in enumerate(m.trainable_variables):
        out[f"{name}:{i}"] = keras.ops.convert_to_numpy(v.value)
"""


@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=pytest.mark.slow)])
def test_decoupled_fit(backend):
    if backend != "tensorflow":
        backends.require(backend)
    out = backends.run_on_backend(backend, _CHILD, _data(), block_tensorflow=backend != "tensorflow")
    generator = out["generator"]
    assert generator.any() and not generator.all()
    moved = []
    for i, is_generator in enumerate(generator):
        start, end = out[f"initial:{i}"], out[f"whole:{i}"]
        if is_generator:
            np.testing.assert_array_equal(start, end)  # generator rate 0
        else:
            moved.append(np.abs(end - start).max())
        # halves: the same steps; accumulation: the same update up to float summation order
        for name in ("halves", "accumulated"):
            np.testing.assert_allclose(out[f"{name}:{i}"], end, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} {i}")
    assert max(moved) > 1e-3  # the discriminator trained
