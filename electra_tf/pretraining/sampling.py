"""Sampling the generator's replacements and building the discriminator's input.

`sample_ids` is the official `sample_from_softmax` (Gumbel-max, with the caller's temperature and
`disallow` folded in) but works BY INDEX: it returns ids instead of a [batch, N, vocab] one-hot and
never builds a one-hot for `disallow` either. `make_fake_inputs` is the official `_get_fake_data`.

The Gumbel noise comes from one of two streams, chosen by `SAMPLING_RNG` when the step is
traced (`sampling_rng()`: `electra_tf.modeling.kernel_settings.configure` / `kernel_options`,
or ELECTRA_TF_SAMPLING_RNG, on TensorFlow):

- "hash" (default, every backend): u = the counter-based hash of (example key, slot, vocab id)
  (`electra_tf.modeling.rng`: murmur3's finaliser, top 24 bits as (k + 0.5) / 2^24), and the
  official transform g = -log(-log(u + 1e-9) + 1e-9). The same bits on TensorFlow, JAX and
  PyTorch. On TensorFlow the hash, transform, temperature, disallow penalty and the add to the
  logits run as ONE XLA-compiled loop (the same keras.ops code under `jit_compile`) that writes
  the [batch, N, vocab] scores once; a TensorFlow ArgMax reads them. No noise tensor exists. JAX
  compiles the whole step anyway.
- "philox" (TensorFlow only): per-example `tf.random.stateless_uniform` draws (Philox) keyed by
  (example key, salt), one example at a time, so that the only [N, vocab] temporaries are one
  example's noise and scores.

Both are a pure function of the per-example keys: an example's samples do not depend on the
batch it sits in or on how the batch is split across replicas. They are different streams with
the same distribution. The official code draws from stateful `tf.random.uniform`, which is not
reproducible at all.

Cost of `sample_ids` in graph mode, N = 19, vocab 30522, float32 (`python
benchmarks/sampling.py` on an idle 2-core AMD EPYC, one process, calls alternating): batch 32,
"philox" 70 ms vs "hash" 33 ms median; batch 128, 260 ms vs 101 ms. XLA's own ArgMax (a variadic
reduction) was 5x slower than TensorFlow's on this CPU, so the argmax stays a TensorFlow kernel;
the two logs are most of what the fused loop costs.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import keras
from keras import ops

from electra_tf.modeling import kernel_settings, rng
from electra_tf.pretraining.masking import MaskedInputs, unmask
from electra_tf.pretraining.tensor_ops import scatter_update

# Official pretrain_helpers.sample_from_softmax: g = -log(-log(u + 1e-9) + 1e-9).
GUMBEL_EPS = 1e-9
# Official pretrain_helpers.sample_from_softmax: `logits -= 1000.0 * disallow`.
DISALLOW_PENALTY = 1000.0
# The "philox" stream's per-example seeds are (key, this).
_PHILOX_SALT = 0x5EED


def _gumbel(u):
    """The official transform of uniforms into standard Gumbel noise."""
    return -ops.log(-ops.log(u + GUMBEL_EPS) + GUMBEL_EPS)


def _hash_noise(keys, slots: int, vocab_size: int):
    """float32 [B, N, V] Gumbel noise of the "hash" stream."""
    return _gumbel(rng.uniform(rng.element_bits(keys, [slots, vocab_size])))


def _scores(logits, keys, temperature, disallow_ids):
    """float32 [B, N, V]: logits / temperature - 1000 * one_hot(disallow_ids) + g.

    disallow_ids: int32 [B, N]; -1 disallows nothing.
    """
    slots, vocab_size = logits.shape[1], logits.shape[2]
    scaled = logits / temperature
    disallowed = ops.equal(ops.arange(vocab_size, dtype="int32")[None, None, :],
                           ops.expand_dims(disallow_ids, -1))
    # official order: (logits / temperature - 1000 * disallow) + noise
    scaled = ops.where(disallowed, scaled - DISALLOW_PENALTY, scaled)
    return scaled + _hash_noise(keys, slots, vocab_size)


def sampling_rng() -> str:
    """The Gumbel stream models traced now use: the `SAMPLING_RNG` switch on TensorFlow
    (`electra_tf.modeling.kernel_settings`), "hash" on the other backends."""
    if keras.backend.backend() != "tensorflow":
        return "hash"
    return kernel_settings.SAMPLING_RNG


@functools.lru_cache(maxsize=None)
def _compiled_scores():
    """`_scores` as one XLA loop on TensorFlow (the function above, compiled)."""
    import tensorflow as tf

    return tf.function(_scores, jit_compile=True, autograph=False)


def gumbel_noise(shape, keys):
    """Standard Gumbel noise with one independent stream per example (`SAMPLING_RNG`'s).

    Example b's noise depends only on `keys[b]` and `shape[1:]`; it is exactly the noise that
    `sample_ids` adds for that example under the same `SAMPLING_RNG`.

    Args:
        shape: [batch_size, N, vocab_size]; shape[0] must equal the keys' batch size.
        keys: int32 [batch_size].

    Returns:
        float32 tensor of `shape`: g = -log(-log(u + 1e-9) + 1e-9), u ~ U(0, 1).
    """
    if sampling_rng() == "hash":
        return _hash_noise(keys, int(shape[1]), int(shape[2]))
    return _philox_noise(shape, keys)


def _philox_noise(shape, keys):
    import tensorflow as tf

    def one(key):
        seed = tf.stack([key, tf.constant(_PHILOX_SALT, tf.int32)])
        return _gumbel(tf.random.stateless_uniform(shape[1:], seed, dtype=tf.float32,
                                                   alg="philox"))

    return tf.map_fn(one, tf.convert_to_tensor(keys, tf.int32),
                     fn_output_signature=tf.TensorSpec(None, tf.float32), parallel_iterations=2)


def sample_ids(logits, *, keys, temperature: float = 1.0, disallow_ids=None, noise=None):
    """Gumbel-max sample of one id per masked slot (official `sample_from_softmax`, by index).

    sampled = argmax(logits / temperature - 1000 * one_hot(disallow_ids) + g), the same as sampling
    from softmax(logits / temperature) with the disallowed id suppressed. Logits are cast to float32
    first (bfloat16 logits under mixed precision are sampled in float32, as the official does).

    Args:
        logits: float [batch_size, N, vocab_size]. Generator MLM logits.
        keys: int32 [batch_size]. One random key per example (ignored if `noise` is given).
        temperature: float or scalar tensor. Official `temperature` (1.0).
        disallow_ids: optional int [batch_size, N]. An id per slot that must not be sampled
            (official `disallow_correct` passes masked_lm_ids).
        noise: optional float32 [batch_size, N, vocab_size] Gumbel noise to use instead of drawing
            it (tests; `gumbel_noise(logits.shape, keys)` reproduces the drawn noise of the
            current `SAMPLING_RNG`).

    Returns:
        int32 [batch_size, N], without gradient: the generator gets no gradient through its
        samples.
    """
    logits = ops.cast(logits, "float32")
    disallow = (ops.full(ops.shape(logits)[:2], -1, dtype="int32") if disallow_ids is None
                else ops.cast(disallow_ids, "int32"))
    temperature = ops.cast(temperature, "float32")
    if noise is None and sampling_rng() == "philox":
        noise = _philox_noise(ops.shape(logits), keys)
    if noise is not None:
        scaled = logits / temperature
        disallowed = ops.equal(ops.arange(logits.shape[2], dtype="int32")[None, None, :],
                               ops.expand_dims(disallow, -1))
        scores = ops.where(disallowed, scaled - DISALLOW_PENALTY, scaled) + ops.cast(noise,
                                                                                     "float32")
    elif keras.backend.backend() == "tensorflow":
        scores = _compiled_scores()(logits, ops.cast(keys, "int32"), temperature, disallow)
    else:
        scores = _scores(logits, ops.cast(keys, "int32"), temperature, disallow)
    # The discrete samples are data for the discriminator, not a differentiable function of the
    # generator: the generator is trained by the MLM loss only.
    return ops.stop_gradient(ops.cast(ops.argmax(scores, axis=-1), "int32"))


class FakeInputs(NamedTuple):
    """The discriminator's input (official `FakedData`, with ids instead of one-hots).

    Attributes:
        input_ids: int32 [batch_size, seq_length]. Original ids with the samples written at all
            used masked positions.
        is_fake: int32 [batch_size, seq_length]. Replaced-token-detection labels.
        sampled_ids: int32 [batch_size, N]. The generator samples, one per slot.
    """

    input_ids: Any
    is_fake: Any
    sampled_ids: Any


def make_fake_inputs(
    masked: MaskedInputs,
    mlm_logits,
    *,
    keys,
    temperature: float = 1.0,
    disallow_correct: bool = False,
    electric_objective: bool = False,
    noise=None,
) -> FakeInputs:
    """Builds the discriminator input from the generator's logits (official `_get_fake_data`).

    1. Restore the original ids (`unmask`).
    2. Sample one id per slot (`sample_ids`), optionally disallowing the original id.
    3. Scatter the samples into ALL used masked positions, including the 15% the generator saw
       unmasked; unused slots (position 0) are ignored; duplicate positions take the floor mean
       of their samples (official quirk, issue #41).
    4. is_fake = updated AND different from the original: a sample equal to the original is
       labelled real (0). With `electric_objective`, every updated position is labelled 1.

    Args:
        masked: MaskedInputs from `mask_inputs`.
        mlm_logits: float [batch_size, N, vocab_size].
        keys: int32 [batch_size]. Per-example sampling keys (`seeds.example_keys`).
        temperature: float. Official `temperature`.
        disallow_correct: bool. Official `disallow_correct`: never sample the original id.
        electric_objective: bool. Official Electric labelling (is_fake = updated).
        noise: optional Gumbel noise, as in `sample_ids`.

    Returns:
        A `FakeInputs`.
    """
    original_ids = unmask(masked)
    sampled = sample_ids(
        mlm_logits,
        keys=keys,
        temperature=temperature,
        disallow_ids=masked.masked_lm_ids if disallow_correct else None,
        noise=noise,
    )
    updated_ids, updated = scatter_update(original_ids, sampled, masked.masked_lm_positions)
    if electric_objective:
        is_fake = updated
    else:
        is_fake = updated * ops.cast(ops.not_equal(updated_ids, original_ids), "int32")
    return FakeInputs(input_ids=updated_ids, is_fake=is_fake, sampled_ids=sampled)
