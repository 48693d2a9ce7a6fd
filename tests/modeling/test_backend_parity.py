"""One model on three backends: the encoders and heads built on JAX and PyTorch from TensorFlow's
weights and seed-generator states compute TensorFlow's outputs, dropout masks included, and the
same gradients.

TensorFlow (in this process) runs its default kernels (XLA clusters in training calls, fused
op-by-op kernels in inference); the children run the keras.ops kernels with TensorFlow
unimportable. Both draw the counter-based "hash" dropout stream from the same seed generators, so
the masks are the same bits; what remains is float32 rounding (other matmul and erf kernels).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import backends
from tests.modeling.test_ops_kernels import assert_gradients_close

# The model, as source: the same code builds it here and in the children. Discriminator and
# generator encoders share one embedding block; E = 32 != H = 64 gives the discriminator its
# projection. Padding in two of the three examples.
_MODEL = """
import keras
import numpy as np
from keras import ops

from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead

VOCAB, SEQ, BATCH = 100, 16, 3


class Pretraining(keras.Model):
    def __init__(self):
        super().__init__()
        self.discriminator = ElectraEncoder(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, embedding_size=32, max_position_embeddings=32)
        self.generator = ElectraEncoder(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, embedding_size=32, max_position_embeddings=32,
            embeddings=self.discriminator.embeddings, name="generator")
        self.discriminator_head = DiscriminatorHead(64)
        self.discriminator_head.build((None, None, 64))
        self.generator_head = GeneratorHead(32, VOCAB)
        self.generator_head.build((None, None, 32))

    def call(self, inputs, training=False):
        disc = self.discriminator(inputs, training=training)["sequence_output"]
        gen = self.generator(inputs, training=training)["sequence_output"]
        table = self.discriminator.embeddings.word_embeddings.embeddings
        return {"sequence_output": disc, "generator_sequence_output": gen,
                "rtd_logits": self.discriminator_head(disc, training=training),
                "mlm_logits": self.generator_head(gen, table)}


def seed_states(model):
    return [v for v in model.non_trainable_variables
            if "int" in keras.backend.standardize_dtype(v.dtype)]


def model_inputs(arrays):
    return {k: ops.convert_to_tensor(arrays[k]) for k in ("input_ids", "input_mask", "segment_ids")}


def projection_loss(outputs, arrays):
    return sum(ops.sum(outputs[k] * ops.convert_to_tensor(arrays["r_" + k])) for k in outputs)
"""

# Child: the model from TensorFlow's weights and seed states, its outputs (inference, training)
# and the gradients of `projection_loss` in a training call, by the backend's autodiff.
_CHILD = _MODEL + """
model = Pretraining()
model.set_weights([inp[f"weight_{i}"] for i in range(int(inp["num_weights"]))])


def rewind():
    for i, v in enumerate(seed_states(model)):
        v.assign(inp[f"state_{i}"].astype(keras.backend.standardize_dtype(v.dtype)))


inputs = model_inputs(inp)
rewind()
for training in (False, True):
    for k, v in model(inputs, training=training).items():
        out[f"{training}/{k}"] = ops.convert_to_numpy(v)
rewind()
backend = keras.backend.backend()
if backend == "jax":
    import jax
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss_fn(trainable):
        outputs, _ = model.stateless_call(trainable, non_trainable, inputs, training=True)
        return projection_loss(outputs, inp)

    grads = jax.grad(loss_fn)(trainable)
else:
    projection_loss(model(inputs, training=True), inp).backward()
    grads = [v.value.grad for v in model.trainable_variables]
for i, g in enumerate(grads):
    out[f"grad_{i}"] = ops.convert_to_numpy(g)
"""


@pytest.fixture(scope="module")
def tensorflow_reference():
    """The model on TensorFlow: child inputs (weights, states, batch, projections) and results."""
    namespace = {}
    exec(_MODEL, namespace)  # noqa: S102 (test code, the same source the children run)
    keras.utils.set_random_seed(0)
    model = namespace["Pretraining"]()
    rng = np.random.default_rng(0)
    seq, batch = namespace["SEQ"], namespace["BATCH"]
    mask = (np.arange(seq)[None, :] < np.array([[seq], [11], [5]])).astype(np.int32)
    ids = rng.integers(5, namespace["VOCAB"], (batch, seq)) * mask
    arrays = {"input_ids": ids.astype(np.int32),
              "input_mask": mask,
              "segment_ids": ((np.arange(seq)[None, :] >= 7) & (mask > 0)).astype(np.int32)}
    weights = model.get_weights()
    states = [v.numpy() for v in namespace["seed_states"](model)]
    assert states and model.discriminator.embeddings_project is not None
    inputs = namespace["model_inputs"](arrays)
    results = {}
    for training in (False, True):
        for k, v in model(inputs, training=training).items():
            results[f"{training}/{k}"] = v.numpy()
            arrays[f"r_{k}"] = rng.normal(size=v.shape).astype(np.float32)
    for variable, value in zip(namespace["seed_states"](model), states):
        variable.assign(value)
    with tf.GradientTape() as tape:
        loss = namespace["projection_loss"](model(inputs, training=True), arrays)
    for i, g in enumerate(tape.gradient(loss, model.trainable_variables)):
        results[f"grad_{i}"] = tf.convert_to_tensor(g).numpy()
    paths = [v.path for v in model.trainable_variables]
    arrays.update({f"weight_{i}": w for i, w in enumerate(weights)})
    arrays.update({f"state_{i}": s for i, s in enumerate(states)})
    arrays["num_weights"] = np.array(len(weights))
    return arrays, results, paths


# JAX dispatches the layers op by op in eager calls (~30 s with the gradients; PyTorch ~8 s).
SLOW_ON_JAX = [pytest.param("jax", marks=pytest.mark.slow), "torch"]


@pytest.mark.parametrize("backend", SLOW_ON_JAX)
def test_model_equals_tensorflow_on_backend(backend, tensorflow_reference):
    backends.require(backend)
    arrays, expected, paths = tensorflow_reference
    got = backends.run_on_backend(backend, _CHILD, arrays)
    assert set(got) == set(expected)
    # Dropout is on (0.1 everywhere): a training call differs from inference, on both sides.
    assert np.abs(expected["True/sequence_output"] - expected["False/sequence_output"]).max() > 0.1
    for name in sorted(k for k in expected if not k.startswith("grad_")):
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{backend} {name}")
    grads = [f"grad_{i}" for i in range(len(paths))]
    assert_gradients_close([got[g] for g in grads], [expected[g] for g in grads], paths, backend)
