"""What an official TF1 ELECTRA checkpoint's variable shapes say: its sizes, and the config.

`infer_sizes` reads the network's sizes from the shapes (`CheckpointSizes`); `resolve_config`
turns them, with what the user states, into the PretrainingConfig whose model has those shapes
(the `from-google` import, electra_tf/convert/google.py).
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import Any, Mapping, NamedTuple, Optional, Union

from electra_tf.config import MODELS_DIR, PretrainingConfig
from electra_tf.convert import names
from electra_tf.convert.names import ConversionError, format_shape
from electra_tf.config.hparams import ConfigError, parse_hparams
from electra_tf.config.model_config import MODEL_SIZES, get_bert_config, get_generator_config

_LAYER_RE = re.compile(r"^(electra|generator)/encoder/layer_(\d+)/")


class CheckpointSizes(NamedTuple):
    """Model sizes read off the variable shapes (None where the checkpoint has no such part)."""

    vocab_size: int
    embedding_size: int
    max_position_embeddings: int
    type_vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    generator_hidden_size: Optional[int]
    generator_num_hidden_layers: Optional[int]
    generator_own_embeddings: bool
    has_generator_head: bool
    has_discriminator_head: bool


def _need(shapes: Mapping[str, tuple], name: str, rank: int) -> tuple:
    if name not in shapes:
        first = ", ".join(list(shapes)[:4]) or "none"
        raise ConversionError(f"checkpoint has no variable {name}: not an official ELECTRA checkpoint "
                              f"(its first weights: {first})")
    shape = shapes[name]
    if len(shape) != rank:
        raise ConversionError(f"checkpoint variable {name} has shape {format_shape(shape)}; expected rank {rank}")
    return shape


def _num_layers(shapes: Mapping[str, tuple], scope: str) -> int:
    indices = {int(m.group(2)) for n in shapes for m in [_LAYER_RE.match(n)] if m and m.group(1) == scope}
    return max(indices) + 1 if indices else 0


def infer_sizes(shapes: Mapping[str, tuple]) -> CheckpointSizes:
    """Reads vocab, embedding, hidden and FFN sizes and depths from official variable shapes.

    The number of attention heads cannot be read from shapes: it comes from the config (official
    rule hidden_size // 64, or `model_hparam_overrides`).
    """
    vocab_size, embedding_size = _need(shapes, "electra/embeddings/word_embeddings", 2)
    positions = shapes.get("electra/embeddings/position_embeddings", (512, embedding_size))[0]
    types = shapes.get("electra/embeddings/token_type_embeddings", (2, embedding_size))[0]
    layers = _num_layers(shapes, "electra")
    if not layers:
        raise ConversionError("checkpoint has no electra/encoder/layer_* variables: not an official "
                              "ELECTRA checkpoint")
    hidden = _need(shapes, "electra/encoder/layer_0/attention/self/query/kernel", 2)[1]
    intermediate = _need(shapes, "electra/encoder/layer_0/intermediate/dense/kernel", 2)[1]
    gen_layers = _num_layers(shapes, "generator")
    gen_hidden = None
    if gen_layers:
        gen_hidden = _need(shapes, "generator/encoder/layer_0/attention/self/query/kernel", 2)[1]
    return CheckpointSizes(
        vocab_size=vocab_size, embedding_size=embedding_size, max_position_embeddings=positions,
        type_vocab_size=types, hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=intermediate, generator_hidden_size=gen_hidden,
        generator_num_hidden_layers=gen_layers or None,
        generator_own_embeddings="generator/embeddings/word_embeddings" in shapes,
        has_generator_head=any(names.part_of(n) == names.GENERATOR_HEAD_SCOPE for n in shapes),
        has_discriminator_head=any(names.part_of(n) == names.DISCRIMINATOR_HEAD_SCOPE for n in shapes))


def _model_location(output_dir: str):
    """(model_name, data_dir, explicit model_dir or None) for an output dir DATA_DIR/models/NAME."""
    output_dir = os.path.abspath(output_dir)
    name = os.path.basename(output_dir)
    parent = os.path.dirname(output_dir)
    if os.path.basename(parent) == MODELS_DIR:
        return name, os.path.dirname(parent), None
    return name, parent, output_dir


def resolve_config(sizes: CheckpointSizes, output_dir: str,
                   hparams: Union[None, str, Mapping[str, Any]] = None,
                   model_size: Optional[str] = None) -> (PretrainingConfig, dict):
    """The PretrainingConfig whose model has the checkpoint's shapes, and the hparams giving it.

    What the user states (`model_size`, `--hparams`) is kept as is, so a contradiction shows up as
    a shape mismatch naming the variable. Everything else is inferred, adding only what the
    defaults and size presets do not already reproduce (so `config.json` stays what a user would
    have typed, e.g. `generator_hidden_size` 1.0 for Small++ but the base preset's 0.33333 for a
    1/3 generator): model_size (the official size whose width and depth match, else small with
    `model_hparam_overrides`), vocab_size, embedding_size, hidden/FFN/depth overrides, position and
    type table sizes, generator width and depth fractions, untied generator embeddings, and, for a
    checkpoint with an MLM head but no generator encoder, `untied_generator=false` (or
    `electra_objective=false` without a discriminator head).

    Returns:
        (config, hparams): the resolved config and the hparams dict that builds it.

    Raises:
        ConfigError: the user's hparams are invalid, or contradict `model_size`.
    """
    user = parse_hparams(hparams)
    if model_size is not None:
        if user.get("model_size", model_size) != model_size:
            raise ConfigError(f"--model-size {model_size} contradicts hparam model_size={user['model_size']!r}")
        user["model_size"] = model_size
    model_name, data_dir, model_dir = _model_location(output_dir)
    hp = copy.deepcopy(user)
    if model_dir is not None:
        hp.setdefault("model_dir", model_dir)

    def create(values):
        return PretrainingConfig.create(model_name, data_dir, values)

    overrides = _infer_sizes(sizes, user, hp, create)
    _infer_generator(sizes, user, hp, create)
    if not overrides:
        del hp["model_hparam_overrides"]
    return create(hp), hp


def _infer_sizes(sizes: CheckpointSizes, user: dict, hp: dict, create) -> dict:
    """`resolve_config`'s encoder sizes: sets `hp`'s model_size, vocab_size, embedding_size and
    `model_hparam_overrides` (in place) to the checkpoint's where the user gave none and the
    defaults differ. Returns the overrides (the dict in `hp`)."""
    user_overrides = dict(user.get("model_hparam_overrides", {}))
    overrides = dict(user_overrides)
    hp["model_hparam_overrides"] = overrides
    hp.setdefault("vocab_size", sizes.vocab_size)
    if "model_size" not in user:
        hp["model_size"] = _matching_model_size(sizes)
        hp.setdefault("embedding_size", sizes.embedding_size)
        for keys in (("hidden_size", "num_hidden_layers"), ("intermediate_size",)):
            bert = get_bert_config(create(hp))
            for key in keys:
                if getattr(bert, key) != getattr(sizes, key) and key not in user_overrides:
                    overrides[key] = getattr(sizes, key)
    bert = get_bert_config(create(hp))
    for key in ("max_position_embeddings", "type_vocab_size"):
        if getattr(bert, key) != getattr(sizes, key) and key not in user_overrides:
            overrides[key] = getattr(sizes, key)
    return overrides


def _infer_generator(sizes: CheckpointSizes, user: dict, hp: dict, create) -> None:
    """`resolve_config`'s generator: its width and depth fractions and untied embeddings, or,
    for an MLM head without a generator encoder, `untied_generator` / `electra_objective`
    false (set in `hp`, in place, where the user gave none)."""
    if sizes.generator_hidden_size is not None:
        if sizes.generator_own_embeddings:
            hp.setdefault("untied_generator_embeddings", True)
        config = create(hp)
        bert = get_bert_config(config)
        if config.electra_objective and config.untied_generator and not config.uniform_generator:
            generator = get_generator_config(config, bert)
            if generator.hidden_size != sizes.generator_hidden_size and "generator_hidden_size" not in user:
                hp["generator_hidden_size"] = sizes.generator_hidden_size / bert.hidden_size
            if (generator.num_hidden_layers != sizes.generator_num_hidden_layers
                    and "generator_layers" not in user):
                hp["generator_layers"] = sizes.generator_num_hidden_layers / bert.num_hidden_layers
    elif sizes.has_generator_head:
        # An MLM head on the discriminator itself: official untied_generator=false, or BERT.
        if sizes.has_discriminator_head:
            hp.setdefault("untied_generator", False)
        else:
            hp.setdefault("electra_objective", False)


def _matching_model_size(sizes: CheckpointSizes) -> str:
    """The official size whose hidden width and depth are the checkpoint's, else "small"."""
    for size in MODEL_SIZES:
        bert = get_bert_config(PretrainingConfig.create("probe", "", {"model_size": size}))
        if (bert.hidden_size, bert.num_hidden_layers) == (sizes.hidden_size, sizes.num_hidden_layers):
            return size
    return "small"


def describe_configured_model(config: PretrainingConfig, user: Mapping[str, Any]) -> str:
    """How messages name the model `from-google` built: its model_size and the user's hparams."""
    stated = f", --hparams {json.dumps(user, sort_keys=True)}" if user else ""
    return f"the model configured by model_size={config.model_size}{stated}"
