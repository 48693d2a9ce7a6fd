"""Export to Hugging Face transformers (`to-hf`): safetensors weights, config and tokenizer files.

The discriminator becomes a directory `transformers.ElectraForPreTraining.from_pretrained` (and
`ElectraModel`, which takes the `electra.*` weights) loads; the generator one for
`ElectraForMaskedLM`. Weights come from the official layout (`names.py`) and are renamed the way
transformers' own reader of Google's checkpoints (`load_tf_weights_in_electra`) does:

    {scope}/embeddings/{word,position,token_type}_embeddings -> electra.embeddings.*.weight
    {scope}/embeddings/LayerNorm/{gamma,beta}              -> electra.embeddings.LayerNorm.{weight,bias}
    {scope}/embeddings_project/{kernel,bias}               -> electra.embeddings_project.{weight,bias}
    {scope}/encoder/layer_{i}/a/b/kernel                   -> electra.encoder.layer.{i}.a.b.weight (transposed)
    discriminator_predictions/dense_1/*                    -> discriminator_predictions.dense_prediction.*
    generator_predictions/{dense,LayerNorm}/*              -> generator_predictions.{dense,LayerNorm}.*
    generator_predictions/output_bias                      -> generator_lm_head.bias

where {scope} is "electra" for the discriminator and "generator" for the generator (whose shared
embedding block is `electra/embeddings/*`). Dense kernels are transposed ([in, out] -> PyTorch's
[out, in]); `generator_lm_head.weight` is tied to the word embeddings and, as transformers' own
`save_pretrained` does, not stored. Writing needs only numpy and `safetensors` (no torch): the
file is safetensors, never a pickle.

Tokenizer files: `vocab.txt`, `tokenizer_config.json` (ElectraTokenizer, lowercasing and accent
stripping as the training data was built), `special_tokens_map.json` and `tokenizer.json` (the
fast tokenizer, `hf_tokenizer`), so `transformers.AutoTokenizer.from_pretrained(OUTPUT_DIR)`
works offline. `README.md` is the model card (`model_card`).

The files are written together (`atomic.write_files`): all of them, or, when anything fails (a
vocabulary tokenizers cannot express, a full disk), none, so a rerun never meets half an
export; all get the same permissions (the umask's).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from typing import Dict, Mapping, Optional

import numpy as np

from electra_tf import atomic
from electra_tf.convert import names
from electra_tf.convert.hf_spm_tokenizer import special_token_names
from electra_tf.convert.hf_tokenizer import TOKENIZER_JSON_NAME, build_tokenizer
from electra_tf.convert.model_card import README_NAME, model_card
from electra_tf.convert.model_dir import load_model_dir, prepare_output_dir
from electra_tf.convert.names import ConversionError
from electra_tf.errors import error_line
from electra_tf.config.model_config import ModelConfig
from electra_tf.sentencepiece_vocab import SENTENCEPIECE
from electra_tf.training import run_dir
from electra_tf.vocab import CLS_TOKEN, MASK_TOKEN, PAD_TOKEN, SEP_TOKEN, UNK_TOKEN

logger = logging.getLogger("electra_tf")

PARTS = ("discriminator", "generator")
HF_ARCHITECTURES = {"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM"}
WEIGHTS_NAME = "model.safetensors"  # transformers' file names
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.txt"
# A SentencePiece vocabulary's model, copied in place of vocab.txt (tokenizer.json is what reads).
SPM_MODEL_NAME = "spm.model"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
OUTPUTS = (WEIGHTS_NAME, CONFIG_NAME, VOCAB_NAME, SPM_MODEL_NAME, TOKENIZER_CONFIG_NAME,
           SPECIAL_TOKENS_MAP_NAME, TOKENIZER_JSON_NAME, README_NAME)
# transformers refuses safetensors files whose metadata does not name a known framework.
SAFETENSORS_METADATA = {"format": "pt"}
# Official LayerNorm epsilon (spec 7), written explicitly into the HF config.
LAYER_NORM_EPS = 1e-12
# Our activation names are the official BertConfig ones, which transformers' ACT2FN also uses
# ("gelu" = exact erf GELU in both).
HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "tanh": "tanh", "linear": "linear"}

_HEAD_NAMES = {
    "discriminator_predictions/dense/kernel": "discriminator_predictions.dense.weight",
    "discriminator_predictions/dense/bias": "discriminator_predictions.dense.bias",
    "discriminator_predictions/dense_1/kernel": "discriminator_predictions.dense_prediction.weight",
    "discriminator_predictions/dense_1/bias": "discriminator_predictions.dense_prediction.bias",
    "generator_predictions/dense/kernel": "generator_predictions.dense.weight",
    "generator_predictions/dense/bias": "generator_predictions.dense.bias",
    "generator_predictions/LayerNorm/gamma": "generator_predictions.LayerNorm.weight",
    "generator_predictions/LayerNorm/beta": "generator_predictions.LayerNorm.bias",
    "generator_predictions/output_bias": "generator_lm_head.bias",
}
_LEAVES = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}


def _hf_leaf_name(path: str) -> str:
    """"encoder/layer_3/attention/self/query/kernel" -> "encoder.layer.3.attention.self.query.weight"."""
    parts = path.split("/")
    out = []
    for part in parts[:-1]:
        if part.startswith("layer_") and part[len("layer_"):].isdigit():
            out += ["layer", part[len("layer_"):]]
        else:
            out.append(part)
    leaf = parts[-1]
    if leaf.endswith("_embeddings"):
        out += [leaf, "weight"]
    else:
        out.append(_LEAVES[leaf])
    return ".".join(out)


def encoder_scopes(weights: Mapping[str, np.ndarray], part: str):
    """(encoder scope, embedding scope) of the network `part` in an official weight dict."""
    if part == "discriminator":
        return names.DISCRIMINATOR_SCOPE, names.DISCRIMINATOR_SCOPE
    has_generator = any(names.part_of(n) == names.GENERATOR_SCOPE for n in weights)
    scope = names.GENERATOR_SCOPE if has_generator else names.DISCRIMINATOR_SCOPE
    own_block = f"{names.GENERATOR_SCOPE}/embeddings/word_embeddings" in weights
    return scope, (names.GENERATOR_SCOPE if own_block else names.DISCRIMINATOR_SCOPE)


def hf_state_dict(weights: Mapping[str, np.ndarray], part: str) -> Dict[str, np.ndarray]:
    """Official-layout weights -> the transformers state dict of `part` (float32, [out, in] kernels).

    Args:
        weights: {official name: array} (see names.get_official_weights).
        part: "discriminator" (ElectraForPreTraining) or "generator" (ElectraForMaskedLM).

    Raises:
        ConversionError: the weights lack the part's head.
    """
    if part not in PARTS:
        raise ConversionError(f"--part must be one of {', '.join(PARTS)}, got {part!r}")
    scope, embedding_scope = encoder_scopes(weights, part)
    head = names.DISCRIMINATOR_HEAD_SCOPE if part == "discriminator" else names.GENERATOR_HEAD_SCOPE
    if not any(names.part_of(n) == head for n in weights):
        raise ConversionError(f"the model has no {head}/* weights, so no {part} to export "
                              "(MLM-only or uniform-generator run?)")
    out = {}
    for name, value in weights.items():
        first, rest = name.split("/", 1)
        if first == embedding_scope and rest.startswith("embeddings/"):
            key = "electra." + _hf_leaf_name(rest)
        elif first == scope and not rest.startswith("embeddings/"):
            key = "electra." + _hf_leaf_name(rest)
        elif first == head:
            key = _HEAD_NAMES[name]
        else:
            continue
        value = np.asarray(value, np.float32)
        if name.endswith("/kernel"):
            value = value.T  # TF [in, out] -> torch.nn.Linear [out, in]
        out[key] = np.ascontiguousarray(value)
    return out


def hf_config(model_config: ModelConfig, part: str, pad_token_id: int) -> dict:
    """transformers `ElectraConfig` fields (config.json) for one network."""
    if model_config.hidden_act not in HF_ACTIVATIONS:
        raise ConversionError(f"hidden_act {model_config.hidden_act!r} has no transformers equivalent")
    return {
        "architectures": [HF_ARCHITECTURES[part]],
        "model_type": "electra",
        "vocab_size": model_config.vocab_size,
        "embedding_size": model_config.embedding_size,
        "hidden_size": model_config.hidden_size,
        "num_hidden_layers": model_config.num_hidden_layers,
        "num_attention_heads": model_config.num_attention_heads,
        "intermediate_size": model_config.intermediate_size,
        "hidden_act": HF_ACTIVATIONS[model_config.hidden_act],
        "hidden_dropout_prob": model_config.hidden_dropout_prob,
        "attention_probs_dropout_prob": model_config.attention_probs_dropout_prob,
        "max_position_embeddings": model_config.max_position_embeddings,
        "type_vocab_size": model_config.type_vocab_size,
        "initializer_range": model_config.initializer_range,
        "layer_norm_eps": LAYER_NORM_EPS,
        "pad_token_id": pad_token_id,
        "position_embedding_type": "absolute",
        "summary_type": "first",
        "summary_use_proj": True,
        "summary_activation": "gelu",
        "summary_last_dropout": 0.1,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def tokenizer_files(do_lower_case: bool, strip_accents: bool, model_max_length: int) -> Dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json for transformers' ElectraTokenizer(Fast).

    BERT (and electra-tf) strip accents only when lowercasing; transformers' `strip_accents=None`
    means exactly that, while `False` disables it.
    """
    special = {"unk_token": UNK_TOKEN, "sep_token": SEP_TOKEN, "pad_token": PAD_TOKEN,
               "cls_token": CLS_TOKEN, "mask_token": MASK_TOKEN}
    config = dict(special, tokenizer_class="ElectraTokenizer", do_lower_case=do_lower_case,
                  strip_accents=None if (strip_accents or not do_lower_case) else False,
                  tokenize_chinese_chars=True, model_max_length=model_max_length,
                  clean_up_tokenization_spaces=True)
    return {TOKENIZER_CONFIG_NAME: config, SPECIAL_TOKENS_MAP_NAME: special}


def spm_tokenizer_files(vocab, model_max_length: int) -> Dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json for a SentencePiece vocabulary: the fast
    tokenizer (`PreTrainedTokenizerFast`, reading tokenizer.json), special tokens named by the
    model's pieces."""
    special = special_token_names(vocab)
    config = dict(special, tokenizer_class="PreTrainedTokenizerFast",
                  model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    return {TOKENIZER_CONFIG_NAME: config, SPECIAL_TOKENS_MAP_NAME: special}


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def export_hf(model_dir: str, output_dir: str, part: str = "discriminator",
              checkpoint: Optional[str] = None, overwrite: bool = False) -> str:
    """Writes one network of a model directory as a transformers model directory.

    Args:
        model_dir: electra-tf model directory (config.json, vocab.txt, checkpoints).
        output_dir: where to write config.json, model.safetensors and the tokenizer files.
        part: "discriminator" (ElectraForPreTraining) or "generator" (ElectraForMaskedLM).
        checkpoint: optional checkpoint prefix instead of the latest.
        overwrite: replace those files if they exist (nothing else is touched).

    Returns:
        output_dir.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    if part not in PARTS:
        raise ConversionError(f"--part must be one of {', '.join(PARTS)}, got {part!r}")
    prepare_output_dir(output_dir, OUTPUTS, overwrite, create=False)  # before the slow part
    loaded = load_model_dir(model_dir, checkpoint)
    model = loaded.model
    weights = names.get_official_weights(model)
    state = hf_state_dict(weights, part)
    if part == "discriminator":
        model_config = ModelConfig(**model.discriminator_config)
    else:
        model_config = ModelConfig(**(model.generator_config or model.discriminator_config))
    config = hf_config(model_config, part, loaded.vocab.special.pad_id)
    settings = run_dir.tokenization_settings(loaded.config, model_dir)
    if loaded.vocab.kind == SENTENCEPIECE:
        files = spm_tokenizer_files(loaded.vocab, model_config.max_position_embeddings)
    else:
        files = tokenizer_files(settings.do_lower_case, settings.strip_accents,
                                model_config.max_position_embeddings)
    try:  # before anything is written: a vocabulary it cannot express leaves no partial export
        tokenizer_json = build_tokenizer(loaded.vocab, settings.do_lower_case,
                                         settings.strip_accents).to_str(pretty=True)
    except ValueError as e:  # a SentencePiece model of a kind tokenizers cannot express
        raise ConversionError(f"{e}; nothing was written to {output_dir}") from None
    texts = {name: json.dumps(value, indent=2, sort_keys=True) + "\n"
             for name, value in files.items()}
    texts[CONFIG_NAME] = json.dumps(config, indent=2, sort_keys=True) + "\n"
    texts[TOKENIZER_JSON_NAME] = tokenizer_json
    texts[README_NAME] = model_card(part, HF_ARCHITECTURES[part], config, loaded, model_dir,
                                    sum(int(v.size) for v in state.values()),
                                    settings.do_lower_case)
    writers = {WEIGHTS_NAME: lambda path: save_file(state, path, metadata=SAFETENSORS_METADATA),
               SPM_MODEL_NAME if loaded.vocab.kind == SENTENCEPIECE else VOCAB_NAME:
                   lambda path: shutil.copyfile(loaded.vocab.path, path)}
    writers.update({name: functools.partial(_write_text, text=text)
                    for name, text in texts.items()})
    # All the files or none (a failure, a full disk): a rerun never meets half an export.
    try:
        atomic.write_files(output_dir, writers)
    except SafetensorError as e:  # safetensors' own I/O errors (a full disk) are not OSErrors
        raise ConversionError(f"cannot write {os.path.join(output_dir, WEIGHTS_NAME)} "
                              f"({error_line(e)}); nothing was written") from None
    logger.info("wrote the %s (%s, %d tensors, step %d) to %s", part, HF_ARCHITECTURES[part],
                len(state), loaded.step, output_dir)
    return output_dir
