"""Fine-tuning on JAX and PyTorch (issue 48, item 1): the TensorFlow runner's losses on the same
weights and batches, the whole tool without TensorFlow, every family.

The model (a classification, a regression, a tagging and a question-answering head on one
2-layer encoder, dropout on) is built on TensorFlow in this process; its variables go to a JAX
or PyTorch child (TensorFlow unimportable there, `tests/backends.py`) by position; each predicts
the QA head's outputs (the inference beam) and runs `runner.train` (the official optimizer,
layer-wise decay, warmup and decay, the clip) on the same 30 batches, one loss per step: rtol
1e-4.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from electra_tf.finetuning import portable_runner
from electra_tf.finetuning.registry import task_family
from electra_tf.finetuning.task import CLASSIFICATION, QUESTION_ANSWERING, REGRESSION, TAGGING
from tests import backends
from tests import pretraining_fixtures as fx
from tests.finetuning_fixtures import REPO_ROOT, TINY_MODEL, corpus_tasks_dir

STEPS, BATCH, SEQ = 30, 8, 32
TASKS = [{"name": "topic", "family": "classification", "num_labels": 3},
         {"name": "score", "family": "regression"},
         {"name": "tags", "family": "tagging", "num_labels": 5},
         {"name": "span", "family": "qa", "beam_size": 4}]
TASK_NAMES = [t["name"] for t in TASKS]
ENCODER = dict(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=128, embedding_size=32, max_position_embeddings=SEQ)
HPARAMS = dict(task_names=TASK_NAMES, random_init=True, train_batch_size=BATCH,
               num_train_epochs=1, learning_rate=1e-3, warmup_proportion=0.2, log_steps=1,
               iterations_per_loop=1, max_seq_length=SEQ)

# Builds the model, sets its variables by position, trains on the given batches (same code on
# both backends).
_TRAIN = """
import json
import keras
from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.model import FinetuningModel

keras.utils.set_random_seed(0)
model = FinetuningModel(json.loads(str(inp["encoder"])), json.loads(str(inp["tasks"])))
variables = model.trainable_variables + model.non_trainable_variables
if "w0" in inp:
    for i, variable in enumerate(variables):
        variable.assign(inp[f"w{i}"])
else:
    for i, variable in enumerate(variables):
        out[f"w{i}"] = keras.ops.convert_to_numpy(variable.value)
config = FinetuningConfig.create("m", str(inp["data_dir"]), json.loads(str(inp["hparams"])))
table = {k[len("t:"):]: v for k, v in inp.items() if k.startswith("t:")}
size = int(inp["batch"])
# The QA head at inference (its beam) on the first records, before training (built by a call
# with every head's features: prediction reads the QA ones only).
model({k: v[:1] for k, v in table.items()}, training=False)
span = runner.predict(model, "span", {k: table[k][:3 * size] for k in
                                      ("input_ids", "input_mask", "segment_ids")}, size)
out.update({f"span:{k}": v for k, v in span.items()})
batches = [{k: v[i * size:(i + 1) * size] for k, v in table.items()}
           for i in range(len(table["task_id"]) // size)]
losses = []
runner.train(model, table, config, 0, [t["name"] for t in json.loads(str(inp["tasks"]))],
             batches=batches, step_losses=losses)
out["losses"] = np.array(losses)
"""


def _table(rng):
    n = STEPS * BATCH
    # At least 12 tokens: the QA beams (4) stay among the answer positions ([CLS] and the
    # second segment), whose logits are far apart, not among the -1000-masked near-ties.
    lengths = rng.integers(12, SEQ + 1, n)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    task_id = rng.integers(0, 5, n).astype(np.int32)  # 4: padding records (no loss)
    # Tagging: up to `words` first sub-tokens among each record's real positions, in order.
    words = np.where(task_id == 2, rng.integers(1, 8, n), 0)
    positions = np.zeros((n, SEQ), np.int32)
    for i in np.flatnonzero(words):
        chosen = np.sort(rng.choice(np.arange(1, lengths[i]), min(words[i], lengths[i] - 1),
                                    replace=False))
        positions[i, :len(chosen)] = chosen
    tagged = (positions > 0).astype(np.float32)
    # QA: a span in the second segment (lengths // 2 on), or 0 / 0 for an unanswerable record.
    impossible = (task_id == 3) & (rng.random(n) < 0.3)
    starts = rng.integers(lengths // 2, lengths)
    ends = np.minimum(starts + rng.integers(0, 3, n), lengths - 1)
    answered = (task_id == 3) & ~impossible
    return {"input_ids": (rng.integers(5, ENCODER["vocab_size"], (n, SEQ)) * mask).astype(np.int32),
            "input_mask": mask,
            "segment_ids": ((np.arange(SEQ)[None, :] >= lengths[:, None] // 2) * mask).astype(np.int32),
            "task_id": task_id,
            "topic_label_ids": np.where(task_id == 0, rng.integers(0, 3, n), 0).astype(np.int32),
            "score_targets": np.where(task_id == 1, rng.random(n), 0.0).astype(np.float32),
            "tags_labels": (rng.integers(0, 5, (n, SEQ)) * tagged).astype(np.int32),
            "tags_labels_mask": tagged,
            "tags_labeled_positions": positions,
            "span_start_positions": np.where(answered, starts, 0).astype(np.int32),
            "span_end_positions": np.where(answered, ends, 0).astype(np.int32),
            "span_is_impossible": impossible.astype(np.int32)}


def _run_tensorflow(code: str, inputs: dict) -> dict:
    """`code` in this (TensorFlow) process, with `inp` and `out` as in a child."""
    scope = {"np": np, "inp": inputs, "out": {}}
    exec(code, scope)  # noqa: S102 (the test's own code)
    return scope["out"]


@pytest.fixture(scope="module")
def tensorflow_run(tmp_path_factory):
    """The inputs and the TensorFlow runner's weights and losses, once for both backends."""
    rng = np.random.default_rng(0)
    inputs = {"encoder": np.array(json.dumps(ENCODER)), "tasks": np.array(json.dumps(TASKS)),
              "hparams": np.array(json.dumps(HPARAMS)),
              "data_dir": np.array(str(tmp_path_factory.mktemp("data"))),
              "batch": np.array(BATCH),
              **{f"t:{k}": v for k, v in _table(rng).items()}}
    return inputs, _run_tensorflow(_TRAIN, dict(inputs))


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_fine_tuning_losses_equal_tensorflows_on_the_same_weights_and_batches(tensorflow_run,
                                                                              backend):
    backends.require(backend)
    inputs, tensorflow = tensorflow_run
    weights = {k: v for k, v in tensorflow.items() if k.startswith("w")}
    other = backends.run_on_backend(backend, _TRAIN, dict(inputs, **weights))
    assert len(tensorflow["losses"]) == STEPS
    np.testing.assert_allclose(other["losses"], tensorflow["losses"], rtol=1e-4)
    assert tensorflow["losses"][-1] < tensorflow["losses"][0]  # it trains
    # The QA head's predictions: the same beams (indices exactly), log-probs and logits.
    predicted = sorted(k for k in tensorflow if k.startswith("span:"))
    assert predicted == sorted(k for k in other if k.startswith("span:"))
    for key in predicted:
        if "index" in key:
            np.testing.assert_array_equal(other[key], tensorflow[key], err_msg=key)
        else:
            np.testing.assert_allclose(other[key], tensorflow[key], rtol=1e-4, atol=1e-4,
                                       err_msg=key)
    assert len(np.unique(tensorflow["span:end_top_index"])) > 4  # the beams differ by start


def _tool(tmp_path, *args):
    env = fx.subprocess_env()
    return subprocess.run(backends.blocked_tool_command("run_finetuning.py", *args),
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO_ROOT)


@pytest.mark.slow
def test_the_tool_fine_tunes_classification_on_jax_without_tensorflow(tmp_path):
    backends.require("jax")
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["source"], num_train=96, num_dev=48)
    hparams = dict(TINY_MODEL, task_names=["source"], random_init=True, raw_data_dir=raw,
                   max_seq_length=32, num_train_epochs=1, train_batch_size=16,
                   model_dir=str(tmp_path / "models"),
                   results_json=str(tmp_path / "r.json"), results_txt=str(tmp_path / "r.txt"))
    proc = _tool(tmp_path, "--backend", "jax", "--data-dir",
                 os.path.join(REPO_ROOT, "pretrain_data"), "--hparams", json.dumps(hparams))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.load(open(tmp_path / "r.json"))
    assert results["backend"] == "jax"
    assert results["trials"][0]["steps"] == 6  # ceil(96 / 16) batches x 1 epoch
    assert set(results["trials"][0]["metrics"]["source"]["dev"]) == {
        "accuracy", "macro_f1", "mcc", "loss"}
    assert open(tmp_path / "r.txt").read().startswith("source: accuracy: ")
    weights = results["trials"][0]["export"]
    assert weights == str(tmp_path / "models" / "source_model_1" / "weights.npz")
    assert os.path.isfile(weights)

    # The weights reach TensorFlow serving: --export-weights writes the TensorFlow runner's
    # SavedModel, whose predictions score the dev set as the JAX run did.
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "run_finetuning.py"),
                           "--export-weights", weights], capture_output=True, text=True,
                          timeout=900, env=fx.subprocess_env(), cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = str(tmp_path / "models" / "source_model_1" / "saved_model")
    assert proc.stdout.strip().splitlines()[-1] == f"model: {exported}"
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer's ops)

    from electra_tf.finetuning.config import FinetuningConfig
    from electra_tf.finetuning.pretrained import load_pretrained
    from electra_tf.finetuning.registry import build_task
    from electra_tf.finetuning.runner import _text_encoding

    config = FinetuningConfig.from_dict(results["config"])
    pretrained = load_pretrained(config)
    dev = build_task("source", config, pretrained,
                     *_text_encoding(pretrained, config.max_seq_length)).eval_sets()[0]
    serve = tf.saved_model.load(exported).signatures["source_ids"]
    predicted = serve(**{k: tf.constant(dev.features[k])
                         for k in ("input_ids", "input_mask", "segment_ids")})["label_ids"]
    accuracy = 100.0 * np.mean(predicted.numpy() == dev.features["label_ids"])
    assert accuracy == pytest.approx(results["trials"][0]["metrics"]["source"]["dev"]["accuracy"])


# Predicts each task of an unbuilt two-task model from that task's features alone (evaluation
# without training), then the same weights in a model built by a call with every task's.
_PREDICT_UNBUILT = """
import keras
from electra_tf.finetuning import portable_runner
from electra_tf.finetuning.model import FinetuningModel

encoder = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=16, embedding_size=8)
tasks = [{"name": "topic", "family": "classification", "num_labels": 3},
         {"name": "tags", "family": "tagging", "num_labels": 5}]
shared = {k: inp[k] for k in ("input_ids", "input_mask", "segment_ids")}
own = {"topic": {"label_ids": inp["label_ids"]},
       "tags": {"labels": inp["labels"], "labeled_positions": inp["labeled_positions"],
                "weights": inp["weights"]}}
keras.utils.set_random_seed(0)
unbuilt = FinetuningModel(encoder, tasks)
for name in ("topic", "tags"):
    for key, value in portable_runner.predict(unbuilt, name, dict(shared, **own[name]), 2).items():
        out[f"unbuilt:{name}:{key}"] = value
built = FinetuningModel(encoder, tasks)
built(dict(shared, **{f"{t}_{k}": v[:1] for t in own for k, v in own[t].items()},
           **{k: v[:1] for k, v in shared.items()}), training=False)
for source, target in zip(unbuilt.variables, built.variables):
    target.assign(source.value)
for name in ("topic", "tags"):
    for key, value in portable_runner.predict(built, name, dict(shared, **own[name]), 2).items():
        out[f"built:{name}:{key}"] = value
"""


@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_an_unbuilt_multi_task_model_predicts_each_task_from_its_own_features(backend):
    """Evaluation without training (`do_train: false`) on JAX or PyTorch: predicting one task
    of a fresh multi-task model builds it with that task's head only (it called every head
    with one task's features, and the tagging head found no `tags_labeled_positions`)."""
    backends.require(backend)
    rng = np.random.default_rng(0)
    n, seq = 3, 8
    inputs = {"input_ids": rng.integers(1, 50, (n, seq)).astype(np.int32),
              "input_mask": np.ones((n, seq), np.int32),
              "segment_ids": np.zeros((n, seq), np.int32),
              "label_ids": rng.integers(0, 3, n).astype(np.int32),
              "labels": rng.integers(0, 5, (n, seq)).astype(np.int32),
              "labeled_positions": np.tile(np.arange(seq, dtype=np.int32), (n, 1)),
              "weights": np.ones((n, seq), np.float32)}
    out = backends.run_on_backend(backend, _PREDICT_UNBUILT, inputs, timeout=300)
    unbuilt = {k[len("unbuilt:"):]: v for k, v in out.items() if k.startswith("unbuilt:")}
    assert {"topic:logits", "tags:logits"} <= set(unbuilt)
    assert unbuilt["topic:logits"].shape == (n, 3)
    for key, value in unbuilt.items():
        np.testing.assert_allclose(value, out[f"built:{key}"], rtol=1e-6, atol=1e-6,
                                   err_msg=key)


@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_jax_and_torch_refuse_no_family(backend):
    """Question answering included (the whole tool: the slow test below)."""
    families = {name: task_family(name) for name in ("sst", "sts", "chunk", "squad", "newsqa")}
    assert set(families.values()) == {CLASSIFICATION, REGRESSION, TAGGING, QUESTION_ANSWERING}
    portable_runner.check_families(backend, families)


@pytest.mark.slow
def test_the_tool_fine_tunes_squad_on_jax_with_the_tensorflow_runners_files_and_resumes(tmp_path):
    """Question answering through the whole tool without TensorFlow: the results' metrics (the
    official SQuAD 2.0 evaluation), the results.txt lines and the prediction files of
    TensorFlow's runner; a run stopped after a checkpoint resumes to the uninterrupted run's
    metrics and predictions."""
    backends.require("jax")
    from electra_tf.finetuning import runner
    from electra_tf.finetuning.config import FinetuningConfig
    from tests.finetuning.test_finetuning_resume import _TOOL

    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["squad"], num_train=80, num_dev=30)
    stop_step = 4

    def hparams(out):
        return dict(TINY_MODEL, task_names=["squad"], random_init=True, raw_data_dir=raw,
                    max_seq_length=48, max_query_length=16, doc_stride=16, num_train_epochs=1,
                    train_batch_size=16, learning_rate=1e-3, do_export=False, log_steps=3,
                    iterations_per_loop=3, save_checkpoints_steps=stop_step,
                    model_dir=str(out / "models"), results_json=str(out / "r.json"),
                    results_txt=str(out / "r.txt"))

    def tool(out, stop=None):
        env = fx.subprocess_env(REPO=REPO_ROOT, KERAS_BACKEND="jax",
                                **({"STOP": stop} if stop else {}))
        return subprocess.run(
            [sys.executable, "-c", _TOOL, "--backend", "jax", "--data-dir",
             os.path.join(REPO_ROOT, "pretrain_data"), "--hparams", json.dumps(hparams(out))],
            capture_output=True, text=True, timeout=900, env=env, cwd=REPO_ROOT)

    def outputs(out):
        files = {name: json.load(open(out / "squad_qa" / name))
                 for name in sorted(os.listdir(out / "squad_qa"))}
        return json.load(open(out / "r.json")), open(out / "r.txt").read().splitlines(), files

    runner.run(FinetuningConfig.create("m", os.path.join(REPO_ROOT, "pretrain_data"),
                                       hparams(tmp_path / "tf")))
    tf_results, tf_lines, tf_files = outputs(tmp_path / "tf")
    proc = tool(tmp_path / "jax")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, lines, files = outputs(tmp_path / "jax")
    assert results["backend"] == "jax"
    assert results["data"] == tf_results["data"]  # the same questions and records (windows)
    assert results["trials"][0]["steps"] == tf_results["trials"][0]["steps"] > stop_step
    dev = results["trials"][0]["metrics"]["squad"]["dev"]
    assert dev.keys() == tf_results["trials"][0]["metrics"]["squad"]["dev"].keys()
    assert dev["total"] == 30
    assert [line.split(":")[0] for line in lines] == [line.split(":")[0] for line in tf_lines]
    assert files.keys() == tf_files.keys() == {"squad_eval.json", "squad_null_odds.json",
                                               "squad_preds.json"}
    for name, values in files.items():
        assert list(values) == list(tf_files[name]), name  # question ids in file order
    assert files["squad_eval.json"] == dev

    stopped = tmp_path / "stopped"
    proc = tool(stopped, stop=f"1:{stop_step}")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert os.listdir(stopped / "models" / "squad_checkpoints_1") == [f"ckpt-{stop_step}.npz"]
    proc = tool(stopped)  # the same command again
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed, resumed_lines, resumed_files = outputs(stopped)
    assert resumed["trials"][0]["resumed_from"] == stop_step
    assert resumed["trials"][0]["metrics"] == results["trials"][0]["metrics"]
    assert resumed["trials"][0]["final_loss"] == results["trials"][0]["final_loss"]
    assert (resumed_lines, resumed_files) == (lines, files)


_NER = [("Angela Merkel visited Paris", "B-PER I-PER O B-LOC"),
        ("John Smith lives in Londons", "B-PER I-PER O O B-LOC"),
        ("the cafe in Zurich is open", "O O O B-LOC O O")]


def _conll(sentences, pos=False):
    """CoNLL text: word and tag per line (pos: N for a capitalised word, W otherwise)."""
    lines = []
    for words, tags in sentences:
        for word, tag in zip(words.split(), tags.split()):
            lines.append(f"{word}\t{('N' if word[0].isupper() else 'W') if pos else tag}\n")
        lines.append("\n")
    return "".join(lines)


@pytest.mark.slow
def test_the_tool_fine_tunes_ner_and_pos_on_jax_with_the_tensorflow_runners_files(tmp_path):
    """The tagging family through the whole tool without TensorFlow: the results' metrics, the
    results.txt lines and the prediction files (word, gold, predicted) of TensorFlow's runner."""
    backends.require("jax")
    from electra_tf.finetuning import runner
    from electra_tf.finetuning.config import FinetuningConfig
    from tests.finetuning_fixtures import write_vocab

    raw = tmp_path / "raw"
    for task in ("ner", "pos"):
        os.makedirs(raw / task)
        (raw / task / "train.txt").write_text(_conll(_NER * 4, task == "pos"), encoding="utf-8")
        (raw / task / "dev.txt").write_text(_conll(_NER, task == "pos"), encoding="utf-8")
    vocab = write_vocab(str(tmp_path / "vocab.txt"), [
        "angela", "merkel", "visited", "paris", "john", "smith", "lives", "in", "london", "##s",
        "the", "cafe", "zurich", "is", "open"])
    runs = {}
    for backend in ("tensorflow", "jax"):
        out = tmp_path / backend
        hparams = dict(TINY_MODEL, task_names=["ner", "pos"], random_init=True,
                       raw_data_dir=str(raw), vocab_file=vocab, max_seq_length=16,
                       num_train_epochs=2, train_batch_size=8, learning_rate=1e-3,
                       do_export=False, model_dir=str(out / "models"),
                       results_json=str(out / "results" / "r.json"),
                       results_txt=str(out / "results" / "r.txt"))
        if backend == "tensorflow":
            runner.run(FinetuningConfig.create("m", str(tmp_path), hparams))
        else:
            proc = _tool(tmp_path, "--backend", "jax", "--data-dir", str(tmp_path),
                         "--hparams", json.dumps(hparams))
            assert proc.returncode == 0, proc.stderr[-3000:]
        results = json.load(open(out / "results" / "r.json"))
        lines = open(out / "results" / "r.txt").read().splitlines()
        files = {name: open(out / "results" / "ner,pos_tagging" / name).read().splitlines()
                 for name in sorted(os.listdir(out / "results" / "ner,pos_tagging"))}
        runs[backend] = results, lines, files
    (tf_results, tf_lines, tf_files), (jax_results, jax_lines, jax_files) = (
        runs["tensorflow"], runs["jax"])
    assert jax_results["backend"] == "jax"
    assert jax_results["data"] == tf_results["data"]  # labels, sentences, words, casing
    for task in ("ner", "pos"):
        assert (jax_results["trials"][0]["metrics"][task]["dev"].keys()
                == tf_results["trials"][0]["metrics"][task]["dev"].keys())
    assert [line.split(":")[0] for line in jax_lines] == [line.split(":")[0] for line in tf_lines]
    assert set(jax_files) == set(tf_files) == {"ner_dev_1.txt", "pos_dev_1.txt"}
    for name, lines in jax_files.items():
        assert [line.split("\t")[:2] for line in lines] == [
            line.split("\t")[:2] for line in tf_files[name]]  # words and gold tags


_COMPILED_STEP = """
import json
import jax
import keras
from electra_tf.finetuning import portable_runner, runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.model import FinetuningModel

model = FinetuningModel(json.loads(str(inp["encoder"])), json.loads(str(inp["tasks"])))
config = FinetuningConfig.create("m", str(inp["data_dir"]), json.loads(str(inp["hparams"])))
optimizer = runner.make_optimizer(model, config, 10)
batch = {k[len("t:"):]: v for k, v in inp.items() if k.startswith("t:")}
portable_runner._build(model, batch)
steps = portable_runner._JaxSteps(model, optimizer, [t["name"] for t in json.loads(str(inp["tasks"]))])
plain = jax.jit(steps._step.__wrapped__, donate_argnums=0)
out["step"] = np.array(steps._step.lower(steps.state, batch).compile().as_text())
out["plain"] = np.array(plain.lower(steps.state, batch).compile().as_text())
"""


@pytest.mark.slow
def test_the_jax_step_compiles_without_ynnpack_fusions_on_cpu(tmp_path):
    """XLA:CPU's YNNPACK fusions cost the fine-tuning step ~13% more CPU time here
    (docs/finetuning.md, "Where the JAX step's time goes"): the runner's step is compiled
    without them, where a plain jit of the same function has them."""
    backends.require("jax")
    table = _table(np.random.default_rng(0))
    inputs = {"encoder": np.array(json.dumps(ENCODER)), "tasks": np.array(json.dumps(TASKS)),
              "hparams": np.array(json.dumps(HPARAMS)), "data_dir": np.array(str(tmp_path)),
              **{f"t:{k}": v[:BATCH] for k, v in table.items()}}
    out = backends.run_on_backend("jax", _COMPILED_STEP, inputs)
    assert "ynn_fusion" in str(out["plain"])
    assert "ynn_fusion" not in str(out["step"])
