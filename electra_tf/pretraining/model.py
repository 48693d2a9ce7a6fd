"""The ELECTRA pretraining model: masking, generator, sampling, discriminator and the joint loss.

This mirrors `PretrainingModel.__init__` of the official `run_pretraining.py` top to bottom:

1. mask the batch (dynamic: new positions every call, from the step seed);
2. run the generator on the masked ids and compute masked-LM logits at the masked positions only;
3. sample replacements by Gumbel-max (no gradient), write them into the original ids;
4. run the discriminator on the corrupted ids and label every token original / replaced;
5. total = gen_weight * MLM + disc_weight * RTD (float32 even under a mixed-precision policy).

Generator and discriminator share the whole embedding block (the same `ElectraEmbeddings` object),
and the generator's MLM head is tied to the shared word-embedding table. With `embedding_sharing`
"gdes" (DeBERTaV3) the discriminator reads the block as stop_gradient(block) + its own deltas
(`DisentangledEmbeddings`), so only the generator's loss updates the block.

Randomness comes from an explicit `seed` (a [2] int tensor, normally derived from the global step)
expanded into per-example seeds keyed by each example's index in the global batch, so the masks and
samples of an example do not depend on how the global batch is split across replicas.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Union

import keras
from keras import ops

from electra_tf.config import PretrainingConfig, generator_checks
from electra_tf.config.model_config import ModelConfig, get_bert_config, get_generator_config
from electra_tf.modeling import deferred_init
from electra_tf.modeling.embeddings import DisentangledEmbeddings, ElectraEmbeddings
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.modeling.heads import GeneratorHead
from electra_tf.pretraining import losses, masking, metrics, sampling, tensor_ops, whole_word
from electra_tf.pretraining.encoder_interface import (encoder_width, sequence_output,
                                                      word_embedding_table)
from electra_tf.pretraining.layers import (ElectraDiscriminatorOutput, ElectraFakeData,
                                           ElectraMasking, batch_size_of, masked_inputs, step_seed)
from electra_tf.pretraining.masking import MaskingOptions
from electra_tf.pretraining.temperature import temperature_at
from electra_tf.vocab import SpecialTokens

# Names of the encoders and heads; they follow the official variable scopes (§5.9) so checkpoint
# conversion can map names mechanically.
DISCRIMINATOR_NAME = "electra"
GENERATOR_NAME = "generator"
GENERATOR_HEAD_NAME = "generator_predictions"
DISCRIMINATOR_HEAD_NAME = "discriminator_predictions"
# A batch holding this key is already masked (e.g. by `ElectraMasking` in tf.data).
PREMASKED_KEY = "masked_lm_positions"


@keras.saving.register_keras_serializable(package="electra_tf")
class PretrainingModel(keras.Model):
    """Generator + discriminator trained jointly with the replaced-token-detection objective.

    Args:
        discriminator_config: dict. `ModelConfig` fields of the discriminator (the model users keep;
            with `electra_objective=False` it is the MLM model).
        generator_config: dict or None. `ModelConfig` fields of the separate generator; None when
            there is none (uniform generator, MLM-only, or `untied_generator=False`).
        special_tokens: dict. `SpecialTokens` fields (`pad_id`, `unk_id`, `cls_id`, `sep_id`,
            `mask_id`) of the vocab the data was built with.
        masking_options: `masking.MaskingOptions` (or a dict of its fields, as `get_config`
            writes it; None: the defaults): the masking strategy (`masking`: "random" official,
            "whole_word"), `mask_prob`, `max_predictions_per_seq` (N, the masked slots per
            example), `mask_with_replacement` and the vocab's `continuation_ids` (the words of
            "whole_word": `whole_word.continuation_ids(vocab.tokens)`). The masking layer takes
            them whole.
        electra_objective: bool. False trains only the masked LM (BERT with dynamic masking).
        uniform_generator: bool. Replace tokens uniformly at random (no generator network).
        untied_generator: bool. False uses the discriminator itself as the generator (all
            transformer weights shared).
        untied_generator_embeddings: bool. Give the generator its own embedding block instead of
            sharing the discriminator's.
        embedding_sharing: str. How a shared block is shared: "tied" (official, the same
            variables) or "gdes" (DeBERTaV3's gradient-disentangled sharing: the discriminator
            reads stop_gradient(block) + zero-initialised deltas, `DisentangledEmbeddings`; the
            block is updated by the generator's loss alone). "gdes" needs the official
            generator network sharing the block (no custom encoders).
        disallow_correct: bool. Never sample the original token.
        temperature: float. Generator sampling temperature (the curriculum's end value).
        frozen_generator: bool. The generator (encoder and MLM head) is a fixed pretrained
            sampler (two-stage training's stage 2; Fast-ELECTRA's `frozen_generator_dir`): it
            has an embedding block of its own (whatever `untied_generator_embeddings` says; its
            width is the generator config's), no trainable variables, and its logits are cut
            from the gradient, so no backward pass runs through it. The MLM loss is still
            computed (a logged metric; `gen_weight` scales a constant in `total_loss`).
        temperature_start: optional float. The temperature curriculum's T0 (Fast-ELECTRA,
            `pretraining.temperature`): training calls sample at T(global step), going from
            `temperature_start` to `temperature` over `temperature_decay_steps`; None: off.
        temperature_decay_steps: int. The curriculum's length (required with it).
        temperature_schedule: str. The curriculum's shape: "linear", "cosine", "exponential".
        gen_weight: float. Weight of the MLM loss.
        disc_weight: float. Weight of the RTD loss.
        seed: int. The run seed: step t of `fit()` masks and samples from (seed, t), evaluation
            batch i from (seed, 2^31 - 1 - i) (`seeds.eval_seed`), a call without `seed` from
            (seed, 0).
        discriminator_encoder: optional Keras layer used instead of the official encoder: an
            electra-tf `ElectraEncoder`, a keras-hub backbone (e.g. `ElectraBackbone`,
            `BertBackbone`), or any layer mapping {input_ids, input_mask, segment_ids} to hidden
            states (a tensor or a dict with `sequence_output`) that exposes its word-embedding
            table (see `word_embedding_table`) and width (`hidden_size` / `hidden_dim`).
        generator_encoder: optional Keras layer for the generator, same contract. The MLM head
            is tied to its word-embedding table. Sharing embeddings between two custom encoders
            is up to the caller, and does not survive `get_config` (each is serialized alone).
        vocab_padding_multiple: int. Speed option (issue 45; 1 = off, the default): the MLM
            head projects onto the vocabulary padded to a multiple of this many rows (128: a
            GPU-friendly matmul), its padded columns masked with `heads.PADDED_LOGIT`; the loss,
            argmax and Gumbel sampling run over the padded columns, which never win (under the
            "hash" sampling stream: the same noise per real column, so the same samples; under
            TensorFlow's "philox" stream the pad columns are sliced off first). Variables and
            checkpoints are unchanged; the losses equal the unpadded ones to float32 rounding.
        fused_attention: bool. Speed option (issue 45; default off): the encoders this model
            builds compute the attention core with `keras.ops.dot_product_attention` (cuDNN
            flash attention on a GPU under JAX); it has no dropout on the attention
            probabilities, so it requires `attention_probs_dropout_prob` 0 in both encoder
            configs (`TransformerLayer`); refused with custom encoders.

    Layers: `masking` (`ElectraMasking`), the generator and its `generator_head`, `fake_data`
    (`ElectraFakeData`), the discriminator and `discriminator_output`
    (`ElectraDiscriminatorOutput`, whose head is `discriminator_head`).

    Training: `run_pretraining.py`'s loop (training/tf/trainer.py) calls it; Keras' `compile()` /
    `fit()` / `evaluate()` are `training.pretrainer.ElectraPretrainer`'s, this model with the
    trainer's step (training/ builds on this module, never the other way).

    Call args:
        inputs: dict of int32 [batch_size, seq_length] tensors `input_ids`, `input_mask`,
            `segment_ids`; or a batch already masked by `ElectraMasking` (it holds
            `masked_lm_positions`), which is then used as it is.
        seed: int tensor [2] (the step's seed; the same on every replica), a scalar step
            (folded with the `seed` argument) or None.
        training: bool. Enables dropout.
        example_offset: optional global index of the first example (default: this replica's).
        loss_denominators: optional dict {"masked_lm_loss", "disc_loss"} of float32 weight
            sums to divide the losses by instead of this batch's (gradient accumulation: the
            whole step's, `loss_weight_sums`).

    Returns:
        A dict: `total_loss`, `masked_lm_loss`, `disc_loss` (float32 scalars; 0 for disc_loss
        without a discriminator), each this replica's contribution to the global-batch value (sum
        them over replicas to get the loss of the global batch), and `metric_inputs`, the official
        `eval_fn_inputs` dict that `PretrainingMetrics.update_state` takes.
    """

    def __init__(self, discriminator_config: Optional[Mapping[str, Any]],
                 generator_config: Optional[Mapping[str, Any]], special_tokens: Mapping[str, int],
                 masking_options: Union[MaskingOptions, Mapping[str, Any], None] = None,
                 electra_objective: bool = True, uniform_generator: bool = False,
                 untied_generator: bool = True, untied_generator_embeddings: bool = False,
                 embedding_sharing: str = "tied", disallow_correct: bool = False,
                 temperature: float = 1.0, frozen_generator: bool = False,
                 temperature_start: Optional[float] = None,
                 temperature_decay_steps: Optional[int] = None,
                 temperature_schedule: str = "linear",
                 gen_weight: float = 1.0, disc_weight: float = 50.0, seed: int = 0,
                 discriminator_encoder: Optional[keras.layers.Layer] = None,
                 generator_encoder: Optional[keras.layers.Layer] = None,
                 vocab_padding_multiple: int = 1, fused_attention: bool = False, **kwargs):
        super().__init__(**kwargs)
        if fused_attention and (discriminator_encoder is not None
                                or generator_encoder is not None):
            raise ValueError("fused_attention applies to the encoders PretrainingModel builds; "
                             "give custom encoders their own attention instead")
        needs_generator = electra_objective and untied_generator and not uniform_generator
        _check_encoders(needs_generator, discriminator_config, generator_config,
                        discriminator_encoder, generator_encoder, embedding_sharing,
                        untied_generator_embeddings, frozen_generator)
        generator_checks.check_model_variants(
            needs_generator, electra_objective and not uniform_generator, frozen_generator,
            temperature_start, temperature_decay_steps, temperature_schedule)
        # === Config ===
        self.discriminator_config = dict(discriminator_config) if discriminator_config else None
        self.generator_config = dict(generator_config) if needs_generator and generator_config else None
        self.special_tokens = dict(special_tokens)
        self.masking_options = MaskingOptions.of(masking_options)
        self.electra_objective = electra_objective
        self.uniform_generator = uniform_generator
        self.untied_generator = untied_generator
        self.untied_generator_embeddings = untied_generator_embeddings
        self.embedding_sharing = embedding_sharing
        self.disallow_correct = disallow_correct
        self.temperature = temperature
        self.frozen_generator = frozen_generator
        self.temperature_start = temperature_start
        self.temperature_decay_steps = temperature_decay_steps
        self.temperature_schedule = temperature_schedule
        self.gen_weight = gen_weight
        self.disc_weight = disc_weight
        self.seed = seed
        self.discriminator_encoder = discriminator_encoder
        self.generator_encoder = generator_encoder if needs_generator else None
        self.vocab_padding_multiple = vocab_padding_multiple
        self.fused_attention = fused_attention
        self._special = SpecialTokens(**self.special_tokens)

        # === Layers ===
        self.masking = ElectraMasking(self.special_tokens, self.masking_options, seed=seed,
                                      name="masking")
        self._build_encoders(needs_generator)
        self._build_heads()
        if frozen_generator:
            # No trainable variables: no gradient, optimizer slot or weight decay reaches them,
            # from construction on (trainability is not part of a checkpoint).
            self.generator.trainable = False
            self.generator_head.trainable = False

    def _build_encoders(self, needs_generator: bool) -> None:
        # The discriminator (or, MLM-only, the one masked-LM encoder) owns the embedding block.
        if self.discriminator_encoder is not None:
            self.discriminator = self.discriminator_encoder
        elif self.embedding_sharing == "gdes":
            # The block is made first, as a tied discriminator makes its own (the same random
            # draws, so the same initial weights), and read through the deltas.
            model_config = ModelConfig(**self.discriminator_config)
            block = ElectraEmbeddings(
                model_config.vocab_size, model_config.embedding_size,
                max_position_embeddings=model_config.max_position_embeddings,
                type_vocab_size=model_config.type_vocab_size,
                hidden_dropout_prob=model_config.hidden_dropout_prob,
                initializer_range=model_config.initializer_range, name="embeddings")
            self.discriminator = ElectraEncoder.from_model_config(
                model_config, embeddings=DisentangledEmbeddings(block, name="disentangled_embeddings"),
                name=DISCRIMINATOR_NAME, **self._encoder_options())
        else:
            self.discriminator = ElectraEncoder.from_model_config(
                ModelConfig(**self.discriminator_config), name=DISCRIMINATOR_NAME,
                **self._encoder_options())
        self.generator = None
        if self.generator_encoder is not None:
            self.generator = self.generator_encoder
        elif needs_generator:
            # Official default: the generator reads the discriminator's embedding block (the same
            # variables); untied_generator_embeddings gives it its own block at its own width.
            # A frozen generator never shares: the discriminator's training would move it.
            own = self.untied_generator_embeddings or self.frozen_generator
            shared = None if own else self.shared_embeddings
            self.generator = ElectraEncoder.from_model_config(
                ModelConfig(**self.generator_config), embeddings=shared, name=GENERATOR_NAME,
                **self._encoder_options())

    def _encoder_options(self) -> dict:
        """The speed options of the encoders built here (none by default: the constructor's
        defaults, so configs and checkpoints stay as without them)."""
        return {"fused_attention": True} if self.fused_attention else {}

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
                hidden_act=hidden_act, initializer_range=initializer_range,
                vocab_padding_multiple=self.vocab_padding_multiple, name=GENERATOR_HEAD_NAME)
        self.fake_data = self.discriminator_output = self.discriminator_head = None
        if self.electra_objective:
            self.fake_data = ElectraFakeData(temperature=self.temperature,
                                             disallow_correct=self.disallow_correct,
                                             seed=self.seed, name="fake_data")
            self.discriminator_output = ElectraDiscriminatorOutput(
                hidden_size=encoder_width(self.discriminator), hidden_act=hidden_act,
                initializer_range=initializer_range, name="discriminator_output")
            # The head under its official name: exports, converters and checkpoints use it.
            self.discriminator_head = self.discriminator_output.head

    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_pretraining_config(cls, config: PretrainingConfig, special_tokens: SpecialTokens,
                                vocab_tokens: Optional[Sequence[str]] = None,
                                vocab_kind: str = "wordpiece",
                                **kwargs) -> "PretrainingModel":
        """Builds the model the official way from a resolved `PretrainingConfig`.

        Args:
            config: PretrainingConfig.
            special_tokens: SpecialTokens of the vocab.
            vocab_tokens: the vocab's tokens; with `masking: whole_word` they define the words
                (without them the model builds, but training calls fail).
            vocab_kind: `Vocab.kind` of those tokens ("wordpiece" or "sentencepiece"): how
                their words are marked (`whole_word.continuation_ids`).
            **kwargs: more constructor arguments (they win over the config's speed options,
                `vocab_padding_multiple` and `fused_attention`).
        """
        continuation = None
        if masking.strategy_of(config.masking).needs_word_starts and vocab_tokens is not None:
            continuation = whole_word.continuation_ids(vocab_tokens, vocab_kind, special_tokens)
        kwargs.setdefault("masking_options", MaskingOptions(
            masking=config.masking, mask_prob=config.mask_prob,
            max_predictions_per_seq=config.max_predictions_per_seq,
            mask_with_replacement=config.mask_with_replacement, continuation_ids=continuation))
        # The speed options (issue 45) are hparams; keyword arguments still override them
        # (benchmarks/gpu_step.py's --model-variants).
        kwargs.setdefault("vocab_padding_multiple", config.vocab_padding_multiple)
        kwargs.setdefault("fused_attention", config.fused_attention)
        bert = get_bert_config(config)
        generator = None
        if config.electra_objective and config.untied_generator and not config.uniform_generator:
            generator = get_generator_config(config, bert).to_dict()
        return cls(
            discriminator_config=bert.to_dict(), generator_config=generator,
            special_tokens=special_tokens._asdict(), electra_objective=config.electra_objective,
            uniform_generator=config.uniform_generator, untied_generator=config.untied_generator,
            untied_generator_embeddings=config.untied_generator_embeddings,
            embedding_sharing=config.embedding_sharing,
            disallow_correct=config.disallow_correct, temperature=config.temperature,
            frozen_generator=bool(config.two_stage_generator_dir or config.frozen_generator_dir),
            temperature_start=config.temperature_start,
            temperature_decay_steps=(generator_checks.decay_steps(config)
                                     if config.temperature_start is not None else None),
            temperature_schedule=config.temperature_schedule,
            gen_weight=config.gen_weight, disc_weight=config.disc_weight, seed=config.seed,
            **kwargs)

    @property
    def shared_embeddings(self) -> ElectraEmbeddings:
        """The embedding block the generator reads (the discriminator's own; under GDES the block
        its `DisentangledEmbeddings` reads through its deltas)."""
        embeddings = self.discriminator.embeddings
        return embeddings.shared if isinstance(embeddings, DisentangledEmbeddings) else embeddings

    def exported_discriminator(self) -> ElectraEncoder:
        """The discriminator encoder with embeddings of its own (`with_merged_embeddings`): under
        GDES a copy whose block holds stop_gradient(block) + delta, what every export writes."""
        if not isinstance(self.discriminator, ElectraEncoder):
            return self.discriminator  # a custom encoder (never GDES)
        return self.discriminator.with_merged_embeddings()

    def generator_variables(self) -> list:
        """The trainable variables the generator's optimizer updates (`decoupled_optimizers`).

        The generator encoder and its MLM head; the shared embedding block too under GDES, where
        the generator's loss alone updates it. Tied (official sharing), the block belongs to the
        discriminator's side, as its variables do (`electra/embeddings`): both losses update it.
        Everything else (the discriminator, its head, the GDES deltas) is the discriminator's.
        """
        if self.generator is None or self.generator_head is None:
            return []
        variables = list(self.generator.trainable_variables) + list(self.generator_head.trainable_variables)
        if self.embedding_sharing != "gdes" and not self.untied_generator_embeddings:
            block = {id(v) for v in self.shared_embeddings.trainable_variables}
            variables = [v for v in variables if id(v) not in block]
        return variables

    @property
    def mlm_encoder(self) -> ElectraEncoder:
        """The encoder the masked LM runs on (generator, or the discriminator when tied/MLM-only)."""
        return self.generator if self.generator is not None else self.discriminator

    def _mlm_logits(self, masked: masking.MaskedInputs, training):
        """Masked-LM logits [B, N, V] at the masked positions only ([B, N, V_padded] under
        `vocab_padding_multiple` with the "hash" sampling stream: pad columns PADDED_LOGIT)."""
        if self.uniform_generator:
            # Official: all-zero logits; the loss is the constant log V, with no gradient.
            positions = masked.masked_lm_positions
            return ops.zeros((batch_size_of(positions), positions.shape[1], self.vocab_size),
                             "float32")
        encoder = self.mlm_encoder
        hidden = sequence_output(encoder, masked.input_ids, masked.input_mask, masked.segment_ids,
                                 training)
        # Gather before the head: the vocab projection runs on N positions, not all L.
        hidden = tensor_ops.gather_positions(hidden, masked.masked_lm_positions)
        # The "philox" stream (TensorFlow only) draws its noise by shape: it samples unpadded.
        padded = self.vocab_padding_multiple > 1 and sampling.sampling_rng() == "hash"
        logits = self.generator_head(hidden, word_embedding_table(encoder), padded_logits=padded)
        # A frozen generator is a fixed sampler: nothing is differentiated through it.
        return ops.stop_gradient(logits) if self.frozen_generator else logits

    def sampling_temperature(self, step=None):
        """The generator's sampling temperature (float32 scalar) at global step `step`.

        `temperature` without a curriculum, or for `step` None (evaluation samples at the
        curriculum's end value, so every checkpoint is evaluated alike); else
        `temperature.temperature_at(step)` from `temperature_start` to `temperature`.
        """
        if self.temperature_start is None or step is None:
            return ops.convert_to_tensor(self.temperature, "float32")
        return temperature_at(
            step, start=self.temperature_start, end=self.temperature,
            decay_steps=self.temperature_decay_steps, schedule=self.temperature_schedule)

    def call(self, inputs, seed=None, training=None, example_offset=None,
             loss_denominators=None):
        seed = step_seed(seed, self.seed)
        if PREMASKED_KEY in inputs:
            masked = masked_inputs({k: ops.cast(v, "float32" if k == "masked_lm_weights" else "int32")
                                    for k, v in inputs.items() if k in masking.MaskedInputs._fields})
        else:
            masked = masked_inputs(self.masking(inputs, seed=seed, example_offset=example_offset))
        denominators = loss_denominators or {}
        mlm_logits = self._mlm_logits(masked, training)
        mlm = losses.mlm_loss(mlm_logits, masked.masked_lm_ids, masked.masked_lm_weights,
                              denominator=denominators.get("masked_lm_loss"))
        total = self.gen_weight * mlm.loss
        fake = rtd = None
        disc_loss = ops.zeros((), "float32")
        if self.electra_objective:
            # The curriculum reads the global step from the step seed ([run seed, step]), a
            # tensor of the compiled step: never a constant baked in when it was traced.
            curriculum = {} if self.temperature_start is None else {
                "temperature": self.sampling_temperature(seed[1] if training else None)}
            faked = self.fake_data(masked._asdict(), mlm_logits, seed=seed,
                                   example_offset=example_offset, **curriculum)
            fake = sampling.FakeInputs(**{k: faked[k] for k in sampling.FakeInputs._fields})
            hidden = sequence_output(self.discriminator, fake.input_ids, masked.input_mask,
                                     masked.segment_ids, training)
            disc = self.discriminator_output(hidden, fake.is_fake, masked.input_mask,
                                             denominator=denominators.get("disc_loss"))
            rtd = losses.RTDLoss(**{k: disc[k] for k in losses.RTDLoss._fields})
            disc_loss = rtd.loss
            total = total + self.disc_weight * disc_loss
        return {
            "total_loss": total,
            "masked_lm_loss": mlm.loss,
            "disc_loss": disc_loss,
            "metric_inputs": metrics.metric_inputs(masked, mlm, fake, rtd),
        }

    def mask(self, inputs, seed=None, example_offset=None) -> Dict[str, Any]:
        """The masked batch `call` would train on (`ElectraMasking`, with this model's seed)."""
        return self.masking(inputs, seed=step_seed(seed, self.seed), example_offset=example_offset)

    def loss_weight_sums(self, masked: Mapping[str, Any]) -> Dict[str, Any]:
        """Global (all-replica) loss weight sums of a masked batch: the `loss_denominators` that
        make its slices' losses add up to the whole batch's (gradient accumulation)."""
        return {"masked_lm_loss": losses.weight_sum(masked["masked_lm_weights"]),
                "disc_loss": losses.weight_sum(masked["input_mask"])}

    def build_from_sequence_length(self, seq_length: int = 8) -> None:
        """Creates every variable by running one tiny eval-mode call (needed before restoring);
        on JAX the call runs on shapes only, its variables initialized in a few compiled calls
        (`deferred_init.build_by_shapes`: the same values, without an eager forward pass)."""
        def call():
            dummy = ops.ones((1, seq_length), "int32")
            self({"input_ids": dummy * self._special.cls_id, "input_mask": dummy,
                  "segment_ids": dummy * 0}, seed=ops.zeros((2,), "int32"), training=False)

        deferred_init.build_by_shapes(call)

    # === Config ===
    def get_config(self):
        config = super().get_config()
        config.update({
            "discriminator_config": self.discriminator_config,
            "generator_config": self.generator_config,
            "special_tokens": self.special_tokens,
            "masking_options": self.masking_options.to_dict(),
            "electra_objective": self.electra_objective,
            "uniform_generator": self.uniform_generator,
            "untied_generator": self.untied_generator,
            "untied_generator_embeddings": self.untied_generator_embeddings,
            "embedding_sharing": self.embedding_sharing,
            "disallow_correct": self.disallow_correct,
            "temperature": self.temperature,
            "frozen_generator": self.frozen_generator,
            "temperature_start": self.temperature_start,
            "temperature_decay_steps": self.temperature_decay_steps,
            "temperature_schedule": self.temperature_schedule,
            "gen_weight": self.gen_weight,
            "disc_weight": self.disc_weight,
            "seed": self.seed,
            "discriminator_encoder": _serialize(self.discriminator_encoder),
            "generator_encoder": _serialize(self.generator_encoder),
            "vocab_padding_multiple": self.vocab_padding_multiple,
            "fused_attention": self.fused_attention,
        })
        return config

    @classmethod
    def from_config(cls, config):
        # A config saved before MaskingOptions holds the options one by one
        # (masking.upgrade_config).
        config = masking.upgrade_config(config)
        for key in ("discriminator_encoder", "generator_encoder"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


def _serialize(layer):
    return None if layer is None else keras.saving.serialize_keras_object(layer)


def _check_encoders(needs_generator: bool, discriminator_config, generator_config,
                    discriminator_encoder, generator_encoder, embedding_sharing: str,
                    untied_generator_embeddings: bool, frozen_generator: bool) -> None:
    """`PretrainingModel`'s checks of where its encoders come from and how they share the
    embedding block (`needs_generator`: it has a generator network).

    Raises:
        ValueError: a needed encoder has neither a config nor a layer, or `embedding_sharing` is
            unknown or "gdes" without a generator network sharing the discriminator's block.
    """
    if needs_generator and generator_config is None and generator_encoder is None:
        raise ValueError("a generator (generator_config or generator_encoder) is required with "
                         "electra_objective, untied_generator and not uniform_generator")
    if discriminator_config is None and discriminator_encoder is None:
        raise ValueError("give discriminator_config or discriminator_encoder")
    if embedding_sharing not in ("tied", "gdes"):
        raise ValueError(f"embedding_sharing must be 'tied' or 'gdes', got {embedding_sharing!r}")
    if embedding_sharing == "gdes" and (
            not needs_generator or untied_generator_embeddings or frozen_generator
            or discriminator_encoder is not None or generator_encoder is not None):
        raise ValueError("embedding_sharing='gdes' needs a generator network sharing the "
                         "discriminator's embeddings (electra_objective, untied_generator, "
                         "no uniform_generator, no untied_generator_embeddings, no custom "
                         "encoders, no frozen_generator)")
