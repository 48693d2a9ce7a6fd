"""Every task family from every starting point (model directory, checkpoint prefix, exported
SavedModel, random init), with layer-wise LR decay, several trials, a multi-family run, and the
raw-text exports of each (tasks built from the default corpus; a tiny pretrained model)."""

import os

import keras
import pytest
import tensorflow as tf

from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.training.tf import graph_leaks
from tests.finetuning_fixtures import REAL_VOCAB, corpus_tasks_dir, need_real_data, tiny_pretrained

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    need_real_data()
    root = str(tmp_path_factory.mktemp("start"))
    world = tiny_pretrained(root, REAL_VOCAB, max_seq_length=64)
    world["raw"] = corpus_tasks_dir(os.path.join(root, "raw"), ["sts", "chunk", "squad", "squadv1",
                                                                "newsqa"], num_train=64, num_dev=24)
    return world


def _run(world, tasks, **hparams):
    name = "_".join(tasks) + "_" + hparams.pop("label", "")
    values = dict(task_names=tasks, raw_data_dir=world["raw"], max_seq_length=64,
                  max_query_length=24, doc_stride=32, num_train_epochs=1, log_steps=1000,
                  learning_rate=1e-3, model_dir=os.path.join(world["root"], "ft", name),
                  results_json=os.path.join(world["root"], "results", name, "r.json"),
                  results_txt=os.path.join(world["root"], "results", name, "r.txt"))
    values.update(hparams)
    config = FinetuningConfig.create("tiny", world["root"], values)
    return config, runner.run(config)


def test_sts_from_the_model_dir_with_two_trials_the_last_exported(world, monkeypatch):
    written, registered = [], []
    write = runner._write_results
    monkeypatch.setattr(runner, "_write_results",
                        lambda config, results: (written.append(len(results["trials"])),
                                                 registered.append(
                                                     graph_leaks.registered_custom_gradients()),
                                                 write(config, results)))
    before = graph_leaks.registered_custom_gradients()
    config, results = _run(world, ["sts"], num_trials=2, keep_all_models=False)
    assert written == [1, 2]  # results rewritten after every trial (SH-12)
    # Each trial's traced graphs were released with it, the run's with the run
    # (tests/training/test_graph_leaks.py has the mechanism).
    assert registered[0] == registered[1] and graph_leaks.registered_custom_gradients() == before
    assert results["init"]["kind"] == "model_dir"
    assert [t["seed"] for t in results["trials"]] == [0, 1]
    assert set(results["summary"]["sts"]["dev"]) == {"pearson", "spearman", "mse", "loss"}
    lines = open(config.results_txt).read().splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["sts", "sts"]
    assert "export" not in results["trials"][0]  # keep_all_models: false
    model = tf.saved_model.load(results["trials"][1]["export"])
    out = model.signatures["sts"](text=tf.constant(["A cat sat on the mat."]),
                                  text_b=tf.constant(["A cat sat."]))
    assert float(out["scores"][0]) == pytest.approx(5 * float(out["predictions"][0]), rel=1e-5)


def test_chunk_from_a_checkpoint_prefix_with_the_depth_gap_fix(world):
    config, results = _run(world, ["chunk"], init_checkpoint=world["checkpoint"],
                           layerwise_lr_decay_fix=True)
    assert results["init"]["kind"] == "checkpoint"
    assert set(results["trials"][0]["metrics"]["chunk"]["dev"]) == {"precision", "recall", "f1",
                                                                    "loss"}
    model = tf.saved_model.load(results["trials"][0]["export"])
    out = model.signatures["serving_default"](text=tf.constant(["The cat sat on 3 mats .", "Hi"]))
    assert out["tags"].shape == (2, 7) and out["num_words"].numpy().tolist() == [7, 1]
    labels = set(results["data"]["chunk"]["labels"])
    assert {t.decode() for t in out["tags"].numpy().ravel()} <= labels | {""}


def test_squad_from_an_exported_saved_model(world):
    config, results = _run(world, ["squad"], init_checkpoint=world["export"])
    assert results["init"]["kind"] == "saved_model"
    dev = results["trials"][0]["metrics"]["squad"]["dev"]
    assert {"HasAns_exact", "NoAns_exact", "best_f1_thresh", "exact", "f1"} <= set(dev)
    assert os.path.isfile(os.path.join(os.path.dirname(config.results_json), "squad_qa",
                                       "squad_null_odds.json"))
    model = tf.saved_model.load(results["trials"][0]["export"])
    context = "The bridge was opened in 1932 and carries 8 lanes."
    out = model.signatures["squad"](question=tf.constant(["The bridge was opened in what year"]),
                                    context=tf.constant([context]))
    start, end = int(out["answer_start"][0]), int(out["answer_end"][0])
    assert context[start:end] == out["answer"][0].numpy().decode()


def test_newsqa_from_random_init(world):
    _, results = _run(world, ["newsqa"], random_init=True, vocab_size=30522,
                      model_hparam_overrides={"hidden_size": 32, "num_hidden_layers": 1,
                                              "num_attention_heads": 2, "intermediate_size": 64},
                      embedding_size=16, do_export=False)
    assert results["init"]["kind"] == "random"
    assert set(results["trials"][0]["metrics"]["newsqa"]["dev"]) == {"exact_match", "f1"}


def test_one_run_of_three_families_shares_the_encoder(world):
    config, results = _run(world, ["sts", "chunk", "squadv1"], layerwise_lr_decay=0.5,
                           do_export=False)
    assert set(results["trials"][0]["metrics"]) == {"sts", "chunk", "squadv1"}
    records = sum(results["data"][t]["train" if t != "squadv1" else "train_records"]
                  for t in ("chunk", "squadv1")) + 2 * 64
    assert results["trials"][0]["steps"] == -(-records // 32)  # one epoch over every record
    lines = open(config.results_txt).read().splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["sts", "chunk", "squadv1"]


def test_an_export_serves_every_task_of_the_run():
    from electra_tf.finetuning.export import FinetunedModule, TaskServing

    class Fake:
        def __init__(self, name, labels=None):
            self.name, self.labels = name, labels

        def serving(self, model):
            fn = tf.function(lambda text: {"x": text}, input_signature=[tf.TensorSpec([None], tf.string)])
            return TaskServing({self.name: fn, f"{self.name}_ids": fn})

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])  # float32: exported as is
    module = FinetunedModule(model, [Fake("sts"), Fake("chunk", ("B-NP", "O")), Fake("cola", ("0", "1"))])
    assert module.model is model
    assert sorted(module.signature_functions) == ["chunk", "chunk_ids", "cola", "cola_ids",
                                                  "serving_default", "sts", "sts_ids"]
    assert module.signature_functions["serving_default"] is module.signature_functions["sts"]
    assert module.labels == {"chunk": ["B-NP", "O"], "cola": ["0", "1"]}
