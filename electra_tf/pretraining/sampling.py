"""Sampling the generator's replacements and building the discriminator's input.

`sample_ids` is the official `sample_from_softmax` (Gumbel-max, with the caller's temperature and
`disallow` folded in) but works BY INDEX: it returns ids instead of a [batch, N, vocab] one-hot and
never builds a one-hot for `disallow` either. `make_fake_inputs` is the official `_get_fake_data`.

The Gumbel noise comes from one of two streams, chosen by `fused.SAMPLING_RNG` when the step is
traced (`electra_tf.modeling.fused.configure` / `kernel_options`, or ELECTRA_TF_SAMPLING_RNG):

- "hash" (default): u = a keyed 32-bit hash of (example seed, slot, vocab id) (murmur3's
  finaliser, `fused.fmix32`), its top 24 bits as (k + 0.5) / 2^24, and the official transform
  g = -log(-log(u + 1e-9) + 1e-9). Hash, transform, temperature, disallow penalty and the add
  to the logits are ONE XLA-compiled loop that writes the [batch, N, vocab] scores once; a
  TensorFlow ArgMax reads them. No noise tensor exists, and no per-example loop runs.
- "philox": per-example `tf.random.stateless_uniform` draws (Philox), one example at a time
  (`seeds.map_examples`), so that the only [N, vocab] temporaries are one example's noise and
  scores. The stream of releases before the "hash" default.

Both are a pure function of the per-example seeds: an example's samples do not depend on the
batch it sits in or on how the batch is split across replicas. They are different streams (a run
with "hash" sees other samples than one with "philox"), with the same distribution: u is uniform
on 2^24 evenly spaced points of (0, 1) ("philox": 2^23 points of [0, 1)). The official code draws
from stateful `tf.random.uniform`, which is not reproducible at all.

Cost of `sample_ids` in graph mode, N = 19, vocab 30522, float32 (`python
benchmarks/sampling.py` on an idle 2-core AMD EPYC, one process, calls alternating): batch 32,
"philox" 70 ms vs "hash" 33 ms median; batch 128, 260 ms vs 101 ms. XLA's own ArgMax (a variadic
reduction) was 5x slower than TensorFlow's on this CPU, so the argmax stays a TensorFlow kernel;
the two logs are most of what the fused loop costs.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import tensorflow as tf

from electra_tf.modeling import fused
from electra_tf.pretraining import seeds as seeds_lib
from electra_tf.pretraining.masking import MaskedInputs, unmask
from electra_tf.pretraining.tensor_ops import scatter_update

# Official pretrain_helpers.sample_from_softmax: g = -log(-log(u + 1e-9) + 1e-9).
GUMBEL_EPS = 1e-9
# Official pretrain_helpers.sample_from_softmax: `logits -= 1000.0 * disallow`.
DISALLOW_PENALTY = 1000.0

# Odd constants keying the hash stream (distinct from the dropout hash's key constants).
_HASH_KEY = (0x7FEB352D, 0x846CA68B, 0x68E31DA4, 0xB5297A4D)
_HASH_SLOT = 0x9E3779B1
_HASH_VOCAB = 0x85EBCA77


def _uint32_words(x: tf.Tensor):
    """Low and high 32-bit words of int64 `x`, as uint32."""
    mask = tf.constant(0xFFFFFFFF, tf.int64)
    low = tf.cast(tf.bitwise.bitwise_and(x, mask), tf.uint32)
    high = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(32, tf.int64)), mask),
                   tf.uint32)
    return low, high


def _hash_uniform(seeds: tf.Tensor, shape) -> tf.Tensor:
    """u in (0, 1): float32 `shape` [B, N, V], a keyed hash of (seeds[b], n, v).

    Each example's key mixes all 128 bits of its seed; each slot's key is fmix32(key XOR n * C)
    ([B, N], cheap); each element is fmix32(slot key XOR v * C'). XOR rather than add keeps two
    slots whose keys happen to differ by a multiple of C' from getting shifted copies of the same
    noise. The top 24 bits give u = (k + 0.5) / 2^24, exact in float32.
    """
    seeds = tf.cast(seeds, tf.int64)
    key_low, key_high = _uint32_words(seeds[:, 0])
    index_low, index_high = _uint32_words(seeds[:, 1])
    words = (key_low, key_high, index_low, index_high)
    key = tf.zeros_like(key_low)
    for word, constant in zip(words, _HASH_KEY):
        key = fused.fmix32(tf.bitwise.bitwise_xor(key + word, tf.constant(constant, tf.uint32)))
    slots = tf.bitcast(tf.range(shape[1], dtype=tf.int32), tf.uint32)
    slot_keys = fused.fmix32(tf.bitwise.bitwise_xor(
        key[:, tf.newaxis], slots[tf.newaxis, :] * tf.constant(_HASH_SLOT, tf.uint32)))
    vocab = tf.bitcast(tf.range(shape[2], dtype=tf.int32), tf.uint32)
    bits = fused.fmix32(tf.bitwise.bitwise_xor(
        slot_keys[:, :, tf.newaxis], (vocab * tf.constant(_HASH_VOCAB, tf.uint32))[tf.newaxis, tf.newaxis, :]))
    top = tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32)
    return (top + 0.5) * (2.0 ** -24)


def _gumbel(u: tf.Tensor) -> tf.Tensor:
    """The official transform of uniforms into standard Gumbel noise."""
    return -tf.math.log(-tf.math.log(u + GUMBEL_EPS) + GUMBEL_EPS)


@tf.function(jit_compile=True, autograph=False)
def _hash_gumbel_noise(seeds, shape):
    return _gumbel(_hash_uniform(seeds, shape))


@tf.function(jit_compile=True, autograph=False)
def _hash_scores(logits, seeds, temperature, disallow_ids):
    """float32 [B, N, V]: logits / temperature - 1000 * one_hot(disallow_ids) + g, one XLA loop.

    disallow_ids: int32 [B, N]; -1 disallows nothing.
    """
    shape = tf.shape(logits)
    scaled = logits / temperature
    vocab = tf.range(shape[2], dtype=tf.int32)
    disallowed = tf.equal(vocab[tf.newaxis, tf.newaxis, :], disallow_ids[:, :, tf.newaxis])
    # official order: (logits / temperature - 1000 * disallow) + noise
    scaled = tf.where(disallowed, scaled - DISALLOW_PENALTY, scaled)
    return scaled + _gumbel(_hash_uniform(seeds, shape))


def _example_noise(shape, seed: tf.Tensor) -> tf.Tensor:
    """Gumbel noise of one example: float32 of `shape`, from its stateless seed."""
    u = tf.random.stateless_uniform(shape, seed, dtype=tf.float32, alg=seeds_lib.RNG_ALG)
    return -tf.math.log(-tf.math.log(u + GUMBEL_EPS) + GUMBEL_EPS)


def gumbel_noise(shape: Union[Sequence[int], tf.Tensor], seeds: tf.Tensor) -> tf.Tensor:
    """Standard Gumbel noise with one independent stream per example (`fused.SAMPLING_RNG`'s).

    Example b's noise depends only on `seeds[b]` and `shape[1:]`; it is exactly the noise that
    `sample_ids` adds for that example under the same `fused.SAMPLING_RNG`.

    Args:
        shape: [batch_size, ...] full output shape; shape[0] must equal seeds' batch size
            (rank 3, [batch_size, N, vocab_size], for the "hash" stream).
        seeds: int [batch_size, 2].

    Returns:
        float32 tensor of `shape`: g = -log(-log(u + 1e-9) + 1e-9), u ~ U(0, 1).
    """
    shape = tf.convert_to_tensor(shape, tf.int32)
    if fused.SAMPLING_RNG == "hash":
        return _hash_gumbel_noise(tf.convert_to_tensor(seeds), shape)
    example_shape = shape[1:]
    return seeds_lib.map_examples(
        lambda b, seed: _example_noise(example_shape, seed), seeds,
        fn_output_signature=tf.TensorSpec(None, tf.float32))


def _example_sample(logits, noise, temperature, disallow):
    """argmax over the last axis of (logits / temperature - 1000 * one_hot(disallow)) + noise.

    Args:
        logits: float32 [N, V]. noise: float32 [N, V]. disallow: int [N] or None.

    Returns:
        int32 [N].
    """
    if not (isinstance(temperature, (int, float)) and temperature == 1.0):
        logits = logits / temperature  # official: mlm_logits / temperature before sampling
    scores = logits + noise
    if disallow is not None:
        # Only the disallowed entry of each row changes, so it is recomputed in the official
        # order ((logits - 1000) + noise) and written back, instead of a [N, V] one-hot.
        disallow = tf.cast(disallow, tf.int32)
        index = tf.stack([tf.range(tf.shape(disallow)[0], dtype=tf.int32), disallow], axis=1)
        penalised = (tf.gather_nd(logits, index) - DISALLOW_PENALTY) + tf.gather_nd(noise, index)
        scores = tf.tensor_scatter_nd_update(scores, index, penalised)
    return tf.argmax(scores, axis=-1, output_type=tf.int32)


def sample_ids(
    logits: tf.Tensor,
    *,
    seeds: tf.Tensor,
    temperature: float = 1.0,
    disallow_ids: Optional[tf.Tensor] = None,
    noise: Optional[tf.Tensor] = None,
) -> tf.Tensor:
    """Gumbel-max sample of one id per masked slot (official `sample_from_softmax`, by index).

    sampled = argmax(logits / temperature - 1000 * one_hot(disallow_ids) + g), the same as sampling
    from softmax(logits / temperature) with the disallowed id suppressed. Logits are cast to float32
    first (bfloat16 logits under mixed precision are sampled in float32, as the official does).

    Args:
        logits: float [batch_size, N, vocab_size]. Generator MLM logits.
        seeds: int [batch_size, 2]. One stateless seed per example (ignored if `noise` is given).
        temperature: float or scalar tensor. Official `temperature` (1.0).
        disallow_ids: optional int [batch_size, N]. An id per slot that must not be sampled
            (official `disallow_correct` passes masked_lm_ids).
        noise: optional float32 [batch_size, N, vocab_size] Gumbel noise to use instead of drawing
            it (tests; `gumbel_noise(tf.shape(logits), seeds)` reproduces the drawn noise of the
            current `fused.SAMPLING_RNG`).

    Returns:
        int32 [batch_size, N], wrapped in stop_gradient: the generator gets no gradient through
        its samples.
    """
    logits = tf.cast(logits, tf.float32)
    if noise is None and seeds is not None and fused.SAMPLING_RNG == "hash":
        disallow = (tf.fill(tf.shape(logits)[:2], -1) if disallow_ids is None
                    else tf.cast(disallow_ids, tf.int32))
        scores = _hash_scores(logits, tf.convert_to_tensor(seeds),
                              tf.cast(temperature, tf.float32), disallow)
        return tf.stop_gradient(tf.argmax(scores, axis=-1, output_type=tf.int32))

    def one(b, seed):
        example_logits = logits[b]
        example_noise = (_example_noise(tf.shape(example_logits), seed) if noise is None
                         else tf.cast(noise[b], tf.float32))
        disallow = None if disallow_ids is None else disallow_ids[b]
        return _example_sample(example_logits, example_noise, temperature, disallow)

    if seeds is None:
        if noise is None:
            raise ValueError("sample_ids needs seeds= or noise=")
        seeds = tf.zeros([tf.shape(logits)[0], 2], tf.int64)
    sampled = seeds_lib.map_examples(one, seeds, fn_output_signature=tf.TensorSpec(None, tf.int32))
    # The discrete samples are data for the discriminator, not a differentiable function of the
    # generator: the generator is trained by the MLM loss only.
    return tf.stop_gradient(sampled)


class FakeInputs(NamedTuple):
    """The discriminator's input (official `FakedData`, with ids instead of one-hots).

    Attributes:
        input_ids: int32 [batch_size, seq_length]. Original ids with the samples written at all
            used masked positions.
        is_fake: int32 [batch_size, seq_length]. Replaced-token-detection labels.
        sampled_ids: int32 [batch_size, N]. The generator samples, one per slot.
    """

    input_ids: tf.Tensor
    is_fake: tf.Tensor
    sampled_ids: tf.Tensor


def make_fake_inputs(
    masked: MaskedInputs,
    mlm_logits: tf.Tensor,
    *,
    seeds: tf.Tensor,
    temperature: float = 1.0,
    disallow_correct: bool = False,
    electric_objective: bool = False,
    noise: Optional[tf.Tensor] = None,
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
        seeds: int [batch_size, 2]. Per-example sampling seeds.
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
        seeds=seeds,
        temperature=temperature,
        disallow_ids=masked.masked_lm_ids if disallow_correct else None,
        noise=noise,
    )
    updated_ids, updated = scatter_update(original_ids, sampled, masked.masked_lm_positions)
    if electric_objective:
        is_fake = updated
    else:
        is_fake = updated * tf.cast(tf.not_equal(updated_ids, original_ids), tf.int32)
    return FakeInputs(input_ids=updated_ids, is_fake=is_fake, sampled_ids=sampled)
