"""Export to keras-hub (`to-keras-hub`): a `keras_hub.models.ElectraBackbone` preset directory.

Output (keras-hub's own preset layout, written by `Backbone.save_to_preset` and
`Tokenizer.save_to_preset`):

    OUTPUT_DIR/config.json        {"class_name": "ElectraBackbone", "config": {...}, ...}
    OUTPUT_DIR/model.weights.h5   the backbone's weights
    OUTPUT_DIR/metadata.json      keras / keras-hub versions
    OUTPUT_DIR/tokenizer.json + assets/tokenizer/vocabulary.txt   an ElectraTokenizer

Load with `keras_hub.models.ElectraBackbone.from_preset(OUTPUT_DIR)`, or
`ElectraBackbone(**json.load(open("config.json"))["config"])` + `load_weights("model.weights.h5")`.

Mapping (official name -> ElectraBackbone path): word/position/token_type embeddings ->
`token_embedding` / `position_embedding` / `segment_embedding`, embedding LayerNorm ->
`embeddings_layer_norm`, `embeddings_project` -> `embeddings_projection`, and each
`{scope}/encoder/layer_{i}` -> `transformer_layer_{i}` with the same block layout as ours
(`names.LAYER_NAME_MAP`). keras-hub's extra `pooled_dense` (a tanh pooler on token 0, which ELECTRA
does not have) is left as initialised from the model's seed: use `sequence_output`, or fine-tune
the pooler.

Numerical difference: ElectraBackbone hard-codes the tanh-approximate GELU in its feed-forward
layers, while ELECTRA uses the exact erf GELU. `sequence_output` therefore differs slightly from
ours (see docs/conversion.md for the measured size); keras-hub also has one dropout rate (set to
`hidden_dropout_prob`), which matters only in training.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

import keras
import numpy as np

from electra_tf.convert import names
from electra_tf.convert.hf import encoder_scopes
from electra_tf.convert.model_dir import load_model_dir, prepare_output_dir
from electra_tf.convert.names import ConversionError, format_shape
from electra_tf.config.model_config import ModelConfig
from electra_tf.training import run_dir

logger = logging.getLogger("electra_tf")

PARTS = ("discriminator", "generator")
# Files keras-hub's save_to_preset writes.
OUTPUTS = ("config.json", "model.weights.h5", "metadata.json", "tokenizer.json", "assets")

_EMBEDDING_NAMES = {
    "word_embeddings": "token_embedding",
    "position_embeddings": "position_embedding",
    "token_type_embeddings": "segment_embedding",
}


def backbone_kwargs(model_config: ModelConfig) -> dict:
    """`ElectraBackbone` constructor arguments for one of our encoders."""
    if model_config.hidden_act != "gelu":
        raise ConversionError(f"hidden_act {model_config.hidden_act!r}: keras-hub's ElectraBackbone "
                              "only has (tanh-approximate) GELU")
    return {
        "vocab_size": model_config.vocab_size,
        "num_layers": model_config.num_hidden_layers,
        "num_heads": model_config.num_attention_heads,
        "hidden_dim": model_config.hidden_size,
        "embedding_dim": model_config.embedding_size,
        "intermediate_dim": model_config.intermediate_size,
        # One rate for everything in keras-hub; ours has separate hidden/attention rates.
        "dropout": model_config.hidden_dropout_prob,
        "max_sequence_length": model_config.max_position_embeddings,
        "num_segments": model_config.type_vocab_size,
    }


def backbone_entries(backbone, scope: str, embedding_scope: str):
    """(official name, backbone variable, official shape) for every backbone weight except the pooler."""
    entries = []
    for official, attribute in _EMBEDDING_NAMES.items():
        layer = getattr(backbone, attribute)
        variable = layer.position_embeddings if attribute == "position_embedding" else layer.embeddings
        entries.append((f"{embedding_scope}/embeddings/{official}", variable, tuple(variable.shape)))
    norm = backbone.embeddings_layer_norm
    entries += [(f"{embedding_scope}/embeddings/LayerNorm/gamma", norm.gamma, tuple(norm.gamma.shape)),
                (f"{embedding_scope}/embeddings/LayerNorm/beta", norm.beta, tuple(norm.beta.shape))]
    project = getattr(backbone, "embeddings_projection", None)
    if project is not None:
        entries += [(f"{scope}/embeddings_project/kernel", project.kernel, tuple(project.kernel.shape)),
                    (f"{scope}/embeddings_project/bias", project.bias, tuple(project.bias.shape))]
    for i, layer in enumerate(backbone.transformer_layers):
        for entry in names.transformer_layer_entries(layer, f"{scope}/encoder/layer_{i}", scope):
            entries.append((entry.official_name, entry.variable, entry.official_shape))
    return entries


def build_backbone(model_config: ModelConfig, weights: Mapping[str, np.ndarray], part: str = "discriminator",
                   seed: int = 0):
    """An `ElectraBackbone` holding one network's weights from an official-layout dict.

    Args:
        model_config: the network's ModelConfig.
        weights: {official name: array}.
        part: "discriminator" or "generator".
        seed: seeds the initialisation of the pooler (the one weight not converted).

    Raises:
        ConversionError: a weight is missing or has another shape (naming it and both shapes).
    """
    import keras_hub

    if part not in PARTS:
        raise ConversionError(f"--part must be one of {', '.join(PARTS)}, got {part!r}")
    scope, embedding_scope = encoder_scopes(weights, part)
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ElectraBackbone(**backbone_kwargs(model_config), dtype="float32")
    assigned = 0
    for name, variable, shape in backbone_entries(backbone, scope, embedding_scope):
        if name not in weights:
            raise ConversionError(f"the model has no weight {name} for ElectraBackbone {variable.path}")
        value = np.asarray(weights[name], np.float32)
        if tuple(value.shape) != shape:
            raise ConversionError(f"weight {name} has shape {format_shape(value.shape)}, but "
                                  f"ElectraBackbone {variable.path} needs {format_shape(shape)}")
        variable.assign(value.reshape(variable.shape))
        assigned += 1
    expected = len(backbone.weights) - len(backbone.pooled_dense.weights)
    if assigned != expected:
        raise ConversionError(f"internal error: assigned {assigned} of {expected} backbone weights")
    return backbone


def export_keras_hub(model_dir: str, output_dir: str, part: str = "discriminator",
                     checkpoint: Optional[str] = None, overwrite: bool = False) -> str:
    """Writes one network of a model directory as a keras-hub ElectraBackbone preset.

    Returns:
        output_dir.
    """
    import keras_hub

    if part not in PARTS:
        raise ConversionError(f"--part must be one of {', '.join(PARTS)}, got {part!r}")
    prepare_output_dir(output_dir, OUTPUTS, overwrite, create=False)  # before the slow part
    loaded = load_model_dir(model_dir, checkpoint)
    if loaded.vocab.kind != "wordpiece":  # keras-hub's ElectraTokenizer is WordPiece only
        raise ConversionError(f"{model_dir} was trained with a SentencePiece model "
                              f"({loaded.vocab.path}); keras-hub's ElectraTokenizer reads WordPiece "
                              "vocabularies only: export it with to-hf instead")
    model = loaded.model
    if part == "discriminator":
        model_config = ModelConfig(**model.discriminator_config)
    else:
        if model.generator_head is None:
            raise ConversionError("the model has no generator to export")
        model_config = ModelConfig(**(model.generator_config or model.discriminator_config))
    backbone = build_backbone(model_config, names.get_official_weights(model), part, loaded.config.seed)
    os.makedirs(output_dir, exist_ok=True)
    backbone.save_to_preset(output_dir)
    lower = run_dir.tokenization_settings(loaded.config, model_dir).do_lower_case
    # keras-hub's WordPiece lowercases and strips accents together (BERT's behaviour by default).
    tokenizer = keras_hub.tokenizers.ElectraTokenizer(vocabulary=loaded.vocab.path, lowercase=lower)
    tokenizer.save_to_preset(output_dir)
    logger.info("wrote the %s as a keras-hub ElectraBackbone preset to %s (step %d; pooled_dense "
                "left at its seeded initialisation: ELECTRA has no pooler)", part, output_dir, loaded.step)
    return output_dir
