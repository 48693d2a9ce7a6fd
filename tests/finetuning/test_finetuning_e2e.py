"""Fine-tuning end to end on tiny models: from a model dir, from an exported SavedModel, the
raw-text SavedModel export reloaded in a fresh process, and the CLI's error handling."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.encoding import TextEncoder
from electra_tf.finetuning.export import FinetunedModule, export_finetuned
from electra_tf.finetuning.pretrained import PretrainedError, load_pretrained
from electra_tf.finetuning.classification.task import ClassificationTask
from electra_tf.vocab import REQUIRED_TOKENS
from tests.finetuning_fixtures import TINY_MODEL, corpus_tasks_dir, tiny_pretrained

from tests.pretraining_fixtures import REPO_ROOT
POSITIVE = ["good", "great", "fine"]
NEGATIVE = ["bad", "awful", "poor"]
FILLER = ["the", "a", "movie", "film", "was", "is", "plot", "actor", "very", "not"]
SEQ = 24
FAST = {"max_seq_length": SEQ, "train_batch_size": 16, "eval_batch_size": 32, "learning_rate": 1e-3,
        "log_steps": 1000, "mixed_precision": "float32"}  # auto would be bf16 on AMX CPUs


def _rows(rng, n):
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(FILLER) for _ in range(rng.randint(2, 8))]
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label == "pos" else NEGATIVE))
        rows.append((" ".join(words), label))
    return rows


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """DATA_DIR with a tiny pretraining model dir (+ its exported SavedModel) and a toy task whose
    label is set by one sentiment word among random filler."""
    root = str(tmp_path_factory.mktemp("ft"))
    vocab_path = os.path.join(root, "toy_vocab.txt")
    with open(vocab_path, "w") as f:
        f.write("\n".join(list(REQUIRED_TOKENS) + POSITIVE + NEGATIVE + FILLER) + "\n")
    world = tiny_pretrained(root, vocab_path, max_seq_length=SEQ)
    rng = random.Random(0)
    task_dir = os.path.join(root, "finetuning_data", "toy")
    os.makedirs(task_dir)
    for split, n in (("train", 192), ("dev", 64), ("test", 64)):
        with open(os.path.join(task_dir, f"{split}.tsv"), "w") as f:
            f.write("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in _rows(rng, n)))
    return world


def _config(world, **hparams):
    return FinetuningConfig.create("tiny", world["root"], dict(FAST, task_names=["toy"], **hparams))


def test_finetuning_from_a_model_dir_learns_a_separable_task(world):
    config = _config(world, num_train_epochs=8, num_trials=2)
    results = runner.run(config)
    assert results["init"]["kind"] == "model_dir"
    for split in ("dev", "test"):
        accuracy = results["summary"]["toy"][split]["accuracy"]
        assert accuracy["mean"] >= 95.0, (split, accuracy)
    assert [t["seed"] for t in results["trials"]] == [0, 1]
    assert all(os.path.isfile(os.path.join(t["export"], "saved_model.pb")) for t in results["trials"])
    with open(config.results_json) as f:
        assert json.load(f)["summary"] == results["summary"]
    with open(config.results_txt) as f:
        text = f.read()
    # Official lines (one per trial and task, 2 decimals), then the mean and std over trials.
    assert text.count("toy: accuracy: ") == 2 and "toy test: accuracy: " in text
    assert "toy dev accuracy:" in text
    # Outputs are never replaced silently.
    with pytest.raises(runner.FinetuningError, match="already exists; pass --overwrite"):
        runner.run(config)


def test_a_random_init_floor_uses_the_configured_sizes(world):
    config = _config(world, random_init=True, do_train=False,
                     model_hparam_overrides={"hidden_size": 16, "num_hidden_layers": 1},
                     vocab_size=len(POSITIVE + NEGATIVE + FILLER) + 5, results_json=os.path.join(
                         world["root"], "r", "random.json"), results_txt=os.path.join(world["root"], "r", "random.txt"))
    results = runner.run(config)
    assert results["init"]["kind"] == "random"
    assert results["init"]["encoder_config"]["num_hidden_layers"] == 1
    assert "export" not in results["trials"][0]  # nothing trained, nothing exported
    assert results["precision"] == {"policy": "float32", "reason": "set explicitly"}


def test_auto_precision_is_resolved_without_loss_scaling_and_recorded(world, monkeypatch):
    """Fine-tuning's "auto" on an old GPU takes float32 (no loss scaling here), on a bf16 CPU
    mixed_bfloat16; the results JSON says which and why."""
    from electra_tf import precision

    config = _config(world, random_init=True, do_train=False, mixed_precision="auto",
                     model_hparam_overrides={"hidden_size": 16, "num_hidden_layers": 1},
                     vocab_size=len(POSITIVE + NEGATIVE + FILLER) + 5, results_json=os.path.join(
                         world["root"], "r", "auto.json"), results_txt=os.path.join(world["root"], "r", "auto.txt"))
    v100 = precision.DeviceFacts("gpu", "Tesla V100", compute_capability=(7, 0))
    monkeypatch.setattr(precision, "detect", lambda strategy=None: v100)
    results = runner.run(config)
    assert results["precision"]["policy"] == "float32"
    assert "float16 needs loss scaling" in results["precision"]["reason"]
    with open(config.results_json) as f:
        assert json.load(f)["precision"] == results["precision"]


def test_saved_model_and_model_dir_starts_load_the_same_encoder_weights(world):
    from_dir = load_pretrained(_config(world))
    from_export = load_pretrained(_config(world, init_checkpoint=world["export"]))
    checkpoint = os.path.join(world["model_dir"], "ckpt-1")
    from_checkpoint = load_pretrained(_config(world, init_checkpoint=checkpoint))
    assert (from_dir.kind, from_export.kind, from_checkpoint.kind) == ("model_dir", "saved_model", "checkpoint")
    reference = world["discriminator"].get_weights()
    for pretrained in (from_dir, from_export, from_checkpoint):
        assert len(pretrained.weights) == len(reference)
        for got, want in zip(pretrained.weights, reference):
            np.testing.assert_array_equal(got, want)
    # SH-11: the model gets exactly the loaded encoder; its head is fresh (seeded), never loaded.
    task = ClassificationTask("toy", _config(world), TextEncoder(Tokenizer(from_dir.vocab), SEQ))
    model = runner.build_model(from_dir, [task], seed=7)
    for got, want in zip(model.encoder.get_weights(), reference):
        np.testing.assert_array_equal(got, want)
    fresh = runner.build_model(from_dir._replace(weights=None), [task], seed=7)
    for got, want in zip(model.task_heads.get_weights(), fresh.task_heads.get_weights()):
        np.testing.assert_array_equal(got, want)
    # And a fine-tune starting from the SavedModel trains the encoder it loaded.
    config = _config(world, init_checkpoint=world["export"], num_train_epochs=1, model_dir=os.path.join(
        world["root"], "from_export"), results_json=os.path.join(world["root"], "r", "export.json"),
        results_txt=os.path.join(world["root"], "r", "export.txt"))
    results = runner.run(config)
    assert results["init"]["kind"] == "saved_model" and results["trials"][0]["steps"] == 12
    with pytest.raises(PretrainedError, match="does not exist"):
        load_pretrained(_config(world, init_checkpoint=os.path.join(world["root"], "missing")))


def test_exported_text_signature_in_a_fresh_process_matches_in_memory(world, tmp_path):
    # A sentence-pair task, so both inputs and the segment ids go through the export.
    rng = random.Random(1)
    task_dir = tmp_path / "raw" / "pairs"
    task_dir.mkdir(parents=True)
    with open(task_dir / "train.tsv", "w") as f:
        f.write("text\ttext_b\tlabel\n")
        for (a, label), (b, _) in zip(_rows(rng, 64), _rows(rng, 64)):
            f.write(f"{a}\t{b}\t{label}\n")
    config = FinetuningConfig.create("tiny", world["root"], dict(
        FAST, task_names=["pairs"], raw_data_dir=str(tmp_path / "raw"), num_train_epochs=1))
    pretrained = load_pretrained(config)
    encoder = TextEncoder(Tokenizer(pretrained.vocab), SEQ)
    task = ClassificationTask("pairs", config, encoder)
    model = runner.build_model(pretrained, [task], seed=3)
    table = runner.training_table([task], config.train_batch_size, SEQ)
    runner.train(model, table, config, seed=3, task_names=["pairs"])
    module = FinetunedModule(model, [task])
    target = export_finetuned(module, str(tmp_path / "export"), config.to_json(), pretrained.vocab.path)

    texts_a = ["good movie", "the plot was awful very very " * 6, "not fine"]
    texts_b = ["a film", "bad", "great actor was very good"]
    in_memory = module.signature_functions["serving_default"](
        text=tf.constant(texts_a), text_b=tf.constant(texts_b))
    # The training-feature path (padded to max_seq_length) gives the same logits.
    train_path = runner.predict(model, "pairs", encoder.encode_examples(texts_a, texts_b), 8)["logits"]
    np.testing.assert_allclose(in_memory["logits"].numpy(), train_path, rtol=1e-5, atol=1e-5)
    code = (
        "import json, sys, tensorflow as tf, tensorflow_text\n"
        f"m = tf.saved_model.load({target!r})\n"
        "fn = m.signatures['serving_default']\n"
        f"out = fn(text=tf.constant({texts_a!r}), text_b=tf.constant({texts_b!r}))\n"
        "print(json.dumps({'probabilities': out['probabilities'].numpy().tolist(),\n"
        "                  'labels': [s.decode() for s in out['labels'].numpy()],\n"
        "                  'signatures': sorted(m.signatures)}))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    served = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(served["probabilities"], in_memory["probabilities"].numpy(),
                               rtol=1e-5, atol=1e-6)
    assert served["labels"] == [s.decode() for s in in_memory["labels"].numpy()]
    assert served["signatures"] == ["pairs", "pairs_ids", "serving_default"]


def test_cli_reports_bad_input_in_one_line(world):
    script = os.path.join(REPO_ROOT, "run_finetuning.py")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO_ROOT)
    proc = subprocess.run([sys.executable, script, "--data-dir", world["root"], "--model-name", "tiny",
                           "--hparams", '{"task_names": ["toy"], "learning_rat": 1}'],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 2
    assert "run_finetuning.py: error: Unknown hparam 'learning_rat'; did you mean 'learning_rate'?" in proc.stderr


def test_learning_the_source_of_corpus_sentences_beats_the_majority_class(tmp_path):
    """Classification family: which corpus (austen, foldoc, lee, wiki) a real sentence is from."""
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["source"], num_train=800, num_dev=200)
    config = FinetuningConfig.create("m", os.path.join(REPO_ROOT, "pretrain_data"), dict(
        TINY_MODEL, task_names=["source"], random_init=True, raw_data_dir=raw, max_seq_length=48,
        learning_rate=1e-3, num_train_epochs=3, do_export=False, log_steps=1000,
        results_json=str(tmp_path / "r.json"), results_txt=str(tmp_path / "r.txt")))
    results = runner.run(config)
    dev = results["trials"][0]["metrics"]["source"]["dev"]
    assert results["data"]["source"]["labels"] == ["austen", "foldoc", "lee", "wiki"]
    assert dev["accuracy"] > 25.0 + 25, dev  # balanced classes: the majority class is 25%
