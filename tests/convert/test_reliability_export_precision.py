"""Exports say what their weights say whatever precision trained them (issue 47).

A run trained under `mixed_precision: "auto"` on a bf16-native device (this CPU's AVX512_BF16
picks mixed_bfloat16) exported SavedModels that computed in bf16: the replaced-token
probabilities differed from the Hugging Face export of the same weights by 2.3e-3, and
`to-onnx` of such a SavedModel printed "wrote" and exit 0 for a file ONNX Runtime cannot load.
Now every export computes in `export_precision` (float32 by default; bfloat16 on request,
recorded beside the export), and `to-onnx` refuses, in one line, a graph it cannot make loadable.
"""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import precision
from electra_tf.convert import onnx_export
from electra_tf.convert.__main__ import main as convert_main
from electra_tf.training.tf import export as export_lib
from electra_tf.training import run_dir
from tests import convert_fixtures as cf
from tests import fault_fixtures as faults
from tests.extras import import_extra

torch = pytest.importorskip("torch", reason="torch is a test extra (pip install -r requirements-test.txt)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is a test extra (pip install -r requirements-test.txt)")
ort = import_extra("onnxruntime", "onnx")
import_extra("tf2onnx", "onnx")

PROG = "python -m electra_tf.convert to-onnx"
TOLERANCE = 1e-4  # docs/conversion.md: the exports agree within 1e-4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory, its model loaded as a bf16-trained run has it (mixed_bfloat16), its
    default export and the Hugging Face export of the same checkpoint."""
    root = str(tmp_path_factory.mktemp("bf16_run"))
    vocab_path = cf.text_vocab_path(root, real=False)
    model_dir = cf.make_model_dir(root, cf.tiny_hparams(cf.vocab_size_of(vocab_path)),
                                  vocab_path)[0]
    with precision.keras_policy("mixed_bfloat16"):
        loaded = run_dir.load_run(model_dir)
    assert loaded.model.compute_dtype == "bfloat16"
    exported = export_lib.export_all(loaded.model, loaded.vocab, loaded.config, loaded.step)
    hf_dir = os.path.join(root, "hf")
    assert convert_main(["--quiet", "to-hf", "--model-dir", model_dir, "--output-dir", hf_dir]) == 0
    hf = transformers.ElectraForPreTraining.from_pretrained(hf_dir, local_files_only=True)
    inputs = cf.encode_text(vocab_path)
    _, logits = cf.hf_discriminator(hf, *inputs)
    return {"root": root, "model_dir": model_dir, "loaded": loaded, "inputs": inputs,
            "export": exported["discriminator"], "generator": exported["generator"],
            "hf_probs": 1.0 / (1.0 + np.exp(-logits))}


def _served(path, inputs):
    ids, mask, segments = (tf.constant(x) for x in inputs)
    signature = tf.saved_model.load(path).signatures["serving_default"]
    return signature(input_ids=ids, input_mask=mask, segment_ids=segments)


def _extra_config(path, name=run_dir.CONFIG_NAME):
    with open(os.path.join(path, export_lib.EXTRA_DIR, name), encoding="utf-8") as f:
        return json.load(f)


def _probs_difference(run, path) -> float:
    mask = run["inputs"][1].astype(bool)
    probs = _served(path, run["inputs"])["replaced_probs"].numpy()
    return float(np.max(np.abs(probs - run["hf_probs"])[mask]))


def test_a_bf16_trained_run_exports_float32_equal_to_hugging_face(run):
    # Before: 2.3e-3 on the run (9.9e-3 on these random weights); now ~1e-6.
    assert _probs_difference(run, run["export"]) < 1e-5
    signatures = [tf.saved_model.load(p).signatures["serving_default"]
                  for p in (run["export"], run["generator"])]
    assert not any(onnx_export.computes_in_bfloat16(s) for s in signatures)
    assert _extra_config(run["export"])["export_precision"] == "float32"
    assert _extra_config(run["generator"])["export_precision"] == "float32"


@pytest.fixture(scope="module")
def bf16_export(run, tmp_path_factory):
    """The same model exported with export_precision bfloat16."""
    loaded = run["loaded"]
    config = dataclasses.replace(loaded.config, export_precision="bfloat16",
                                 model_dir=str(tmp_path_factory.mktemp("bf16_export")))
    return export_lib.export_all(loaded.model, loaded.vocab, config, loaded.step)["discriminator"]


def test_bfloat16_on_request_is_bf16_and_recorded(run, bf16_export):
    assert onnx_export.computes_in_bfloat16(
        tf.saved_model.load(bf16_export).signatures["serving_default"])
    assert TOLERANCE < _probs_difference(run, bf16_export) < 0.05
    assert _extra_config(bf16_export)["export_precision"] == "bfloat16"


def test_in_export_precision_copies_the_weights_into_the_asked_policy():
    import keras

    from electra_tf.modeling.encoder import ElectraEncoder

    encoder = ElectraEncoder(vocab_size=30, hidden_size=16, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=32)
    assert precision.in_export_precision(encoder, "float32") is encoder
    copy = precision.in_export_precision(encoder, "bfloat16")
    assert copy.dtype_policy.name == "mixed_bfloat16"
    assert {layer.compute_dtype for layer in copy._flatten_layers()} == {"bfloat16"}
    assert len(copy.weights) == len(encoder.weights)
    for a, b in zip(copy.get_weights(), encoder.get_weights()):
        np.testing.assert_array_equal(a, b)
    ids = tf.constant([[2, 7, 9, 3]])
    inputs = {"input_ids": ids, "input_mask": tf.ones_like(ids), "segment_ids": tf.zeros_like(ids)}
    got = tf.cast(copy(inputs, training=False)["sequence_output"], tf.float32)
    want = encoder(inputs, training=False)["sequence_output"]
    assert 0 < np.max(np.abs(got - want)) < 0.1  # bf16 matmuls on the same weights
    assert keras.mixed_precision.global_policy().name == "float32"  # restored
    with pytest.raises(ValueError, match="export_precision must be one of float32, bfloat16"):
        precision.in_export_precision(encoder, "float16")


@pytest.mark.parametrize("value", ["bf16", "float16", "mixed_bfloat16"])
def test_export_precision_is_validated(value):
    from electra_tf.config import PretrainingConfig
    from electra_tf.finetuning.config import FinetuningConfig
    from electra_tf.config.hparams import ConfigError

    with pytest.raises(ConfigError, match="export_precision must be one of float32, bfloat16"):
        PretrainingConfig.create("x", "/tmp", {"export_precision": value})
    with pytest.raises(ConfigError, match="export_precision must be one of float32, bfloat16"):
        FinetuningConfig.create("x", "/tmp", {"task_names": ["toy"], "export_precision": value})


def test_to_onnx_refuses_a_bf16_saved_model_in_one_line(bf16_export, tmp_path, capsys):
    output = str(tmp_path / "d.onnx")
    code = convert_main(["--quiet", "to-onnx", "--model-dir", bf16_export, "--output", output])
    line = faults.one_error_line(code, capsys.readouterr().err, PROG)
    assert "computes in bfloat16" in line and "ONNX Runtime cannot run" in line, line
    assert "export_precision float32" in line, line
    assert os.listdir(tmp_path) == []


def test_to_onnx_checks_the_file_loads_before_writing_it(bf16_export, tmp_path, capsys,
                                                         monkeypatch):
    # Without the bf16 check, tf2onnx converts the bf16 graph into a file ONNX Runtime cannot
    # load (the "wrote" and exit 0): the load check refuses it and leaves nothing.
    monkeypatch.setattr(onnx_export, "computes_in_bfloat16", lambda function: False)
    out = tmp_path / "out"
    out.mkdir()
    output = str(out / "d.onnx")
    code = convert_main(["--quiet", "to-onnx", "--model-dir", bf16_export, "--output", output])
    line = faults.one_error_line(code, capsys.readouterr().err, PROG)
    assert "does not load in onnxruntime" in line and f"{output} was not written" in line, line
    assert ".tmp-" not in line, line
    assert os.listdir(out) == []


def test_to_onnx_from_the_bf16_run_directory_equals_its_saved_model(run, tmp_path):
    output = str(tmp_path / "d.onnx")
    assert convert_main(["--quiet", "to-onnx", "--model-dir", run["model_dir"], "--output", output]) == 0
    session = ort.InferenceSession(output, providers=["CPUExecutionProvider"])
    ids, mask, segments = run["inputs"]
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(None, {"input_ids": ids, "input_mask": mask,
                                             "segment_ids": segments})))
    want = _served(run["export"], run["inputs"])
    for name in ("replaced_probs", "sequence_output"):
        # Before: 1e-3 / 0.047 from the run's bf16 SavedModel.
        assert np.max(np.abs(got[name] - want[name].numpy())) <= TOLERANCE, name
    import onnx

    metadata = {p.key: p.value for p in onnx.load(output).metadata_props}
    assert metadata["electra_tf.export_precision"] == "float32"


def _toy_task(raw):
    os.makedirs(os.path.join(raw, "toy"))
    rows = "".join(f"the {w} cat\t{'pos' if w == 'good' else 'neg'}\n" for w in ("good", "bad") * 4)
    for split in ("train", "dev"):
        with open(os.path.join(raw, "toy", f"{split}.tsv"), "w") as f:
            f.write("text\tlabel\n" + rows)


@pytest.mark.slow  # a fine-tuned model exported twice and converted: ~80 s on 2 cores
def test_a_fine_tuned_bf16_model_exports_float32_unless_asked(tmp_path, capsys):
    from electra_tf.data.text.tokenization import Tokenizer
    from electra_tf.finetuning import runner
    from electra_tf.finetuning.config import FinetuningConfig
    from electra_tf.finetuning.encoding import TextEncoder
    from electra_tf.finetuning.export import CONFIG_FILE, FinetunedModule, export_finetuned
    from electra_tf.finetuning.pretrained import load_pretrained
    from electra_tf.finetuning.registry import build_task
    from tests.finetuning_fixtures import tiny_pretrained, write_vocab

    root = str(tmp_path)
    tiny_pretrained(root, write_vocab(os.path.join(root, "words.txt"),
                                      ["the", "cat", "good", "bad"]), max_seq_length=16)
    _toy_task(os.path.join(root, "raw"))
    config = FinetuningConfig.create("tiny", root, {
        "task_names": ["toy"], "max_seq_length": 16, "raw_data_dir": os.path.join(root, "raw")})
    pretrained = load_pretrained(config)
    tokenizer = Tokenizer(pretrained.vocab, do_lower_case=True, strip_accents=True)
    tasks = [build_task("toy", config, pretrained, tokenizer, TextEncoder(tokenizer, 16))]
    with precision.keras_policy("mixed_bfloat16"):  # as fine-tuning under "auto" here
        model = runner.build_model(pretrained, tasks, seed=1)
        exports = {}
        for value in ("float32", "bfloat16"):
            module = FinetunedModule(model, tasks, value)
            exports[value] = export_finetuned(module, os.path.join(root, f"toy_{value}"),
                                              config.to_json(), pretrained.vocab.path)
    reference = FinetunedModule(runner.build_model(pretrained, tasks, seed=1), tasks)
    assert reference.model.compute_dtype == "float32"
    ids = tf.constant([[2, 5, 6, 3, 0], [2, 7, 3, 0, 0]], tf.int32)
    mask = tf.cast(ids > 0, tf.int32)
    feeds = {"input_ids": ids, "input_mask": mask, "segment_ids": tf.zeros_like(ids)}
    want = reference.signature_functions["toy_ids"](**feeds)["probabilities"].numpy()
    for value, path in exports.items():
        signature = tf.saved_model.load(path).signatures["toy_ids"]
        assert onnx_export.computes_in_bfloat16(signature) == (value == "bfloat16")
        difference = np.max(np.abs(signature(**feeds)["probabilities"].numpy() - want))
        assert difference < 1e-6 if value == "float32" else difference > 1e-6
        assert _extra_config(path, CONFIG_FILE)["export_precision"] == value
    output = str(tmp_path / "toy.onnx")
    code = convert_main(["--quiet", "to-onnx", "--model-dir", exports["bfloat16"], "--output", output])
    line = faults.one_error_line(code, capsys.readouterr().err, PROG)
    assert "computes in bfloat16" in line and "fine-tune it again with export_precision float32" \
        in line, line
    assert not os.path.exists(output)
    assert convert_main(["--quiet", "to-onnx", "--model-dir", exports["float32"], "--output", output]) == 0
    ort.InferenceSession(output, providers=["CPUExecutionProvider"])
