"""The ELECTRA pretraining model: masking, generator, sampling, discriminator and the joint loss.

This mirrors `PretrainingModel.__init__` of the official `run_pretraining.py` top to bottom:

1. mask the batch (dynamic: new positions every call, from the step seed);
2. run the generator on the masked ids and compute masked-LM logits at the masked positions only;
3. sample replacements by Gumbel-max (no gradient), write them into the original ids;
4. run the discriminator on the corrupted ids and label every token original / replaced;
5. total = gen_weight * MLM + disc_weight * RTD (float32 even under a mixed-precision policy).

Generator and discriminator share the whole embedding block (the same `ElectraEmbeddings` object),
and the generator's MLM head is tied to the shared word-embedding table.

Randomness comes from an explicit `seed` (a [2] int tensor, normally derived from the global step)
expanded into per-example seeds keyed by each example's index in the global batch, so the masks and
samples of an example do not depend on how the global batch is split across replicas.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import keras
import keras_hub
import tensorflow as tf

from electra_tf.config import (ModelConfig, PretrainingConfig, get_bert_config,
                               get_generator_config)
from electra_tf.modeling.embeddings import ElectraEmbeddings
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import DiscriminatorHead, GeneratorHead
from electra_tf.pretraining import losses, masking, metrics, sampling, seeds, tensor_ops
from electra_tf.vocab import SpecialTokens

# Names of the encoders and heads; they follow the official variable scopes (§5.9) so checkpoint
# conversion can map names mechanically.
DISCRIMINATOR_NAME = "electra"
GENERATOR_NAME = "generator"
GENERATOR_HEAD_NAME = "generator_predictions"
DISCRIMINATOR_HEAD_NAME = "discriminator_predictions"


class ElectraPretrainer(keras.Model):
    """Generator + discriminator trained jointly with the replaced-token-detection objective.

    Args:
        discriminator_config: dict. `ModelConfig` fields of the discriminator (the model users keep;
            with `electra_objective=False` it is the MLM model).
        generator_config: dict or None. `ModelConfig` fields of the separate generator; None when
            there is none (uniform generator, MLM-only, or `untied_generator=False`).
        special_tokens: dict. `SpecialTokens` fields (`pad_id`, `unk_id`, `cls_id`, `sep_id`,
            `mask_id`) of the vocab the data was built with.
        mask_prob: float. Fraction of real tokens selected for masking.
        max_predictions_per_seq: int. N, the number of masked slots per example.
        electra_objective: bool. False trains only the masked LM (BERT with dynamic masking).
        uniform_generator: bool. Replace tokens uniformly at random (no generator network).
        untied_generator: bool. False uses the discriminator itself as the generator (all
            transformer weights shared).
        untied_generator_embeddings: bool. Give the generator its own embedding block instead of
            sharing the discriminator's.
        disallow_correct: bool. Never sample the original token.
        temperature: float. Generator sampling temperature.
        gen_weight: float. Weight of the MLM loss.
        disc_weight: float. Weight of the RTD loss.
        mask_with_replacement: bool. Draw masked positions with replacement (official).
        discriminator_encoder: optional Keras layer used instead of the official encoder: an
            electra-tf `ElectraEncoder`, a keras-hub backbone (e.g. `ElectraBackbone`,
            `BertBackbone`), or any layer mapping {input_ids, input_mask, segment_ids} to hidden
            states (a tensor or a dict with `sequence_output`) that exposes its word-embedding
            table (see `word_embedding_table`) and width (`hidden_size` / `hidden_dim`).
        generator_encoder: optional Keras layer for the generator, same contract. The MLM head
            is tied to its word-embedding table. Sharing embeddings between two custom encoders
            is up to the caller, and does not survive `get_config` (each is serialized alone).

    Call args:
        inputs: dict of int32 [batch_size, seq_length] tensors `input_ids`, `input_mask`,
            `segment_ids`.
        seed: int tensor [2]. The step's seed; the same on every replica.
        training: bool. Enables dropout.

    Returns:
        A dict: `total_loss`, `masked_lm_loss`, `disc_loss` (float32 scalars; 0 for disc_loss
        without a discriminator), each this replica's contribution to the global-batch value (sum
        them over replicas to get the loss of the global batch), and `metric_inputs`, the official
        `eval_fn_inputs` dict that `PretrainingMetrics.update_state` takes.
    """

    def __init__(self, discriminator_config: Optional[Mapping[str, Any]],
                 generator_config: Optional[Mapping[str, Any]], special_tokens: Mapping[str, int],
                 mask_prob: float = 0.15, max_predictions_per_seq: int = 19,
                 electra_objective: bool = True, uniform_generator: bool = False,
                 untied_generator: bool = True, untied_generator_embeddings: bool = False,
                 disallow_correct: bool = False,
                 temperature: float = 1.0, gen_weight: float = 1.0, disc_weight: float = 50.0,
                 mask_with_replacement: bool = True,
                 discriminator_encoder: Optional[keras.layers.Layer] = None,
                 generator_encoder: Optional[keras.layers.Layer] = None, **kwargs):
        super().__init__(**kwargs)
        needs_generator = electra_objective and untied_generator and not uniform_generator
        if needs_generator and generator_config is None and generator_encoder is None:
            raise ValueError("a generator (generator_config or generator_encoder) is required with "
                             "electra_objective, untied_generator and not uniform_generator")
        if discriminator_config is None and discriminator_encoder is None:
            raise ValueError("give discriminator_config or discriminator_encoder")
        # === Config ===
        self.discriminator_config = dict(discriminator_config) if discriminator_config else None
        self.generator_config = dict(generator_config) if needs_generator and generator_config else None
        self.special_tokens = dict(special_tokens)
        self.mask_prob = mask_prob
        self.max_predictions_per_seq = max_predictions_per_seq
        self.electra_objective = electra_objective
        self.uniform_generator = uniform_generator
        self.untied_generator = untied_generator
        self.untied_generator_embeddings = untied_generator_embeddings
        self.disallow_correct = disallow_correct
        self.temperature = temperature
        self.gen_weight = gen_weight
        self.disc_weight = disc_weight
        self.mask_with_replacement = mask_with_replacement
        self.discriminator_encoder = discriminator_encoder
        self.generator_encoder = generator_encoder if needs_generator else None
        self._special = SpecialTokens(**self.special_tokens)

        # === Layers ===
        self._build_encoders(needs_generator)
        self._build_heads()

    def _build_encoders(self, needs_generator: bool) -> None:
        # The discriminator (or, MLM-only, the one masked-LM encoder) owns the embedding block.
        if self.discriminator_encoder is not None:
            self.discriminator = self.discriminator_encoder
        else:
            self.discriminator = ElectraEncoder.from_model_config(
                ModelConfig(**self.discriminator_config), name=DISCRIMINATOR_NAME)
        self.generator = None
        if self.generator_encoder is not None:
            self.generator = self.generator_encoder
        elif needs_generator:
            # Official default: the generator reads the discriminator's embedding block (the same
            # variables); untied_generator_embeddings gives it its own block at its own width.
            shared = None if self.untied_generator_embeddings else self.discriminator.embeddings
            self.generator = ElectraEncoder.from_model_config(
                ModelConfig(**self.generator_config), embeddings=shared, name=GENERATOR_NAME)

    def _build_heads(self) -> None:
        head_defaults = ModelConfig(**self.discriminator_config) if self.discriminator_config else None
        hidden_act = head_defaults.hidden_act if head_defaults else "gelu"
        initializer_range = head_defaults.initializer_range if head_defaults else 0.02
        table = word_embedding_table(self.discriminator)
        self.vocab_size = int(table.shape[0])
        self.generator_head = None
        if not self.uniform_generator:
            mlm_table = word_embedding_table(self.mlm_encoder)
            self.generator_head = GeneratorHead(
                embedding_size=int(mlm_table.shape[1]), vocab_size=self.vocab_size,
                hidden_act=hidden_act, initializer_range=initializer_range, name=GENERATOR_HEAD_NAME)
        self.discriminator_head = None
        if self.electra_objective:
            self.discriminator_head = DiscriminatorHead(
                hidden_size=encoder_width(self.discriminator), hidden_act=hidden_act,
                initializer_range=initializer_range, name=DISCRIMINATOR_HEAD_NAME)

    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_pretraining_config(cls, config: PretrainingConfig, special_tokens: SpecialTokens,
                                **kwargs) -> "ElectraPretrainer":
        """Builds the model the official way from a resolved `PretrainingConfig`."""
        bert = get_bert_config(config)
        generator = None
        if config.electra_objective and config.untied_generator and not config.uniform_generator:
            generator = get_generator_config(config, bert).to_dict()
        return cls(
            discriminator_config=bert.to_dict(), generator_config=generator,
            special_tokens=special_tokens._asdict(), mask_prob=config.mask_prob,
            max_predictions_per_seq=config.max_predictions_per_seq,
            electra_objective=config.electra_objective,
            uniform_generator=config.uniform_generator, untied_generator=config.untied_generator,
            untied_generator_embeddings=config.untied_generator_embeddings,
            disallow_correct=config.disallow_correct, temperature=config.temperature,
            gen_weight=config.gen_weight, disc_weight=config.disc_weight,
            mask_with_replacement=config.mask_with_replacement, **kwargs)

    @property
    def mlm_encoder(self) -> ElectraEncoder:
        """The encoder the masked LM runs on (generator, or the discriminator when tied/MLM-only)."""
        return self.generator if self.generator is not None else self.discriminator

    def _mlm_logits(self, masked: masking.MaskedInputs, training) -> tf.Tensor:
        """Masked-LM logits [B, N, V] at the masked positions only."""
        if self.uniform_generator:
            # Official: all-zero logits; the loss is the constant log V, with no gradient.
            shape = tf.shape(masked.masked_lm_positions)
            return tf.zeros([shape[0], shape[1], self.vocab_size], tf.float32)
        encoder = self.mlm_encoder
        hidden = sequence_output(encoder, masked.input_ids, masked.input_mask, masked.segment_ids,
                                 training)
        # Gather before the head: the vocab projection runs on N positions, not all L.
        hidden = tensor_ops.gather_positions(hidden, masked.masked_lm_positions)
        return self.generator_head(hidden, word_embedding_table(encoder))

    def call(self, inputs, seed=None, training=None):
        input_ids = tf.cast(inputs["input_ids"], tf.int32)
        input_mask = tf.cast(inputs["input_mask"], tf.int32)
        segment_ids = tf.cast(inputs["segment_ids"], tf.int32)
        if seed is None:
            seed = tf.constant([0, 0], tf.int64)
        batch_size = tf.shape(input_ids)[0]
        offset = seeds.replica_example_offset(batch_size)

        masked = masking.mask_inputs(
            input_ids, input_mask, segment_ids, special=self._special, mask_prob=self.mask_prob,
            max_predictions_per_seq=self.max_predictions_per_seq,
            seeds=seeds.example_seeds(seed, offset, batch_size, salt=seeds.MASKING_SALT),
            with_replacement=self.mask_with_replacement)
        mlm_logits = self._mlm_logits(masked, training)
        mlm = losses.mlm_loss(mlm_logits, masked.masked_lm_ids, masked.masked_lm_weights)
        total = self.gen_weight * mlm.loss
        fake = rtd = None
        disc_loss = tf.zeros([], tf.float32)
        if self.electra_objective:
            fake = sampling.make_fake_inputs(
                masked, mlm_logits,
                seeds=seeds.example_seeds(seed, offset, batch_size, salt=seeds.SAMPLING_SALT),
                temperature=self.temperature, disallow_correct=self.disallow_correct)
            hidden = sequence_output(self.discriminator, fake.input_ids, input_mask, segment_ids,
                                     training)
            rtd = losses.rtd_loss(self.discriminator_head(hidden), fake.is_fake, input_mask)
            disc_loss = rtd.loss
            total = total + self.disc_weight * disc_loss
        return {
            "total_loss": total,
            "masked_lm_loss": mlm.loss,
            "disc_loss": disc_loss,
            "metric_inputs": metrics.metric_inputs(masked, mlm, fake, rtd),
        }

    def build_from_sequence_length(self, seq_length: int = 8) -> None:
        """Creates every variable by running one tiny eval-mode call (needed before restoring)."""
        dummy = tf.ones([1, seq_length], tf.int32)
        self({"input_ids": dummy * self._special.cls_id, "input_mask": dummy,
              "segment_ids": dummy * 0}, seed=tf.constant([0, 0], tf.int64), training=False)

    # === Config ===
    def get_config(self):
        config = super().get_config()
        config.update({
            "discriminator_config": self.discriminator_config,
            "generator_config": self.generator_config,
            "special_tokens": self.special_tokens,
            "mask_prob": self.mask_prob,
            "max_predictions_per_seq": self.max_predictions_per_seq,
            "electra_objective": self.electra_objective,
            "uniform_generator": self.uniform_generator,
            "untied_generator": self.untied_generator,
            "untied_generator_embeddings": self.untied_generator_embeddings,
            "disallow_correct": self.disallow_correct,
            "temperature": self.temperature,
            "gen_weight": self.gen_weight,
            "disc_weight": self.disc_weight,
            "mask_with_replacement": self.mask_with_replacement,
            "discriminator_encoder": _serialize(self.discriminator_encoder),
            "generator_encoder": _serialize(self.generator_encoder),
        })
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("discriminator_encoder", "generator_encoder"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


def _serialize(layer):
    return None if layer is None else keras.saving.serialize_keras_object(layer)


# ------------------------------------------------------------------------------------------------
# Encoders: electra-tf's own, keras-hub backbones, or any layer mapping token ids to hidden states
# ------------------------------------------------------------------------------------------------
def _is_keras_hub_backbone(encoder) -> bool:
    return isinstance(encoder, keras_hub.models.Backbone)


def sequence_output(encoder, input_ids, input_mask, segment_ids, training) -> tf.Tensor:
    """Runs an encoder and returns its hidden states [batch_size, seq_length, hidden].

    electra-tf encoders and other layers get the official input names (`input_ids`,
    `input_mask`, `segment_ids`); keras-hub backbones get theirs (`token_ids`, `padding_mask`,
    `segment_ids`). The output may be a tensor or a dict holding `sequence_output`.
    """
    if _is_keras_hub_backbone(encoder):
        inputs = {"token_ids": input_ids, "padding_mask": input_mask}
        if "segment_ids" in encoder.input:
            inputs["segment_ids"] = segment_ids
        outputs = encoder(inputs, training=training)
    else:
        outputs = encoder({"input_ids": input_ids, "input_mask": input_mask,
                           "segment_ids": segment_ids}, training=training)
    if isinstance(outputs, Mapping):
        if "sequence_output" not in outputs:
            raise ValueError(f"encoder {encoder.name!r} returned keys {sorted(outputs)}; "
                             "expected 'sequence_output'")
        outputs = outputs["sequence_output"]
    return outputs


def word_embedding_table(encoder):
    """The [vocab_size, embedding_size] input-embedding variable the MLM head is tied to.

    Raises:
        ValueError: the encoder exposes no known word-embedding table.
    """
    embeddings = getattr(encoder, "embeddings", None)
    if isinstance(embeddings, ElectraEmbeddings):
        return embeddings.word_embeddings.embeddings
    token_embedding = getattr(encoder, "token_embedding", None)  # keras-hub backbones
    if token_embedding is not None:
        return token_embedding.embeddings
    raise ValueError(f"cannot find the word-embedding table of encoder {encoder.name!r}: give it "
                     "an `embeddings` (ElectraEmbeddings) or `token_embedding` attribute; the "
                     "generator's MLM head is tied to that table")


def encoder_width(encoder) -> int:
    """Hidden width of an encoder's sequence output."""
    for attribute in ("hidden_size", "hidden_dim"):
        width = getattr(encoder, attribute, None)
        if isinstance(width, int):
            return width
    raise ValueError(f"cannot tell the hidden width of encoder {encoder.name!r}: give it a "
                     "`hidden_size` or `hidden_dim` attribute")
