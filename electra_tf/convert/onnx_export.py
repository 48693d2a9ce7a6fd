"""Export to ONNX (`to-onnx`): the discriminator or a fine-tuned model, for ONNX Runtime and others.

What is exported is the SavedModel's token-id signature, with the same input and output names:

| source (`--model-dir`) | signature | inputs (int32 [batch, seq]) | outputs |
|---|---|---|---|
| a pretraining run directory (config.json, checkpoints) or its `export/discriminator[/STEP]` | `serving_default` | `input_ids`, `input_mask`, `segment_ids` | `replaced_probs` [batch, seq], `sequence_output` [batch, seq, hidden] |
| a fine-tuned SavedModel (`finetuning_models/<tasks>_model_<trial>`), classification | `<task>_ids` | the same | `probabilities`, `logits`, `label_ids`, `labels` (string) |
| regression (sts) | `<task>_ids` | the same | `predictions`, `scores` |
| question answering | `<task>_ids` | the same | `start_logits`, `end_logits`, `answerable_logit`, and the beam's `start_top_*` / `end_top_*` |
| tagging | `<task>_ids` | + `labeled_positions` [batch, words] | `tag_ids`, `tags` (string) |

Batch and sequence axes are dynamic (`batch`, `sequence`; tagging's word axis `words`). The
raw-text signatures are not exported: their in-graph WordPiece tokenizer is a tensorflow-text op
that ONNX has no counterpart for; tokenize with the exported vocabulary (`to-hf`'s
`tokenizer.json` is the same tokenizer for the `tokenizers` library and its ports).

Route: tf2onnx converts the SavedModel's own concrete function (weights frozen into the graph),
so the ONNX file computes exactly what TF Serving would. TF 2.21 writes the exact GELU as
`Erfc`, which tf2onnx 1.17 does not map: it is rewritten here as `1 - Erf(x)` (ONNX has `Erf`).
The model's metadata (`metadata_props`) records the source, the signature, the opset, the
precision and, for classification and tagging, the label names (`labels`, JSON).

Precision: float32 always. A run directory's model is built in float32 whatever the run trained
in (as its SavedModels are by default, `export_precision`); a SavedModel that computes in bf16
is refused in one line (tf2onnx turns it into a file ONNX Runtime cannot load). Whatever the
source, the written file is loaded in ONNX Runtime (where installed) before it takes its name:
a file it refuses is a one-line error and nothing is left.

Needs the `[onnx]` extra (tf2onnx, onnx; onnxruntime to run the file).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from electra_tf import atomic, precision
from electra_tf.convert.model_dir import load_model_dir
from electra_tf.convert.names import ConversionError
from electra_tf.errors import error_line
from electra_tf.training.tf.export import int_spec, rtd_outputs
from electra_tf.training.tf.hub import latest_version_dir

logger = logging.getLogger("electra_tf")

# 17: one every ONNX Runtime since 1.11 (2022) runs; tf2onnx 1.17 writes opsets 13 to 18 (the
# tests also run 15).
DEFAULT_OPSET = 17
MIN_OPSET = 13
EXTRA_HINT = "pip install 'electra-tf[onnx]' (or: pip install -e '.[onnx]')"
SHARED_INPUTS = ("input_ids", "input_mask", "segment_ids")
IDS_SUFFIX = "_ids"
LABELS_FILE = os.path.join("assets.extra", "labels.json")  # finetuning.export.LABELS_FILE
FINETUNING_CONFIG_FILE = os.path.join("assets.extra", "finetuning_config.json")  # its CONFIG_FILE
# What every ONNX file computes in (recorded as `electra_tf.export_precision`): ONNX Runtime has
# no bfloat16 kernels for these graphs, so a bf16 SavedModel is refused, not converted.
EXPORT_PRECISION = "float32"
# Names of the dynamic axes, by input; other inputs get "batch" and their own second axis.
AXIS_NAMES = {"labeled_positions": ("batch", "words")}
SEQUENCE_AXES = ("batch", "sequence")


def _require_tf2onnx():
    """tf2onnx and onnx, or a ConversionError naming the extra."""
    try:
        import onnx  # noqa: F401
        import tf2onnx
    except ImportError as e:
        raise ConversionError(f"to-onnx needs the [onnx] extra ({e.name} is not installed): "
                              f"{EXTRA_HINT}") from None
    return tf2onnx


def check_opset(opset: int) -> None:
    """Raises ConversionError unless tf2onnx writes `opset` (and this model needs no less)."""
    tf2onnx = _require_tf2onnx()
    from tf2onnx import constants

    top = max(constants.OPSET_TO_IR_VERSION)
    if not MIN_OPSET <= opset <= top:
        raise ConversionError(f"--opset {opset}: tf2onnx {tf2onnx.__version__} writes opsets "
                              f"{MIN_OPSET} to {top}")


def is_saved_model(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "saved_model.pb"))


def _ids_inputs(signature) -> Optional[Dict[str, tf.TensorSpec]]:
    """The signature's inputs when it takes the three int32 token-id tensors (else None)."""
    specs = signature.structured_input_signature[1]
    if not set(SHARED_INPUTS) <= set(specs) or any(s.dtype != tf.int32 for s in specs.values()):
        return None
    return specs


def choose_signature(signatures, source: str, task: Optional[str]) -> str:
    """Which signature of a SavedModel to export (see the module docstring).

    Args:
        signatures: the loaded SavedModel's `signatures`.
        source: its path (for the messages).
        task: `--task`, or None for the only task / the discriminator.

    Raises:
        ConversionError: no such task, several tasks and no `--task`, or no token-id signature.
    """
    ids = sorted(name for name in signatures if _ids_inputs(signatures[name]) is not None)
    tasks = [name[:-len(IDS_SUFFIX)] for name in ids if name.endswith(IDS_SUFFIX)]
    if task is not None:
        if f"{task}{IDS_SUFFIX}" not in ids:
            raise ConversionError(f"--task {task}: {source} has no signature {task}{IDS_SUFFIX} "
                                  f"(tasks with one: {', '.join(tasks) or 'none'})")
        return f"{task}{IDS_SUFFIX}"
    if "serving_default" in ids:  # the pretraining export: the discriminator
        return "serving_default"
    if len(tasks) == 1:
        return ids[0]
    if not tasks:
        raise ConversionError(
            f"{source} has no token-id signature (signatures: {', '.join(sorted(signatures))}); a "
            "question-answering model exported before its <task>_ids signature existed must be "
            "fine-tuned (exported) again")
    raise ConversionError(f"{source} holds {len(tasks)} tasks ({', '.join(tasks)}): pass --task "
                          "to choose the one to export")


def _ordered(specs: Dict[str, tf.TensorSpec]) -> List[tf.TensorSpec]:
    names = list(SHARED_INPUTS) + sorted(set(specs) - set(SHARED_INPUTS))
    return [tf.TensorSpec(specs[n].shape, specs[n].dtype, name=n) for n in names]


def _erfc(ctx, node, name, args):
    """tf2onnx handler: Erfc(x) -> Sub(1, Erf(x)) (TF writes the exact GELU with Erfc)."""
    del name, args
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    erf = ctx.make_node("Erf", [node.input[0]])
    one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def convert_function(function, input_specs: List[tf.TensorSpec], opset: int):
    """A tf.function of int32 token ids -> a dict of outputs, as an ONNX ModelProto.

    Inputs and outputs keep their names; every axis of every input is dynamic.

    Raises:
        ConversionError: tf2onnx cannot convert an op, or the opset is out of range.
    """
    tf2onnx = _require_tf2onnx()
    check_opset(opset)
    # tf2onnx logs every pass at INFO (and its optimizer's statistics): kept to warnings.
    tf2onnx_logger = logging.getLogger("tf2onnx")
    level = tf2onnx_logger.level
    tf2onnx_logger.setLevel(max(level, logging.WARNING))
    try:
        model, _ = tf2onnx.convert.from_function(
            function, input_signature=input_specs, opset=opset,
            custom_op_handlers={"Erfc": (_erfc, [])})
    except Exception as e:  # tf2onnx raises bare exceptions for unsupported graphs
        raise ConversionError(f"tf2onnx cannot convert the model ({error_line(e)})") from None
    finally:
        tf2onnx_logger.setLevel(level)
    _freeze_captured_constants(model, function.get_concrete_function(*input_specs))
    _name_axes(model, input_specs)
    return model


def _freeze_captured_constants(model, concrete) -> None:
    """Turns the graph inputs tf2onnx leaves for captured non-variable tensors into initializers.

    tf2onnx freezes variables only; a loaded SavedModel's captured constants (the label names
    that `labels` / `tags` gather from) stay graph inputs named after their placeholder.
    """
    from onnx import numpy_helper

    captured = {internal.name: external for external, internal in concrete.graph.captures
                if external.dtype != tf.resource}
    for graph_input in list(model.graph.input):
        if graph_input.name in captured:
            model.graph.input.remove(graph_input)
            model.graph.initializer.append(numpy_helper.from_array(
                np.asarray(captured[graph_input.name].numpy()), graph_input.name))


def _name_axes(model, input_specs: List[tf.TensorSpec]) -> None:
    """Names the dynamic input axes (tf2onnx writes them as unnamed -1 / unk__N)."""
    by_name = {v.name: v for v in model.graph.input}
    for spec in input_specs:
        names = AXIS_NAMES.get(spec.name, SEQUENCE_AXES)
        for dim, axis in zip(by_name[spec.name].type.tensor_type.shape.dim, names):
            dim.ClearField("dim_value")
            dim.dim_param = axis


def _discriminator_function(model_dir: str, checkpoint: Optional[str]):
    """(tf.function, input specs, step) of a pretraining run's discriminator, as it is exported
    (in float32, whatever the run trained in: its SavedModel's default `export_precision`)."""
    with precision.keras_policy(precision.EXPORT_POLICIES[EXPORT_PRECISION]):
        loaded = load_model_dir(model_dir, checkpoint)
    model = loaded.model
    if model.discriminator_head is None:
        raise ConversionError(f"--model-dir {model_dir} was trained without a discriminator "
                              "(an MLM run): nothing to export to ONNX")
    encoder = model.exported_discriminator()
    head = model.discriminator_head
    specs = [int_spec(name) for name in SHARED_INPUTS]

    @tf.function(input_signature=specs)
    def serve(input_ids, input_mask, segment_ids):
        outputs = rtd_outputs(encoder, head, {"input_ids": input_ids, "input_mask": input_mask,
                                              "segment_ids": segment_ids}, training=False)
        return {k: outputs[k] for k in ("replaced_probs", "sequence_output")}

    return serve, specs, loaded.step


def _saved_model_function(path: str, task: Optional[str]):
    """(tf.function, input specs, signature name, labels or None) of a SavedModel's id signature."""
    try:
        import tensorflow_text  # noqa: F401  (the raw-text signatures' ops, loaded with the model)
        loaded = tf.saved_model.load(path)
    except (OSError, ValueError, tf.errors.OpError) as e:
        raise ConversionError(f"--model-dir {path}: cannot load the SavedModel ({error_line(e)})") from None
    name = choose_signature(loaded.signatures, path, task)
    signature = loaded.signatures[name]
    if computes_in_bfloat16(signature):
        raise ConversionError(_bfloat16_refusal(path))
    specs = _ordered(_ids_inputs(signature))

    @tf.function(input_signature=specs)
    def serve(*args):
        return signature(**{spec.name: value for spec, value in zip(specs, args)})

    serve._loaded = loaded  # keeps the variables alive while tf2onnx freezes them
    labels = None
    labels_path = os.path.join(path, LABELS_FILE)
    if name.endswith(IDS_SUFFIX) and os.path.isfile(labels_path):
        with open(labels_path, encoding="utf-8") as f:
            labels = json.load(f).get(name[:-len(IDS_SUFFIX)])
    return serve, specs, name, labels


def computes_in_bfloat16(function) -> bool:
    """Whether a concrete function (a loaded signature) has a bfloat16 tensor anywhere, the
    functions it calls included: such a graph converts to ONNX that ONNX Runtime cannot load
    (tf2onnx writes bf16 and float16 operands into one Add)."""
    from tensorflow.core.framework import types_pb2

    graph = function.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return any(value.type == types_pb2.DT_BFLOAT16 or types_pb2.DT_BFLOAT16 in value.list.type
               for node in nodes for value in node.attr.values())


def _bfloat16_refusal(path: str) -> str:
    """The one line refusing a bfloat16 SavedModel, with the way to a float32 one."""
    head = (f"--model-dir {path} computes in bfloat16 (trained under mixed_bfloat16 and exported "
            "before exports were float32, or with export_precision bfloat16), which ONNX Runtime "
            "cannot run")
    if os.path.isfile(os.path.join(path, FINETUNING_CONFIG_FILE)):
        return (f"{head}: fine-tune it again with export_precision float32 (the default) and "
                "convert that export")
    export_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))  # RUN/export/NET/STEP
    run = os.path.dirname(export_dir)
    if os.path.basename(export_dir) == "export" and os.path.isdir(run):
        return (f"{head}: pass its run directory (--model-dir {run}), converted in float32, or "
                "export it again with export_precision float32 (the default)")
    return f"{head}: export it again with export_precision float32 (the default)"


def _check_arguments(model_dir: str, output: str, opset: int, overwrite: bool) -> None:
    """Refuses bad arguments before anything heavy is imported or converted.

    Args:
        model_dir: the --model-dir given.
        output: the .onnx file to write.
        opset: ONNX opset to write.
        overwrite: replace `output` if it exists.

    Raises:
        ConversionError: an unsupported opset, `output` a directory or existing without
            `overwrite`, or no `model_dir`.
    """
    check_opset(opset)
    if os.path.isdir(output):
        raise ConversionError(f"--output {output} is a directory; name the .onnx file to write")
    if os.path.exists(output) and not overwrite:
        raise ConversionError(f"--output {output} already exists; pass --overwrite to replace it")
    if not os.path.isdir(model_dir):
        raise ConversionError(f"--model-dir {model_dir} does not exist")


def _source_function(model_dir: str, task: Optional[str], checkpoint: Optional[str],
                     metadata: Dict[str, str]) -> Tuple[Any, Any]:
    """Loads the function to convert, from a SavedModel or a run directory's checkpoint.

    Args:
        model_dir: a SavedModel directory (version folder resolved) or a run directory.
        task: which task of a multi-task fine-tuned model (None: its only one).
        checkpoint: a run directory's checkpoint prefix instead of the latest one.
        metadata: the ONNX metadata; the source, signature and labels or step are added here.

    Returns:
        (function, input specs) for convert_function.

    Raises:
        ConversionError: --checkpoint with a SavedModel, --task with a run directory, or the
            loaders' errors.
    """
    if is_saved_model(model_dir):
        if checkpoint is not None:
            raise ConversionError(f"--checkpoint applies to a run directory, not to the SavedModel "
                                  f"{model_dir}")
        function, specs, signature, labels = _saved_model_function(model_dir, task)
        metadata.update({"electra_tf.source": "saved_model", "electra_tf.signature": signature})
        if labels:
            metadata["labels"] = json.dumps(labels, ensure_ascii=False)
    else:
        if task is not None:
            raise ConversionError(f"--task applies to a fine-tuned SavedModel; {model_dir} is not one "
                                  "(no saved_model.pb)")
        function, specs, step = _discriminator_function(model_dir, checkpoint)
        metadata.update({"electra_tf.source": "run_directory", "electra_tf.signature": "serving_default",
                         "electra_tf.step": str(step)})
    return function, specs


def _write_model(model: Any, metadata: Dict[str, str], output: str) -> None:
    """Stamps the metadata on the ONNX model, checks it and writes it atomically.

    Args:
        model: the converted onnx.ModelProto.
        metadata: key/value pairs to store as metadata_props.
        output: the .onnx file to write (a temporary file, then a rename).

    Raises:
        ConversionError: `output` cannot be written (one line).
    """
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    import onnx

    onnx.checker.check_model(model)
    try:
        with atomic.atomic_path(output) as tmp:
            with open(tmp, "wb") as f:
                f.write(model.SerializeToString())
            _check_loadable(tmp, output)  # a failure removes the file: nothing partial is left
    except OSError as e:
        raise ConversionError(f"cannot write --output {output} ({error_line(e)})") from None


def _check_loadable(path: str, output: str) -> None:
    """Loads the written file `path` (to be renamed to `output`) in ONNX Runtime, where it is
    installed: what "wrote" promises.

    Raises:
        ConversionError: ONNX Runtime refuses the file (one line: its reason).
    """
    try:
        import onnxruntime
    except ImportError:
        logger.info("onnxruntime is not installed: %s was not test-loaded", output)
        return
    try:
        onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types (Fail, InvalidGraph...)
        reason = error_line(e, limit=None).replace(path, output)[:300]
        raise ConversionError(f"the converted model does not load in onnxruntime "
                              f"{onnxruntime.__version__} ({reason}), so {output} was not "
                              "written; try another --opset, else report it with this "
                              "command line") from None


def export_onnx(model_dir: str, output: str, task: Optional[str] = None,
                checkpoint: Optional[str] = None, opset: int = DEFAULT_OPSET,
                overwrite: bool = False) -> str:
    """Writes the discriminator or a fine-tuned task as one ONNX file (module docstring).

    Args:
        model_dir: a pretraining run directory, an exported discriminator SavedModel
            (`export/discriminator/STEP`, or `export/discriminator`: its newest version) or a
            fine-tuned model's SavedModel directory.
        output: the .onnx file to write (atomically: a temporary file, then a rename).
        task: which task of a multi-task fine-tuned model (None: its only one).
        checkpoint: a run directory's checkpoint prefix instead of the latest one.
        opset: ONNX opset to write.
        overwrite: replace `output` if it exists.

    Returns:
        output.

    Raises:
        ConversionError: bad input, the [onnx] extra missing or an unconvertible graph (one line).
    """
    _check_arguments(model_dir, output, opset, overwrite)
    # `export/discriminator` (TF Serving's base path) -> its newest version folder.
    model_dir = latest_version_dir(model_dir) or model_dir
    metadata = {"electra_tf.opset": str(opset), "electra_tf.export_precision": EXPORT_PRECISION}
    function, specs = _source_function(model_dir, task, checkpoint, metadata)
    logger.info("converting %s (%s) to ONNX opset %d", model_dir, metadata["electra_tf.signature"],
                opset)
    model = convert_function(function, specs, opset)
    _write_model(model, metadata, output)
    logger.info("wrote %s (%.1f MB): inputs %s, outputs %s", output, os.path.getsize(output) / 1e6,
                ", ".join(i.name for i in model.graph.input),
                ", ".join(o.name for o in model.graph.output))
    return output

