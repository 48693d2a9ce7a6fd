"""The objective's steps as Keras layers: masking, fake data, discriminator output.

Each layer is a thin wrapper over the pure function that implements the behaviour (one
implementation of each): `ElectraMasking` over `masking.mask_inputs` (official `mask()`),
`ElectraFakeData` over `sampling.make_fake_inputs` (official `_get_fake_data`), and
`ElectraDiscriminatorOutput` over `DiscriminatorHead` + `losses.rtd_loss` (official
`_get_discriminator_output`). `PretrainingModel` (pretrainer.py) is composed of them, and they
build the same objective around any encoder, e.g. keras-hub backbones (docs/keras.md).

Randomness: masking and sampling draw from counter-based per-example keys (`seeds.py`,
`electra_tf.modeling.rng`): the same draws on every Keras backend. Call them with the step's
`seed` (an int [2] tensor such as [run seed, step]) or a scalar step (paired with the layer's own
`seed` argument); without one they use [seed, 0], i.e. the same draws on every call. On the
TensorFlow backend they also run inside `tf.data`; number the batches:

    dataset = dataset.repeat().enumerate().map(lambda step, batch: masking(batch, seed=step))

Tensors are dicts keyed by the official names (`input_ids`, `input_mask`, `segment_ids`,
`masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights`).
"""

from __future__ import annotations

from typing import Any, Mapping, Union

import keras
from keras import ops

from electra_tf.modeling import rng
from electra_tf.modeling.heads import DiscriminatorHead
from electra_tf.pretraining import losses, masking, sampling, seeds, whole_word
from electra_tf.vocab import SpecialTokens

MASKED_KEYS = masking.MaskedInputs._fields


def step_seed(seed, base_seed: int):
    """The int32 [2] seed of one call: `seed` itself, [base_seed, seed] for a scalar step, or
    [base_seed, 0] for None. Seeds are taken modulo 2^32 (`rng.int32_bits`)."""
    if seed is None:
        return ops.convert_to_tensor([rng.int32_bits(base_seed), 0], "int32")
    if isinstance(seed, int):
        return ops.convert_to_tensor([rng.int32_bits(base_seed), rng.int32_bits(seed)], "int32")
    seed = ops.convert_to_tensor(seed)
    if len(seed.shape) == 0:
        return ops.stack([ops.convert_to_tensor(rng.int32_bits(base_seed), "int32"),
                          ops.cast(seed, "int32")])
    return ops.cast(seed, "int32")


def example_offset_or_replica(example_offset, batch_size):
    """Global index of the first example: given, or this replica's (`seeds.replica_example_offset`)."""
    if example_offset is None:
        return seeds.replica_example_offset(batch_size)
    return ops.cast(example_offset, "int32")


def batch_size_of(x):
    """The (static if known) batch size of `x`."""
    return x.shape[0] if x.shape[0] is not None else ops.shape(x)[0]


def masked_inputs(values: Mapping[str, object]) -> masking.MaskedInputs:
    """A `MaskedInputs` from a dict with its fields (e.g. `ElectraMasking`'s output)."""
    return masking.MaskedInputs(**{k: values[k] for k in MASKED_KEYS})


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraMasking(keras.layers.Layer):
    """Dynamic masked-LM masking (official `pretrain_helpers.mask`, `masking.mask_inputs`).

    Per example: k = max(1, min(N, round_half_even(n * mask_prob))) slots, chosen by the
    `masking` strategy: "random" (official) draws positions uniformly over the real tokens other
    than [CLS], [SEP] and [MASK] (with replacement, as official, unless `mask_with_replacement`
    is False), "whole_word" whole words; 85% of them set to [MASK] and 15% kept. Usable inside a
    model and inside `tf.data` (no variables; see the module docstring for seeds).

    Args:
        special_tokens: dict (or `SpecialTokens`) with `pad_id`, `unk_id`, `cls_id`, `sep_id`,
            `mask_id`.
        masking_options: `masking.MaskingOptions` (or a dict of its fields, as `get_config`
            writes it; None: the defaults, the official masking with N = 19): the strategy,
            `mask_prob`, `max_predictions_per_seq`, `mask_with_replacement` and the vocab's
            `continuation_ids`, which define the words of "whole_word" unless the inputs carry
            `word_starts`.
        seed: int. Base seed for calls given a scalar step or no seed.
        **kwargs: forwarded to `keras.layers.Layer`.

    Call arguments:
        inputs: dict of int [batch_size, seq_length] `input_ids`, `input_mask`, `segment_ids`
            (and optionally bool `word_starts` for whole-word masking).
        seed: None, a scalar step or an int [2] seed.
        example_offset: global index of the first example (default: this replica's offset, 0
            outside a strategy), so an example's mask does not depend on the batch split.

    Returns:
        dict with the official `Inputs` fields after `mask()`: `input_ids` (masked, int32),
        `input_mask`, `segment_ids` (unchanged), `masked_lm_positions`, `masked_lm_ids` (int32
        [batch_size, N]) and `masked_lm_weights` (float32 [batch_size, N]).
    """

    def __init__(self, special_tokens: Mapping[str, int],
                 masking_options: Union[masking.MaskingOptions, Mapping[str, Any], None] = None,
                 seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(special_tokens, SpecialTokens):
            special_tokens = special_tokens._asdict()
        # === Config ===
        self.special_tokens = dict(special_tokens)
        self.masking_options = masking.MaskingOptions.of(masking_options)
        self.seed = seed
        self._special = SpecialTokens(**self.special_tokens)
        self.built = True  # no variables

    def call(self, inputs, seed=None, example_offset=None):
        options = self.masking_options
        input_ids = ops.cast(inputs["input_ids"], "int32")
        batch_size = batch_size_of(input_ids)
        keys = seeds.example_keys(
            step_seed(seed, self.seed), example_offset_or_replica(example_offset, batch_size),
            batch_size, salt=seeds.MASKING_SALT)
        masked = masking.mask_inputs(
            input_ids, ops.cast(inputs["input_mask"], "int32"),
            ops.cast(inputs["segment_ids"], "int32"), special=self._special,
            mask_prob=options.mask_prob, max_predictions_per_seq=options.max_predictions_per_seq,
            keys=keys, with_replacement=options.mask_with_replacement, masking=options.masking,
            word_starts=(self._word_starts(inputs, input_ids)
                         if options.strategy.needs_word_starts else None))
        return masked._asdict()

    def _word_starts(self, inputs, input_ids):
        if "word_starts" in inputs:
            return inputs["word_starts"]
        continuation = self.masking_options.continuation_ids
        if continuation is None:
            raise ValueError(f"{self.name}: masking={self.masking_options.masking!r} needs "
                             "continuation_ids in its masking_options (the vocab's '##' pieces, "
                             "whole_word.continuation_ids(vocab.tokens)) or a `word_starts` input")
        return whole_word.word_starts_from_ids(input_ids, continuation)

    def compute_output_spec(self, inputs, seed=None, example_offset=None):
        shape = tuple(inputs["input_ids"].shape)
        slots = shape[:1] + (self.masking_options.max_predictions_per_seq,)
        spec = {k: keras.KerasTensor(shape, dtype="int32")
                for k in ("input_ids", "input_mask", "segment_ids")}
        spec.update(masked_lm_positions=keras.KerasTensor(slots, dtype="int32"),
                    masked_lm_ids=keras.KerasTensor(slots, dtype="int32"),
                    masked_lm_weights=keras.KerasTensor(slots, dtype="float32"))
        return spec

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({
            "special_tokens": self.special_tokens,
            "masking_options": self.masking_options.to_dict(),
            "seed": self.seed,
        })
        return config

    @classmethod
    def from_config(cls, config):
        # A config saved before MaskingOptions holds the options one by one
        # (masking.upgrade_config).
        return super().from_config(masking.upgrade_config(config))


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraFakeData(keras.layers.Layer):
    """The discriminator's input from the generator's logits (official `_get_fake_data`).

    Gumbel-max samples from softmax(mlm_logits / temperature) (optionally never the original
    id), with no gradient, written into the original ids at every used masked position; labels
    are 1 where a position was replaced by a different token (`sampling.make_fake_inputs`). The
    logits are sampled in float32 whatever the dtype policy (the layer never autocasts them).

    Args:
        temperature: float. Official `temperature` (1.0).
        disallow_correct: bool. Official `disallow_correct`: never sample the original id.
        seed: int. Base seed for calls given a scalar step or no seed.
        **kwargs: forwarded to `keras.layers.Layer`.

    Call arguments:
        masked: dict, the `ElectraMasking` output.
        mlm_logits: float [batch_size, N, vocab_size]. Generator logits at the masked slots.
        seed: None, a scalar step or an int [2] seed (the masking's step seed: the streams are
            salted apart).
        example_offset: as for `ElectraMasking`.
        temperature: optional float32 scalar (a tensor: the temperature curriculum's value at
            this step, `PretrainingModel.sampling_temperature`) instead of `temperature`.

    Returns:
        dict: `input_ids` (int32 [batch_size, seq_length], the discriminator input), `is_fake`
        (int32 [batch_size, seq_length] labels), `sampled_ids` (int32 [batch_size, N]), and the
        unchanged `input_mask` and `segment_ids`.
    """

    def __init__(self, temperature: float = 1.0, disallow_correct: bool = False, seed: int = 0,
                 **kwargs):
        # Logits must reach the sampler in float32: a bfloat16 copy would change the samples.
        kwargs["autocast"] = False
        super().__init__(**kwargs)
        # === Config ===
        self.temperature = temperature
        self.disallow_correct = disallow_correct
        self.seed = seed
        self.built = True  # no variables

    def call(self, masked, mlm_logits, seed=None, example_offset=None, temperature=None):
        batch_size = batch_size_of(masked["input_ids"])
        keys = seeds.example_keys(
            step_seed(seed, self.seed), example_offset_or_replica(example_offset, batch_size),
            batch_size, salt=seeds.SAMPLING_SALT)
        fake = sampling.make_fake_inputs(
            masked_inputs(masked), mlm_logits, keys=keys,
            temperature=self.temperature if temperature is None else temperature,
            disallow_correct=self.disallow_correct)
        return dict(fake._asdict(), input_mask=masked["input_mask"],
                    segment_ids=masked["segment_ids"])

    def compute_output_spec(self, masked, mlm_logits, seed=None, example_offset=None,
                            temperature=None):
        shape = tuple(masked["input_ids"].shape)
        spec = {k: keras.KerasTensor(shape, dtype="int32")
                for k in ("input_ids", "is_fake", "input_mask", "segment_ids")}
        spec["sampled_ids"] = keras.KerasTensor(tuple(mlm_logits.shape[:-1]), dtype="int32")
        return spec

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"temperature": self.temperature, "disallow_correct": self.disallow_correct,
                       "seed": self.seed})
        return config


@keras.saving.register_keras_serializable(package="electra_tf")
class ElectraDiscriminatorOutput(keras.layers.Layer):
    """Replaced-token detection: head, loss, probs, preds (official `_get_discriminator_output`).

    The head (`head`, a `DiscriminatorHead` named "discriminator_predictions", the official
    scope) maps hidden states to one float32 logit per token; the loss is the official token
    mean sum(sigmoid_ce * input_mask) / (sum(input_mask) + 1e-6) over the global batch
    (`losses.rtd_loss`), in float32 under any dtype policy.

    Args:
        hidden_size: int. Width of the discriminator's hidden states.
        hidden_act: str. Activation of the head's first dense layer ("gelu" = exact erf GELU).
        initializer_range: float. Stddev of the head's truncated-normal initializer.
        **kwargs: forwarded to `keras.layers.Layer`.

    Call arguments:
        sequence_output: float [batch_size, seq_length, hidden_size].
        labels: int [batch_size, seq_length]. 1 = replaced (`ElectraFakeData`'s `is_fake`).
        input_mask: int [batch_size, seq_length].
        denominator: optional float32 scalar, the loss weight sum to divide by instead of the
            global sum(input_mask) (gradient accumulation: the whole step's).

    Returns:
        dict: `logits`, `probs` (float32 [batch_size, seq_length]), `preds` (int32, 1 iff
        logit > 0), `labels`, `loss` (float32 scalar: this replica's contribution to the
        global-batch loss) and `per_example_loss` (float32 [batch_size]).
    """

    def __init__(self, hidden_size: int, hidden_act: str = "gelu",
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.hidden_size = hidden_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        # === Layers ===
        self.head = DiscriminatorHead(hidden_size=hidden_size, hidden_act=hidden_act,
                                      initializer_range=initializer_range,
                                      dtype=self.dtype_policy)

    def build(self, sequence_output_shape, labels_shape=None, input_mask_shape=None):
        self.head.build(sequence_output_shape)

    def call(self, sequence_output, labels, input_mask, denominator=None):
        logits = self.head(sequence_output)
        rtd = losses.rtd_loss(logits, labels, input_mask, denominator=denominator)
        return {"logits": logits, "loss": rtd.loss, "per_example_loss": rtd.per_example_loss,
                "probs": rtd.probs, "preds": rtd.preds, "labels": labels}

    def compute_output_spec(self, sequence_output, labels, input_mask, denominator=None):
        shape = tuple(sequence_output.shape[:-1])
        return {"logits": keras.KerasTensor(shape, dtype="float32"),
                "probs": keras.KerasTensor(shape, dtype="float32"),
                "preds": keras.KerasTensor(shape, dtype="int32"),
                "labels": keras.KerasTensor(shape, dtype=labels.dtype),
                "loss": keras.KerasTensor((), dtype="float32"),
                "per_example_loss": keras.KerasTensor(shape[:1], dtype="float32")}

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"hidden_size": self.hidden_size, "hidden_act": self.hidden_act,
                       "initializer_range": self.initializer_range})
        return config

