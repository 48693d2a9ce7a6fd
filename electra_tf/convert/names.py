"""The name and shape mapping between an `ElectraPretrainer` and Google's TF1 checkpoint layout.

Every converter in this package goes through the official layout (spec section 5.9), held as a
plain `{official_name: numpy array}` dict: our model <-> official names here, then official names
-> Hugging Face (`hf.py`), keras-hub (`keras_hub.py`) or a TF1 checkpoint (`google.py`).

Official name (scope = "electra" for the discriminator, "generator" for the generator)  <- ours:

    electra/embeddings/word_embeddings              [V, E]  embeddings.word_embeddings.embeddings
    electra/embeddings/token_type_embeddings        [2, E]  embeddings.token_type_embeddings.embeddings
    electra/embeddings/position_embeddings          [P, E]  embeddings.position_embeddings.position_embeddings
    electra/embeddings/LayerNorm/{gamma,beta}       [E]     embeddings.layer_norm.{gamma,beta}
    {scope}/embeddings_project/{kernel,bias}        [E, H]  {encoder}/embeddings_project/{kernel,bias}
    {scope}/encoder/layer_{i}/<official>            ...     {encoder}/layer_{i}/<keras>, with
        attention/self/{query,key,value}/kernel     [H, H]  self_attention_layer/{query,key,value}/kernel [H, heads, H/heads]
        attention/self/{query,key,value}/bias       [H]     self_attention_layer/{query,key,value}/bias   [heads, H/heads]
        attention/output/dense/kernel               [H, H]  self_attention_layer/attention_output/kernel  [heads, H/heads, H]
        attention/output/dense/bias                 [H]     self_attention_layer/attention_output/bias
        attention/output/LayerNorm/{gamma,beta}     [H]     self_attention_layer_norm/{gamma,beta}
        intermediate/dense/{kernel,bias}            [H, I]  feedforward_intermediate_dense/{kernel,bias}
        output/dense/{kernel,bias}                  [I, H]  feedforward_output_dense/{kernel,bias}
        output/LayerNorm/{gamma,beta}               [H]     feedforward_layer_norm/{gamma,beta}
    generator_predictions/dense/{kernel,bias}       [Hg, E] generator_head.dense.{kernel,bias}
    generator_predictions/LayerNorm/{gamma,beta}    [E]     generator_head.layer_norm.{gamma,beta}
    generator_predictions/output_bias               [V]     generator_head.output_bias
    discriminator_predictions/dense/{kernel,bias}   [H, H]  discriminator_head.dense.{kernel,bias}
    discriminator_predictions/dense_1/{kernel,bias} [H, 1]  discriminator_head.dense_1.{kernel,bias}

Both layouts store dense kernels as [in, out]; the attention tensors differ only by a reshape
(keras-hub splits the head axis out), never by a transpose. The generator reads the discriminator's
embedding block (`electra/embeddings/*`), as official; with `untied_generator_embeddings` it owns
`generator/embeddings/*`, and with `untied_generator=false` (or MLM-only) there is no generator
encoder: the MLM head runs on `electra/*`. With `embedding_sharing` "gdes" (DeBERTaV3) the
discriminator's `electra/embeddings/*` are the merged tables it computes with (shared block +
delta), and the generator's block, which it reads without deltas, is `generator/embeddings/*`
(the layout of untied generator embeddings, at the shared width E).

Checkpoint entries that are not weights: `global_step` and the optimizer slots `<var>/adam_m`,
`<var>/adam_v` (spec 5.9).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from electra_tf.errors import ElectraError

# Official scopes (run_pretraining.py / modeling.py), the first segment of every variable name.
DISCRIMINATOR_SCOPE = "electra"
GENERATOR_SCOPE = "generator"
GENERATOR_HEAD_SCOPE = "generator_predictions"
DISCRIMINATOR_HEAD_SCOPE = "discriminator_predictions"
# The four groups a checkpoint is made of. A group is loaded whole or (except the discriminator)
# initialised fresh when entirely absent; a partly present group is an error.
PARTS = (DISCRIMINATOR_SCOPE, GENERATOR_SCOPE, GENERATOR_HEAD_SCOPE, DISCRIMINATOR_HEAD_SCOPE)
# Official checkpoint entries that are not model weights (spec 5.9).
GLOBAL_STEP_NAME = "global_step"
OPTIMIZER_SLOT_SUFFIXES = ("/adam_m", "/adam_v")
# Weights are stored as float32; these load without loss (upcast), anything else is refused.
LOSSLESS_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


class ConversionError(ElectraError, ValueError):
    """A checkpoint cannot be converted (shape, dtype or name mismatch, missing file...)."""


def format_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def is_weight_name(name: str) -> bool:
    """False for `global_step` and optimizer slots, which converters skip."""
    return name != GLOBAL_STEP_NAME and not name.endswith(OPTIMIZER_SLOT_SUFFIXES)


def part_of(name: str) -> str:
    """The group ("electra", "generator", ...) an official name belongs to: its first segment."""
    return name.split("/", 1)[0]


# --- Transformer blocks ---------------------------------------------------------------------------
def _merge_last_two(shape):  # [H, heads, size] -> [H, H]; [heads, size] -> [H]
    return tuple(shape[:-2]) + (int(shape[-2]) * int(shape[-1]),)


def _merge_first_two(shape):  # [heads, size, H] -> [H, H]
    return (int(shape[0]) * int(shape[1]),) + tuple(shape[2:])


def _same(shape):
    return tuple(int(d) for d in shape)


# keras-hub `TransformerEncoder` weight path (relative to the block) -> (official path relative to
# `{scope}/encoder/layer_{i}`, keras shape -> official shape). keras-hub's `ElectraBackbone` blocks
# use the same paths, so `keras_hub.py` reuses this table.
LAYER_NAME_MAP: Dict[str, Tuple[str, Callable]] = {
    "self_attention_layer/query/kernel": ("attention/self/query/kernel", _merge_last_two),
    "self_attention_layer/query/bias": ("attention/self/query/bias", _merge_last_two),
    "self_attention_layer/key/kernel": ("attention/self/key/kernel", _merge_last_two),
    "self_attention_layer/key/bias": ("attention/self/key/bias", _merge_last_two),
    "self_attention_layer/value/kernel": ("attention/self/value/kernel", _merge_last_two),
    "self_attention_layer/value/bias": ("attention/self/value/bias", _merge_last_two),
    "self_attention_layer/attention_output/kernel": ("attention/output/dense/kernel", _merge_first_two),
    "self_attention_layer/attention_output/bias": ("attention/output/dense/bias", _same),
    "self_attention_layer_norm/gamma": ("attention/output/LayerNorm/gamma", _same),
    "self_attention_layer_norm/beta": ("attention/output/LayerNorm/beta", _same),
    "feedforward_intermediate_dense/kernel": ("intermediate/dense/kernel", _same),
    "feedforward_intermediate_dense/bias": ("intermediate/dense/bias", _same),
    "feedforward_output_dense/kernel": ("output/dense/kernel", _same),
    "feedforward_output_dense/bias": ("output/dense/bias", _same),
    "feedforward_layer_norm/gamma": ("output/LayerNorm/gamma", _same),
    "feedforward_layer_norm/beta": ("output/LayerNorm/beta", _same),
}
# Official names of one block, in the order the official code creates them.
LAYER_OFFICIAL_NAMES = (
    "attention/self/query/kernel", "attention/self/query/bias",
    "attention/self/key/kernel", "attention/self/key/bias",
    "attention/self/value/kernel", "attention/self/value/bias",
    "attention/output/dense/kernel", "attention/output/dense/bias",
    "attention/output/LayerNorm/gamma", "attention/output/LayerNorm/beta",
    "intermediate/dense/kernel", "intermediate/dense/bias",
    "output/dense/kernel", "output/dense/bias",
    "output/LayerNorm/gamma", "output/LayerNorm/beta",
)


def relative_path(variable, owner_name: str) -> str:
    """A Keras variable's path below the layer named `owner_name` ("a/layer_0/x/kernel" -> "x/kernel")."""
    parts = variable.path.split("/")
    if owner_name not in parts:
        raise ConversionError(f"variable {variable.path} is not under a layer named {owner_name!r}")
    return "/".join(parts[parts.index(owner_name) + 1:])


def transformer_layer_entries(layer, official_prefix: str, part: str) -> List["Entry"]:
    """Entries of one keras-hub `TransformerEncoder` block (ours or `ElectraBackbone`'s)."""
    entries = []
    seen = set()
    for variable in layer.weights:
        rel = relative_path(variable, layer.name)
        if rel not in LAYER_NAME_MAP:
            raise ConversionError(
                f"unknown weight {variable.path} in transformer block {layer.name!r}: the keras-hub "
                "layout changed (electra-tf is tested with keras-hub 0.32)")
        official, to_official = LAYER_NAME_MAP[rel]
        seen.add(rel)
        entries.append(Entry(f"{official_prefix}/{official}", variable,
                             to_official(variable.shape), part))
    missing = sorted(set(LAYER_NAME_MAP) - seen)
    if missing:
        raise ConversionError(f"transformer block {layer.name!r} has no weight {missing[0]} (is it built?)")
    order = {name: i for i, name in enumerate(LAYER_OFFICIAL_NAMES)}
    return sorted(entries, key=lambda e: order[e.official_name[len(official_prefix) + 1:]])


# --- Whole model ----------------------------------------------------------------------------------
class Entry(NamedTuple):
    """One model variable and its place in the official layout.

    Attributes:
        official_name: str, e.g. "electra/encoder/layer_0/attention/self/query/kernel".
        variable: the Keras variable.
        official_shape: tuple of int, the shape in the official checkpoint.
        part: str, one of `PARTS`.
        delta: the GDES delta added to `variable` (the discriminator's embedding block under
            `embedding_sharing` "gdes": its official value is variable + delta), or None.
    """

    official_name: str
    variable: object
    official_shape: tuple
    part: str
    delta: object = None

    def value(self) -> np.ndarray:
        """The float32 value in the model's shape (variable + delta under GDES)."""
        value = np.asarray(self.variable.numpy(), np.float32)
        if self.delta is not None:
            value = value + np.asarray(self.delta.numpy(), np.float32)
        return value


_EMBEDDING_NAMES = ("word_embeddings", "token_type_embeddings", "position_embeddings",
                    "LayerNorm/gamma", "LayerNorm/beta")  # embeddings.block_variables order


def _embedding_entries(embeddings, scope: str) -> List[Entry]:
    """The block's entries; a GDES `DisentangledEmbeddings` gives the merged block (shared +
    delta): the discriminator's embeddings are what it computes with."""
    # lazy: keras; convert/__init__ imports this module, and `--help` stays fast
    from electra_tf.modeling.embeddings import DisentangledEmbeddings, block_variables

    prefix = f"{scope}/embeddings"
    if isinstance(embeddings, DisentangledEmbeddings):
        return [Entry(f"{prefix}/{name}", var, _same(var.shape), scope, delta)
                for name, var, delta in zip(_EMBEDDING_NAMES, embeddings.shared_variables(),
                                            embeddings.deltas())]
    return [Entry(f"{prefix}/{name}", var, _same(var.shape), scope)
            for name, var in zip(_EMBEDDING_NAMES, block_variables(embeddings))]


def encoder_entries(encoder, scope: str = DISCRIMINATOR_SCOPE, with_embeddings: bool = True) -> List[Entry]:
    """Entries of one `ElectraEncoder`: its embedding block (if `with_embeddings`), projection and
    blocks, named under `scope` ("electra" or "generator").

    Raises:
        ConversionError: `encoder` is not an electra-tf `ElectraEncoder`.
    """
    # lazy: keras; convert/__init__ imports this module, and `--help` stays fast
    from electra_tf.modeling.encoder import ElectraEncoder

    if not isinstance(encoder, ElectraEncoder):
        raise ConversionError(
            f"encoder {encoder.name!r} is a {type(encoder).__name__}, not an electra-tf "
            "ElectraEncoder: only models built from a PretrainingConfig can be converted")
    entries = _embedding_entries(encoder.embeddings, scope) if with_embeddings else []
    if encoder.embeddings_project is not None:
        project = encoder.embeddings_project
        entries += [Entry(f"{scope}/embeddings_project/kernel", project.kernel, _same(project.kernel.shape), scope),
                    Entry(f"{scope}/embeddings_project/bias", project.bias, _same(project.bias.shape), scope)]
    for i, layer in enumerate(encoder.encoder_layers):
        entries += transformer_layer_entries(layer, f"{scope}/encoder/layer_{i}", scope)
    return entries


def pretrainer_entries(model) -> List[Entry]:
    """Every weight of an `ElectraPretrainer` with its official name, in a fixed order.

    The model must be built (`build_from_sequence_length()`): the heads create their variables on
    first call.

    Raises:
        ConversionError: a custom (non electra-tf) encoder, or an unbuilt model.
    """
    entries = encoder_entries(model.discriminator, DISCRIMINATOR_SCOPE, with_embeddings=True)
    if model.generator is not None:
        own_block = model.generator.embeddings is not model.discriminator.embeddings
        entries += encoder_entries(model.generator, GENERATOR_SCOPE, with_embeddings=own_block)
    head = model.generator_head
    if head is not None:
        if not head.built:
            raise ConversionError("the model is not built: call build_from_sequence_length() first")
        for name, var in (("dense/kernel", head.dense.kernel), ("dense/bias", head.dense.bias),
                          ("LayerNorm/gamma", head.layer_norm.gamma),
                          ("LayerNorm/beta", head.layer_norm.beta), ("output_bias", head.output_bias)):
            entries.append(Entry(f"{GENERATOR_HEAD_SCOPE}/{name}", var, _same(var.shape), GENERATOR_HEAD_SCOPE))
    head = model.discriminator_head
    if head is not None:
        if not head.built:
            raise ConversionError("the model is not built: call build_from_sequence_length() first")
        for name, var in (("dense/kernel", head.dense.kernel), ("dense/bias", head.dense.bias),
                          ("dense_1/kernel", head.dense_1.kernel), ("dense_1/bias", head.dense_1.bias)):
            entries.append(Entry(f"{DISCRIMINATOR_HEAD_SCOPE}/{name}", var, _same(var.shape),
                                 DISCRIMINATOR_HEAD_SCOPE))
    names = [e.official_name for e in entries]
    if len(set(names)) != len(names):
        raise ConversionError("internal error: two variables map to the same official name")
    return entries


def official_shapes(model) -> Dict[str, tuple]:
    """{official name: official shape} of a built `ElectraPretrainer`."""
    return {e.official_name: e.official_shape for e in pretrainer_entries(model)}


def get_official_weights(model) -> Dict[str, np.ndarray]:
    """The model's weights as float32 arrays in the official layout (names and shapes)."""
    return {e.official_name: e.value().reshape(e.official_shape) for e in pretrainer_entries(model)}


def check_dtype(name: str, dtype) -> None:
    """Raises ConversionError unless `dtype` loads into float32 without loss."""
    dtype_name = getattr(dtype, "name", str(dtype))
    if dtype_name not in LOSSLESS_FLOAT_DTYPES:
        raise ConversionError(f"checkpoint variable {name} has dtype {dtype_name}; expected float32 "
                              f"(or a lossless {'/'.join(LOSSLESS_FLOAT_DTYPES[1:])})")


def assign_official_weights(model, weights: Mapping[str, np.ndarray],
                            parts: Optional[Sequence[str]] = None, source: str = "checkpoint") -> List[str]:
    """Assigns official-layout arrays to the model's variables, checking names, shapes and dtypes.

    Args:
        model: a built `ElectraPretrainer`.
        weights: {official name: array in the official shape}; extra entries are ignored here
            (see `match_checkpoint` for the strict check).
        parts: only assign variables of these groups (default: all of the model's groups).
        source: what `weights` came from, for error messages.

    Returns:
        The official names assigned, in order.

    Raises:
        ConversionError: a variable is missing or has another shape or a lossy dtype; the message
            names the variable and both shapes. Nothing is assigned in that case.
    """
    entries = [e for e in pretrainer_entries(model) if parts is None or e.part in parts]
    values = []
    for entry in entries:
        if entry.official_name not in weights:
            raise ConversionError(f"{source} has no variable {entry.official_name} "
                                  f"(the model needs shape {format_shape(entry.official_shape)})")
        value = np.asarray(weights[entry.official_name])
        if tuple(value.shape) != entry.official_shape:
            raise ConversionError(
                f"{source} variable {entry.official_name} has shape {format_shape(value.shape)}, "
                f"but the model needs {format_shape(entry.official_shape)}")
        check_dtype(entry.official_name, value.dtype)
        values.append(value.astype(np.float32).reshape(entry.variable.shape))
    for entry, value in zip(entries, values):
        if entry.delta is None:
            entry.variable.assign(value)
    for entry, value in zip(entries, values):  # GDES: delta = merged - shared, once it is set
        if entry.delta is not None:
            entry.delta.assign(value - np.asarray(entry.variable.numpy(), np.float32))
    return [e.official_name for e in entries]


class CheckpointMatch(NamedTuple):
    """How a checkpoint's weights cover a model's groups.

    Attributes:
        present: tuple of str, groups found whole in the checkpoint (to load).
        absent: tuple of str, groups with no variable at all in the checkpoint (left as
            initialised).
    """

    present: tuple
    absent: tuple


def match_checkpoint(expected: Mapping[str, tuple], found: Mapping[str, tuple],
                     context: str = "the model", required: Sequence[str] = (DISCRIMINATOR_SCOPE,),
                     ) -> CheckpointMatch:
    """Checks a checkpoint's weight names and shapes against a model's, group by group.

    Args:
        expected: {official name: shape} the model needs.
        found: {official name: shape} of the checkpoint's weights (optimizer slots and
            global_step already removed).
        context: how the model's configuration is described in error messages.
        required: groups that must be present.

    Raises:
        ConversionError (first problem found, naming the variable and both shapes): a shape
            differs; a group is partly present (a variable is missing); a required group is
            absent; the checkpoint has weights the model has no place for.
    """
    # Shape mismatches first, in the model's order (the word embeddings come first: a vocab
    # mismatch is reported as such, not as a later symptom).
    for name, shape in expected.items():
        if name in found and tuple(found[name]) != tuple(shape):
            raise ConversionError(
                f"checkpoint variable {name} has shape {format_shape(found[name])}, but {context} "
                f"expects {format_shape(shape)}")
    present, absent = [], []
    for part in dict.fromkeys(part_of(n) for n in expected):
        names = [n for n in expected if part_of(n) == part]
        have = [n for n in names if n in found]
        if len(have) == len(names):
            present.append(part)
        elif not have:
            if part in required:
                raise ConversionError(f"checkpoint has no {part}/* variables, which {context} needs "
                                      f"(e.g. {names[0]} {format_shape(expected[names[0]])})")
            absent.append(part)
        else:
            missing = next(n for n in names if n not in found)
            raise ConversionError(
                f"checkpoint lacks variable {missing} (expected shape "
                f"{format_shape(expected[missing])} by {context}), although it has other {part}/* "
                "variables")
    unexpected = [n for n in found if n not in expected]
    if unexpected:
        shown = ", ".join(f"{n} {format_shape(found[n])}" for n in unexpected[:5])
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise ConversionError(f"checkpoint has variable(s) {context} has no place for: {shown}{more}")
    return CheckpointMatch(tuple(present), tuple(absent))
