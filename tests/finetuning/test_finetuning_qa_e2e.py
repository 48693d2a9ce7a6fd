"""QA end to end on questions built from the default corpus: the in-graph serving signature gives
the Python decoder's answers, prediction files (QA-27), and a learning test against the
first-word / first-sentence baselines with the export reloaded in a fresh process."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.finetuning import runner
from electra_tf.finetuning.config import FinetuningConfig
from electra_tf.finetuning.corpus_tasks import numbers_of
from electra_tf.finetuning.pretrained import load_pretrained
from electra_tf.finetuning.qa import evaluation
from electra_tf.finetuning.qa.serving import qa_serving
from electra_tf.finetuning.qa.task import QATask
from electra_tf.finetuning.task import ScoreContext
from tests.finetuning_fixtures import REPO_ROOT, TINY_MODEL, corpus_tasks_dir

DATA_DIR = os.path.join(REPO_ROOT, "pretrain_data")


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return corpus_tasks_dir(str(tmp_path_factory.mktemp("qa_raw")), ["squad", "newsqa"],
                            num_train=100, num_dev=60)


def _config(raw, tmp_path, task, **hparams):
    values = dict(TINY_MODEL, task_names=[task], random_init=True, raw_data_dir=raw,
                  max_seq_length=64, max_query_length=24, doc_stride=16, do_export=False,
                  log_steps=1000, results_json=str(tmp_path / "r.json"),
                  results_txt=str(tmp_path / "r.txt"), model_dir=str(tmp_path / "models"))
    values.update(hparams)
    return FinetuningConfig.create("m", DATA_DIR, values)


@pytest.mark.parametrize("task,hparams", [
    ("squad", {}),
    ("squad", {"joint_prediction": False, "answerable_classifier": False, "n_best_size": 5}),
    ("newsqa", {"beam_size": 6, "max_answer_length": 4}),
])
def test_serving_signature_gives_the_python_decoders_answers(raw, tmp_path, task, hparams):
    config = _config(raw, tmp_path, task, **hparams)
    pretrained = load_pretrained(config)
    tokenizer = Tokenizer(pretrained.vocab)
    qa = QATask(task, config, tokenizer)
    model = runner.build_model(pretrained, [qa], seed=5)  # untrained: answers anywhere
    dev = qa.eval_sets()[0]
    examples = dev.payload.data.examples[:40]
    assert len(dev.payload.features.windows) > 2 * 60  # several windows per question
    outputs = runner.predict(model, task, dev.features, 64)
    decoded = dev.payload.decoder.decode(outputs, dev.features["input_ids"])[:40]
    serve = qa_serving(model, task, tokenizer, config, qa.v2).signature_functions[task]
    served = serve(question=tf.constant([e.question for e in examples]),
                   context=tf.constant([e.paragraph.context for e in examples]))
    for i, (example, prediction) in enumerate(zip(examples, decoded)):
        answer = served["answer"][i].numpy().decode()
        assert answer == prediction.text, (i, example.qid)
        start, end = int(served["answer_start"][i]), int(served["answer_end"][i])
        if answer != "empty":
            assert example.paragraph.context[start:end] == answer
        if qa.v2:
            assert float(served["null_odds"][i]) == pytest.approx(prediction.null_odds, abs=1e-3)


def test_qa27_prediction_files_and_test_split_outputs(raw, tmp_path):
    """Dev: <task>_preds.json and _null_odds.json keyed by id, <task>_eval.json; an unlabelled
    test file is decoded against its own questions into separate files (QUIRKS Q13, Q14 fixed)."""
    dev = json.load(open(os.path.join(raw, "squad", "dev.json")))
    for p in dev["data"][0]["paragraphs"]:
        for qa in p["qas"]:
            qa["id"] = "test-" + qa["id"]
            qa["answers"] = []
    task_raw = tmp_path / "raw"
    os.makedirs(task_raw / "squad")
    for split in ("train", "dev"):
        os.symlink(os.path.join(raw, "squad", f"{split}.json"), task_raw / "squad" / f"{split}.json")
    json.dump(dev, open(task_raw / "squad" / "test.json", "w"))
    config = _config(str(task_raw), tmp_path, "squad")
    pretrained = load_pretrained(config)
    qa = QATask("squad", config, Tokenizer(pretrained.vocab))
    model = runner.build_model(pretrained, [qa], seed=0)
    results_dir = tmp_path / "results"
    context = ScoreContext(str(results_dir), 1, True, "squad")
    metrics = {}
    for eval_set in qa.eval_sets():
        outputs = runner.predict(model, "squad", eval_set.features, 64)
        metrics[eval_set.split] = qa.score(eval_set, outputs, context)
    assert metrics["test"] is None and metrics["dev"]["total"] == 60
    qa_dir = results_dir / "squad_qa"
    preds = json.load(open(qa_dir / "squad_preds.json"))
    odds = json.load(open(qa_dir / "squad_null_odds.json"))
    ids = [qa["id"] for p in json.load(open(os.path.join(raw, "squad", "dev.json")))["data"][0][
        "paragraphs"] for qa in p["qas"]]
    assert list(preds) == ids and list(odds) == ids
    assert json.load(open(qa_dir / "squad_eval.json")) == metrics["dev"]
    assert metrics["dev"] == evaluation.evaluate_v2(qa.splits["dev"].gold, preds, odds, -2.75)
    test_preds = json.load(open(qa_dir / "squad_test_preds.json"))
    assert list(test_preds) == ["test-" + i for i in ids]
    final = json.load(open(results_dir / "test_predictions" / "squad_test_1_predictions.json"))
    test_odds = json.load(open(qa_dir / "squad_test_null_odds.json"))
    assert final == {q: ("" if test_odds[q] > -2.75 else t) for q, t in test_preds.items()}


def _baselines(raw, task):
    """EM of answering with the context's first word and its first number (a year or another
    whole number), and F1 of answering with its first sentence."""
    dataset = json.load(open(os.path.join(raw, task, "dev.json")))["data"]
    first_word, first_number, first_sentence = {}, {}, {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                first_word[qa["id"]] = p["context"].split()[0]
                numbers = numbers_of(p["context"])
                first_number[qa["id"]] = numbers[0][1] if numbers else ""
                first_sentence[qa["id"]] = p["context"].split(". ")[0]
    return (evaluation.evaluate_v1(dataset, first_word)["exact_match"],
            evaluation.evaluate_v1(dataset, first_number)["exact_match"],
            evaluation.evaluate_v1(dataset, first_sentence)["f1"])


@pytest.mark.slow
def test_learning_squadv1_beats_the_baselines_and_the_export_serves_it(tmp_path):
    """Questions need their "what year" / "how many" to pick one of two numbers."""
    raw = corpus_tasks_dir(str(tmp_path / "raw"), ["squadv1"], num_train=2400, num_dev=300)
    config = _config(raw, tmp_path, "squadv1", max_seq_length=96, max_query_length=32,
                     doc_stride=64, learning_rate=1e-3, num_train_epochs=4, do_export=True)
    results = runner.run(config)
    dev = results["trials"][0]["metrics"]["squadv1"]["dev"]
    first_word_em, first_number_em, first_sentence_f1 = _baselines(raw, "squadv1")
    assert dev["exact_match"] > first_word_em + 30, (dev, first_word_em)
    assert dev["exact_match"] > first_number_em + 10, (dev, first_number_em)
    assert dev["f1"] > first_sentence_f1 + 30, (dev, first_sentence_f1)
    # The export, reloaded in a fresh process, answers as the in-memory model decodes.
    export = results["trials"][0]["export"]
    data = json.load(open(os.path.join(raw, "squadv1", "dev.json")))["data"][0]["paragraphs"][:8]
    questions = [p["qas"][0]["question"] for p in data]
    contexts = [p["context"] for p in data]
    preds = json.load(open(os.path.join(os.path.dirname(config.results_json), "squadv1_qa",
                                        "squadv1_preds.json")))
    code = (
        "import json, tensorflow as tf, tensorflow_text\n"
        f"m = tf.saved_model.load({export!r})\n"
        f"out = m.signatures['serving_default'](question=tf.constant({questions!r}), "
        f"context=tf.constant({contexts!r}))\n"
        "print(json.dumps({'answer': [a.decode() for a in out['answer'].numpy()],\n"
        "                  'start': out['answer_start'].numpy().tolist(),\n"
        "                  'signatures': sorted(m.signatures)}))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    served = json.loads(proc.stdout.strip().splitlines()[-1])
    assert served["signatures"] == ["serving_default", "squadv1", "squadv1_ids"]
    assert served["answer"] == [preds[p["qas"][0]["id"]] for p in data]
    for context, answer, start in zip(contexts, served["answer"], served["start"]):
        assert context[start:start + len(answer)] == answer
