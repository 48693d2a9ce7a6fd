"""SavedModel export: at the end of training and on demand from a checkpoint.

Each SavedModel is loaded in a FRESH Python process with `tf.saved_model.load` only (plus
`import tensorflow_text`, which registers the tokenizer's ops), from a directory where the project
is not importable, and its outputs are compared with the in-memory model's on the same inputs.
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.training import run_dir
from electra_tf.training.tf import export as export_lib, hub, trainer as trainer_lib
from electra_tf.vocab import load_vocab
from tests import pretraining_fixtures as fx

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "##s", "hello", "world", ".", ",", "!", "un",
         "##bel", "##iev", "##able", "cafe", "a"]
TEXTS = ["The cats sat on the MAT.", "Hello, world!", "Café unbelievable",
         "the dog " * 30,  # 60 words: truncated to max_seq_length
         ""]
LOAD_TIMEOUT_SECONDS = 180

# Runs in a fresh interpreter; prints nothing but errors; writes outputs to an .npz.
LOADER = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # registers the tokenizer ops used by serve_text

args = json.loads(sys.argv[1])
inputs = dict(np.load(args["inputs"]))
texts = json.loads(args["texts"])
out, specs = {}, {}
for tag, path in args["models"].items():
    model = tf.saved_model.load(path)
    for name, fn in model.signatures.items():
        _, kwargs = fn.structured_input_signature
        specs[f"{tag}/{name}"] = {k: [v.dtype.name, v.shape.as_list()] for k, v in kwargs.items()}
        if name == "serve_text":
            result = fn(text=tf.constant(texts))
        else:
            result = fn(**{k: tf.constant(inputs[k]) for k in kwargs})
        for key, value in result.items():
            out[f"{tag}/{name}/{key}"] = value.numpy()
if any(m == "electra_tf" or m.startswith("electra_tf.") for m in sys.modules):
    raise SystemExit("electra_tf was imported")
np.savez(args["output"], **out)
with open(args["specs"], "w") as f:
    json.dump(specs, f)
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    data_dir = str(root / "data")
    vocab = fx.vocab_tokens(fx.VOCAB_SIZE - 5 - len(WORDS)) + WORDS
    fx.write_dataset(data_dir, vocab=vocab)
    hparams = dict(num_train_steps=2, iterations_per_loop=2, save_checkpoints_steps=2)
    train_config = fx.tiny_config(data_dir, "exp", do_export=True, **hparams)
    trained = trainer_lib.run(train_config)
    model_dir = train_config.model_dir
    end_of_training = os.path.join(model_dir, "export_end_of_training")
    os.replace(os.path.join(model_dir, "export"), end_of_training)
    checkpoints_before = sorted(os.listdir(model_dir))
    config_before = open(os.path.join(model_dir, "config.json"), "rb").read()

    # On demand, from the existing checkpoint: {"do_train": false, "do_export": true}.
    export_config = fx.tiny_config(data_dir, "exp", do_train=False, do_export=True, **hparams)
    on_demand = trainer_lib.run(export_config)

    # The in-memory model: the run's final checkpoint, restored.
    in_memory = trainer_lib.Trainer(fx.tiny_config(data_dir, "exp", do_train=False, do_eval=True,
                                                   **hparams))
    rng = np.random.default_rng(5)
    lengths = [32, 20, 7]
    inputs = {"input_ids": rng.integers(5, fx.VOCAB_SIZE, (3, 32)).astype(np.int32),
              "input_mask": np.array([[1] * n + [0] * (32 - n) for n in lengths], np.int32),
              "segment_ids": np.array([[0] * 10 + [1] * 22] * 3, np.int32)}
    inputs["input_ids"] *= inputs["input_mask"]
    inputs_path = str(root / "inputs.npz")
    np.savez(inputs_path, **inputs)
    models = {"end_disc": os.path.join(end_of_training, "discriminator", "2"),
              "end_gen": os.path.join(end_of_training, "generator", "2"),
              "disc": on_demand["export"]["discriminator"],
              "gen": on_demand["export"]["generator"]}
    args = {"inputs": inputs_path, "texts": json.dumps(TEXTS), "models": models,
            "output": str(root / "outputs.npz"), "specs": str(root / "specs.json")}
    env = fx.subprocess_env()
    env.pop("PYTHONPATH")  # the project must not be importable in the loading process
    result = subprocess.run([sys.executable, "-c", LOADER, json.dumps(args)], cwd=str(root),
                            env=env, capture_output=True, text=True, timeout=LOAD_TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"trained": trained, "on_demand": on_demand, "model_dir": model_dir,
            "checkpoints_before": checkpoints_before, "config_before": config_before,
            "trainer": in_memory, "inputs": inputs, "outputs": dict(np.load(args["output"])),
            "specs": json.load(open(args["specs"])), "vocab": load_vocab(train_config.vocab_file)}


def _reference(trainer, inputs):
    """The in-memory model's outputs, computed directly from its layers."""
    model = trainer.model
    features = {k: tf.constant(v) for k, v in inputs.items()}
    sequence_output = model.discriminator(features, training=False)["sequence_output"]
    probs = tf.sigmoid(tf.cast(model.discriminator_head(sequence_output), tf.float32))
    encoder = model.mlm_encoder
    hidden = encoder(features, training=False)["sequence_output"]
    logits = model.generator_head(hidden, encoder.embeddings.word_embeddings.embeddings)
    return {"replaced_probs": probs.numpy(), "sequence_output": sequence_output.numpy(),
            "mlm_logits": logits.numpy()}


def test_exports_written_at_end_of_training_and_on_demand(exported):
    model_dir = exported["model_dir"]
    # TF Serving's layout: a numeric version folder (the global step) per network.
    assert exported["trained"]["export"] == {
        "discriminator": os.path.join(model_dir, "export", "discriminator", "2"),
        "generator": os.path.join(model_dir, "export", "generator", "2")}
    for path in exported["on_demand"]["export"].values():
        assert tf.saved_model.contains_saved_model(path)
        extra = os.path.join(path, "assets.extra")
        assert open(os.path.join(extra, "vocab.txt")).read().split("\n")[:5] == [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        assert json.load(open(os.path.join(extra, "config.json")))["model_name"] == "exp"
    # The export-only run trained nothing and left the run's config alone.
    assert exported["on_demand"]["final"]["global_step"] == 2 and "train" not in exported["on_demand"]
    def checkpoints(names):
        return sorted(f for f in names if f.startswith("ckpt-") or f == "checkpoint")

    assert checkpoints(os.listdir(model_dir)) == checkpoints(exported["checkpoints_before"])
    assert open(os.path.join(model_dir, "config.json"), "rb").read() == exported["config_before"]
    for network in ("discriminator", "generator"):
        assert os.listdir(os.path.join(model_dir, "export", network)) == ["2"]


def test_signatures_take_int32_ids_and_raw_strings(exported):
    specs = exported["specs"]
    ids = {name: ["int32", [None, None]] for name in ("input_ids", "input_mask", "segment_ids")}
    for tag in ("disc", "end_disc", "gen", "end_gen"):
        assert specs[f"{tag}/serving_default"] == ids
    assert specs["disc/serve_text"] == {"text": ["string", [None]]}
    assert set(k for k in specs if k.startswith("gen/")) == {"gen/serving_default"}


@pytest.mark.parametrize("tag", ["disc", "end_disc"])
def test_discriminator_outputs_equal_in_memory_model(exported, tag):
    out, ref = exported["outputs"], _reference(exported["trainer"], exported["inputs"])
    probs = out[f"{tag}/serving_default/replaced_probs"]
    sequence_output = out[f"{tag}/serving_default/sequence_output"]
    assert probs.shape == (3, 32) and probs.dtype == np.float32
    assert sequence_output.shape == (3, 32, 64)
    np.testing.assert_allclose(probs, ref["replaced_probs"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(sequence_output, ref["sequence_output"], atol=1e-5, rtol=0)
    assert ((probs > 0) & (probs < 1)).all()


@pytest.mark.parametrize("tag", ["gen", "end_gen"])
def test_generator_outputs_equal_in_memory_model(exported, tag):
    logits = exported["outputs"][f"{tag}/serving_default/mlm_logits"]
    assert logits.shape == (3, 32, fx.VOCAB_SIZE)
    ref = _reference(exported["trainer"], exported["inputs"])["mlm_logits"]
    np.testing.assert_allclose(logits, ref, atol=1e-5, rtol=0)


def test_serve_text_tokenizes_like_the_project_tokenizer(exported):
    out, vocab = exported["outputs"], exported["vocab"]
    tokenizer = Tokenizer(vocab, do_lower_case=True, strip_accents=True)
    special = vocab.special
    expected = [[special.cls_id] + tokenizer.encode(t)[:fx.MAX_SEQ_LENGTH - 2] + [special.sep_id]
                for t in TEXTS]
    width = max(len(e) for e in expected)
    assert width == fx.MAX_SEQ_LENGTH  # the long text was truncated to max_seq_length
    ids = out["disc/serve_text/input_ids"]
    mask = out["disc/serve_text/input_mask"]
    assert ids.shape == (len(TEXTS), width)
    for row, (e, got, m) in enumerate(zip(expected, ids, mask)):
        assert got.tolist() == e + [0] * (width - len(e)), row
        assert m.tolist() == [1] * len(e) + [0] * (width - len(e)), row
    # The vocab's real words were found (not all [UNK]).
    assert tokenizer.wordpieces("The cats sat") == ["the", "cat", "##s", "sat"]
    assert tokenizer.wordpieces("unbelievable") == ["un", "##bel", "##iev", "##able"]
    # serve_text's model outputs are the in-memory model's on those ids.
    ref = _reference(exported["trainer"], {"input_ids": ids, "input_mask": mask,
                                           "segment_ids": np.zeros_like(ids)})
    np.testing.assert_allclose(out["disc/serve_text/replaced_probs"], ref["replaced_probs"],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["disc/serve_text/sequence_output"], ref["sequence_output"],
                               atol=1e-5, rtol=0)


def test_tokenization_settings_come_from_the_dataset_manifest(exported, tmp_path):
    config = exported["trainer"].config
    settings = run_dir.tokenization_settings(config)
    assert settings.source == os.path.join(config.model_dir, run_dir.DATASET_MANIFEST_COPY)
    assert (settings.do_lower_case, settings.strip_accents) == (True, True)
    # A dataset built without lowercasing is served without lowercasing.
    manifest = json.load(open(settings.source))
    manifest.update(do_lower_case=False, strip_accents=False)
    model_dir = str(tmp_path / "run")
    os.makedirs(model_dir)
    with open(os.path.join(model_dir, run_dir.DATASET_MANIFEST_COPY), "w") as f:
        json.dump(manifest, f)
    cased = run_dir.tokenization_settings(dataclasses.replace(config, model_dir=model_dir))
    assert (cased.do_lower_case, cased.strip_accents) == (False, False)


def test_reexport_replaces_previous_export_atomically(exported):
    trainer = exported["trainer"]
    config = trainer.config
    target = os.path.join(config.model_dir, "export", "generator", "2")
    marker = os.path.join(target, "old_marker")
    open(marker, "w").close()
    paths = export_lib.export_all(trainer.model, trainer.vocab, config, step=2)
    assert paths["generator"] == target and not os.path.exists(marker)
    assert tf.saved_model.contains_saved_model(target)
    leftovers = [f for f in os.listdir(os.path.dirname(target)) if f.startswith(".")]
    assert leftovers == []


def test_reexport_at_a_later_step_is_a_new_version_and_replaces_the_older(exported, tmp_path):
    trainer = exported["trainer"]
    config = dataclasses.replace(trainer.config, model_dir=str(tmp_path / "run"))
    base = os.path.join(config.model_dir, "export", "generator")
    # An export written before version folders existed: a SavedModel in the base itself.
    os.makedirs(os.path.join(base, "variables"))
    open(os.path.join(base, "saved_model.pb"), "wb").close()
    open(os.path.join(base, "README.user"), "w").close()  # not ours: kept
    first = export_lib.export_all(trainer.model, trainer.vocab, config, step=5)["generator"]
    assert first == os.path.join(base, "5")
    assert sorted(os.listdir(base)) == ["5", "README.user"]
    second = export_lib.export_all(trainer.model, trainer.vocab, config, step=7)["generator"]
    assert sorted(os.listdir(base)) == ["7", "README.user"]
    assert hub.version_dirs(base) == [7] and hub.latest_version_dir(base) == second
    assert hub.latest_version_dir(second) == second and hub.latest_version_dir(str(tmp_path)) is None


def test_discriminator_is_a_reusable_saved_model_that_fine_tunes(exported):
    """TF Hub's reusable SavedModel: __call__ (training False/True), variables,
    trainable_variables, regularization_losses; gradients reach the loaded variables and a step
    changes them and the outputs."""
    loaded = tf.saved_model.load(exported["on_demand"]["export"]["discriminator"])
    trainer = exported["trainer"]
    expected = (trainer.model.discriminator.trainable_variables
                + trainer.model.discriminator_head.trainable_variables)
    assert len(loaded.trainable_variables) == len(expected)
    assert sorted(tuple(v.shape) for v in loaded.trainable_variables) == sorted(
        tuple(v.shape) for v in expected)
    assert len(loaded.variables) >= len(loaded.trainable_variables)
    assert list(loaded.regularization_losses) == []
    assert set(loaded.signatures) == {"serving_default", "serve_text"}  # today's, kept
    inputs = {k: tf.constant(v) for k, v in exported["inputs"].items()}
    before = loaded(inputs, training=False)
    reference = _reference(trainer, exported["inputs"])
    np.testing.assert_allclose(before["replaced_probs"].numpy(), reference["replaced_probs"],
                               atol=1e-5, rtol=0)
    # training=True applies dropout (the fixture's run has the default 0.1).
    assert not np.allclose(loaded(inputs, training=True)["sequence_output"].numpy(),
                           before["sequence_output"].numpy())
    values = [v.numpy() for v in loaded.trainable_variables]
    with tf.GradientTape() as tape:
        outputs = loaded(inputs, training=True)
        loss = (tf.reduce_mean(tf.square(outputs["sequence_output"]))
                + tf.reduce_mean(outputs["replaced_logits"]))
    grads = tape.gradient(loss, loaded.trainable_variables)
    assert all(g is not None for g in grads)
    assert all(float(tf.norm(tf.convert_to_tensor(g))) > 0 for g in grads)
    for variable, grad in zip(loaded.trainable_variables, grads):
        variable.assign_sub(0.1 * tf.convert_to_tensor(grad))
    changed = [not np.array_equal(v.numpy(), old) for v, old in zip(loaded.trainable_variables, values)]
    assert all(changed)
    after = loaded(inputs, training=False)
    assert not np.allclose(after["sequence_output"].numpy(), before["sequence_output"].numpy())
    # The signatures read the same (updated) variables.
    served = loaded.signatures["serving_default"](**inputs)
    np.testing.assert_allclose(served["sequence_output"].numpy(), after["sequence_output"].numpy(),
                               atol=1e-5, rtol=0)
