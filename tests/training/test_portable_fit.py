"""ElectraPretrainer.fit() / evaluate() on JAX and PyTorch (training/portable/fit.py): gradient
accumulation gives the whole batch's update, the step seed follows the optimizer's step (a fit()
split in two equals one fit()), evaluation repeats itself."""

import json

import numpy as np
import pytest

from tests import backends

VOCAB, SEQ, BATCH = 60, 16, 8
SPECIAL = {"pad_id": 0, "unk_id": 1, "cls_id": 2, "sep_id": 3, "mask_id": 4}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
CONFIG = {
    "discriminator_config": dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32, embedding_size=8,
                                 **NO_DROPOUT),
    "generator_config": dict(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=1,
                             num_attention_heads=1, intermediate_size=16, embedding_size=8,
                             **NO_DROPOUT),
    "special_tokens": SPECIAL, "masking_options": {"max_predictions_per_seq": 3}, "seed": 11,
    "name": "pretrainer",
}

# The start of every fit() child (here and in test_decoupled_fit.py): `config`, `data`, `batch`
# from the parent's `inp`.
CHILD_PRELUDE = """
import json
import keras
import numpy as np
from electra_tf.training import optimization
from electra_tf.training.optimizers import AdamWeightDecay
from electra_tf.training.pretrainer import ElectraPretrainer

config = json.loads(str(inp["config"]))
data = {k: inp[k] for k in ("input_ids", "input_mask", "segment_ids")}
batch = int(inp["batch"])
"""

_CHILD = CHILD_PRELUDE + """

def model(accumulation=1):
    keras.utils.set_random_seed(0)
    m = ElectraPretrainer(**config)
    m.build_from_sequence_length()
    if reference is not None:
        m.set_weights(reference)
    schedule = optimization.WarmupPolynomialDecay(1e-2, num_train_steps=20, num_warmup_steps=1)
    m.compile(optimizer=AdamWeightDecay(schedule), gradient_accumulation_steps=accumulation)
    return m


reference = None
reference = model().get_weights()
for i, w in enumerate(reference):
    out[f"initial:{i}"] = w
whole = model()
whole.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
accumulated = model(accumulation=2)
accumulated.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
halves = model()
rows = data["input_ids"].shape[0] // 2
halves.fit({k: v[:rows] for k, v in data.items()}, batch_size=batch, epochs=1, shuffle=False,
           verbose=0)
halves.fit({k: v[rows:] for k, v in data.items()}, batch_size=batch, epochs=1, shuffle=False,
           verbose=0)
for name, m in (("whole", whole), ("accumulated", accumulated), ("halves", halves)):
    for i, w in enumerate(m.get_weights()):
        out[f"{name}:{i}"] = w
    out[f"{name}:iterations"] = np.asarray(keras.ops.convert_to_numpy(m.optimizer.iterations))
first = whole.evaluate(data, batch_size=batch, verbose=0, return_dict=True)
second = whole.evaluate(data, batch_size=batch, verbose=0, return_dict=True)
out["eval_first"] = np.array([first[k] for k in sorted(first)])
out["eval_second"] = np.array([second[k] for k in sorted(second)])
"""


def _data():
    rng = np.random.default_rng(1)
    ids = rng.integers(5, VOCAB, (4 * BATCH, SEQ)).astype(np.int32)
    lengths = rng.integers(6, SEQ + 1, 4 * BATCH)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    ids[:, 0] = SPECIAL["cls_id"]
    return {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids),
            "config": np.array(json.dumps(CONFIG)), "batch": np.array(BATCH)}


@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_accumulation_resume_and_evaluation(backend):
    backends.require(backend)
    out = backends.run_on_backend(backend, _CHILD, _data())
    weights = sorted(k for k in out if k.startswith("whole:") and k != "whole:iterations")
    assert weights
    for name in ("accumulated", "halves"):
        assert int(out[f"{name}:iterations"]) == int(out["whole:iterations"]) == 4
        for key in weights:
            other = key.replace("whole:", f"{name}:")
            # accumulation: the same update up to float summation order; halves: the same steps
            np.testing.assert_allclose(out[other], out[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} {key}")
    # not vacuous: the 4 steps moved the weights
    assert max(np.abs(out[k] - out[k.replace("whole:", "initial:")]).max() for k in weights) > 1e-3
    np.testing.assert_array_equal(out["eval_first"], out["eval_second"])
