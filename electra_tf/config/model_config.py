"""Encoder sizes: `ModelConfig` (the official `BertConfig`), the size table and its derivations.

`get_bert_config` turns a `config.PretrainingConfig`'s `model_size`, overrides and `debug` into
the discriminator's sizes the way official `training_utils.get_bert_config` does;
`get_generator_config` derives the generator's by the official fractions.
"""

from __future__ import annotations

import dataclasses
import math

from electra_tf.config.hparams import MAX_INT32, ConfigError

MODEL_SIZES = ("small", "base", "large")

# Official `training_utils.get_bert_config` size table: hidden width and depth. Heads and FFN width
# are derived (hidden // 64 and 4 * hidden).
_SIZE_TABLE = {
    "small": {"hidden_size": 256, "num_hidden_layers": 12},
    "base": {"hidden_size": 768, "num_hidden_layers": 12},
    "large": {"hidden_size": 1024, "num_hidden_layers": 24},
}

# Official debug mode's tiny model (the training part is `config.DEBUG_PRESET`).
DEBUG_MODEL = {
    "num_hidden_layers": 3,
    "hidden_size": 144,
    "intermediate_size": 576,
    "num_attention_heads": 4,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Transformer sizes of one encoder (the official `BertConfig`, plus `embedding_size`).

    Attributes:
        vocab_size: int. Rows of the word-embedding table.
        hidden_size: int. Width H of the transformer.
        num_hidden_layers: int. Number of transformer blocks.
        num_attention_heads: int. Heads per block; must divide hidden_size.
        intermediate_size: int. FFN width.
        embedding_size: int. Width E of the embedding block; a linear E->H projection is added
            when E != H.
        hidden_act: str. FFN activation; "gelu" is the exact (erf) GELU.
        hidden_dropout_prob: float. Dropout on embeddings and residual branches.
        attention_probs_dropout_prob: float. Dropout on attention probabilities.
        max_position_embeddings: int. Rows of the position table.
        type_vocab_size: int. Rows of the token-type table.
        initializer_range: float. Stddev of the truncated-normal initializer.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    embedding_size: int
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "embedding_size", "max_position_embeddings",
                     "type_vocab_size"):
            if not 1 <= getattr(self, name) <= MAX_INT32:
                raise ConfigError(f"model {name} must be in [1, {MAX_INT32}], got "
                                  f"{getattr(self, name)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model {name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.initializer_range < math.inf:
            raise ConfigError(f"model initializer_range must be > 0, got {self.initializer_range}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)



def get_bert_config(config) -> ModelConfig:
    """The discriminator's sizes: official size table, overrides applied twice, debug model.

    Heads and FFN width are derived from the (possibly overridden) hidden size, then the overrides
    are applied again, so overriding hidden_size re-derives heads and FFN unless they are overridden
    too (official `training_utils.get_bert_config`).

    Args:
        config: config.PretrainingConfig. Reads model_size, vocab_size, model_hparam_overrides,
            debug and embedding_size.
    """
    d = dict(_SIZE_TABLE[config.model_size], vocab_size=config.vocab_size)
    d.update(config.model_hparam_overrides)
    d["num_attention_heads"] = max(1, d["hidden_size"] // 64)
    d["intermediate_size"] = 4 * d["hidden_size"]
    d.update(config.model_hparam_overrides)
    if config.debug:
        d.update(DEBUG_MODEL)
    d["embedding_size"] = config.embedding_size or d["hidden_size"]
    return ModelConfig(**d)


def get_generator_config(config, bert_config: ModelConfig) -> ModelConfig:
    """The generator's sizes, derived by the official fractions.

    hidden = round(H * generator_hidden_size), layers = round(layers * generator_layers),
    FFN = 4 * hidden, heads = max(1, hidden // 64). With shared embeddings the generator reads the
    discriminator's embedding block (width E); untied, it has its own at its hidden width.

    Args:
        config: config.PretrainingConfig. Reads generator_hidden_size, generator_layers and
            untied_generator_embeddings.
        bert_config: ModelConfig. The discriminator's sizes (`get_bert_config`).

    Raises:
        ConfigError: the derived generator is empty or its sizes are invalid.
    """
    hidden = int(round(bert_config.hidden_size * config.generator_hidden_size))
    layers = int(round(bert_config.num_hidden_layers * config.generator_layers))
    if hidden < 1 or layers < 1:
        raise ConfigError(
            f"generator would have hidden_size {hidden} and {layers} layers: raise "
            "generator_hidden_size / generator_layers"
        )
    try:
        return _replace_model(bert_config, hidden, layers, config.untied_generator_embeddings)
    except ConfigError as e:
        raise ConfigError(f"generator (derived by generator_hidden_size={config.generator_hidden_size}, "
                          f"generator_layers={config.generator_layers}): {e}") from None


def _replace_model(bert_config: ModelConfig, hidden: int, layers: int, untied_embeddings: bool) -> ModelConfig:
    return dataclasses.replace(
        bert_config,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=4 * hidden,
        num_attention_heads=max(1, hidden // 64),
        embedding_size=hidden if untied_embeddings else bert_config.embedding_size,
    )
