"""`electra-convert to-onnx`: the discriminator and every fine-tuning family in onnxruntime, equal
to the SavedModel's outputs within 1e-4 at two batch sizes and sequence lengths from one file
(the axes are dynamic), and the command's errors."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.convert.__main__ import main
from electra_tf.convert.names import ConversionError
from tests.extras import import_extra
from tests.finetuning_fixtures import squad_file, tiny_pretrained, write_vocab

ort = import_extra("onnxruntime", "onnx")
import_extra("tf2onnx", "onnx")

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "what", "good", "bad"]
SEQ = 32
SHAPES = ((1, 7), (3, 20))  # (batch, sequence): two of each from one exported file
TOLERANCE = 1e-4
TASKS = ("toy", "chunk", "sts", "squad")  # classification, tagging, regression, QA


def _task_files(raw):
    os.makedirs(os.path.join(raw, "toy"))
    rows = "".join(f"the {w} cat\t{'pos' if w == 'good' else 'neg'}\n" for w in ("good", "bad") * 4)
    for split in ("train", "dev"):
        with open(os.path.join(raw, "toy", f"{split}.tsv"), "w") as f:
            f.write("text\tlabel\n" + rows)
    os.makedirs(os.path.join(raw, "chunk"))
    for split in ("train", "dev"):
        with open(os.path.join(raw, "chunk", f"{split}.txt"), "w") as f:
            f.write("the X B-NP\ncat X I-NP\nsat X B-VP\n\na X B-NP\ndog X I-NP\n\n")
    os.makedirs(os.path.join(raw, "sts"))
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    for split in ("train", "dev"):
        with open(os.path.join(raw, "sts", f"{split}.tsv"), "w") as f:
            f.write(header + "".join(f"{i}\tmain-news\tf\t2012\t{i}\tnone\tnone\tthe cat\ta dog\t{i}.0\n"
                                     for i in range(4)))
    for split in ("train", "dev"):
        squad_file(os.path.join(raw, "squad", f"{split}.json"), [f"{split}1", f"{split}2"])


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    """A tiny pretraining run and its exported discriminator."""
    root = str(tmp_path_factory.mktemp("onnx"))
    world = tiny_pretrained(root, write_vocab(os.path.join(root, "words.txt"), WORDS),
                            max_seq_length=SEQ)
    world["vocab_size"] = len(open(os.path.join(root, "words.txt")).read().split())
    return world


@pytest.fixture(scope="module")
def world(pretraining):
    """The pretraining run and one fine-tuned SavedModel from it with a task of every family
    (random heads: parity, not accuracy, is tested)."""
    from electra_tf.data.text.tokenization import Tokenizer
    from electra_tf.finetuning import runner
    from electra_tf.finetuning.config import FinetuningConfig
    from electra_tf.finetuning.encoding import TextEncoder
    from electra_tf.finetuning.export import FinetunedModule, export_finetuned
    from electra_tf.finetuning.pretrained import load_pretrained
    from electra_tf.finetuning.registry import build_task

    world = dict(pretraining)
    root = world["root"]
    raw = os.path.join(root, "finetuning_data")
    _task_files(raw)
    config = FinetuningConfig.create("tiny", root, {
        "task_names": list(TASKS), "max_seq_length": SEQ, "max_query_length": 8, "doc_stride": 8,
        "mixed_precision": "float32", "raw_data_dir": raw})
    pretrained = load_pretrained(config)
    tokenizer = Tokenizer(pretrained.vocab, do_lower_case=True, strip_accents=True)
    tasks = [build_task(name, config, pretrained, tokenizer, TextEncoder(tokenizer, SEQ))
             for name in TASKS]
    model = runner.build_model(pretrained, tasks, seed=1)
    module = FinetunedModule(model, tasks)
    world["finetuned"] = export_finetuned(module, os.path.join(root, "tiny", "all_model_1"),
                                          config.to_json(), pretrained.vocab.path)
    return world


def _inputs(vocab_size, batch, length, seed, words=None):
    """Random ids with padding at the end of each row but the first, two segments; tagging's
    labeled_positions point at real tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab_size, (batch, length)).astype(np.int32)
    lengths = [length] + list(rng.integers(2, length + 1, batch - 1))
    mask = (np.arange(length)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    segments = ((np.arange(length)[None, :] >= length // 2) & (mask == 1)).astype(np.int32)
    feeds = {"input_ids": ids * mask, "input_mask": mask, "segment_ids": segments}
    if words is not None:
        feeds["labeled_positions"] = np.stack(
            [np.sort(rng.choice(np.arange(1, n), words, replace=False)) if n > words
             else np.arange(1, words + 1) % n for n in lengths]).astype(np.int32)
    return feeds


def _compare(onnx_path, signature, vocab_size, words=None, shapes=SHAPES):
    """Runs both at `shapes`; returns the ONNX session. Asserts every output equal within 1e-4."""
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    assert sorted(names) == sorted(signature.structured_outputs)
    for i, (batch, length) in enumerate(shapes):
        feeds = _inputs(vocab_size, batch, length, seed=i, words=words and min(words[i], length - 1))
        got = dict(zip(names, session.run(None, feeds)))
        want = signature(**{k: tf.constant(v) for k, v in feeds.items()})
        for name in names:
            expected = want[name].numpy()
            assert got[name].shape == expected.shape, name
            if expected.dtype == object:  # label names
                assert [s.decode() if isinstance(s, bytes) else s for s in expected.ravel()] == \
                    list(got[name].ravel()), name
            elif np.issubdtype(expected.dtype, np.floating):
                assert np.max(np.abs(got[name] - expected)) <= TOLERANCE, name
            else:
                np.testing.assert_array_equal(got[name], expected, err_msg=name)
    return session


def _exported(path):
    import onnx

    model = onnx.load(path)
    return model, {p.key: p.value for p in model.metadata_props}


@pytest.mark.parametrize("source", ["run_directory", "saved_model"])
def test_discriminator_equals_the_saved_model_at_two_shapes(pretraining, tmp_path, source):
    world = pretraining
    # The SavedModel as TF Serving's base path, export/discriminator: its newest version is read.
    model_dir = world["model_dir"] if source == "run_directory" else os.path.dirname(world["export"])
    output = str(tmp_path / "disc.onnx")
    assert main(["--quiet", "to-onnx", "--model-dir", model_dir, "--output", output]) == 0
    signature = tf.saved_model.load(world["export"]).signatures["serving_default"]
    session = _compare(output, signature, world["vocab_size"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "input_mask", "segment_ids"]
    assert all(i.type == "tensor(int32)" and i.shape == ["batch", "sequence"] for i in session.get_inputs())
    model, metadata = _exported(output)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert metadata["electra_tf.source"] == source and metadata["electra_tf.opset"] == "17"
    assert not any(name.startswith(".") for name in os.listdir(tmp_path))  # no temporary left


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_every_fine_tuning_family_equals_its_saved_model(world, tmp_path, task):
    output = str(tmp_path / f"{task}.onnx")
    assert main(["--quiet", "to-onnx", "--model-dir", world["finetuned"], "--task", task,
                 "--output", output, "--opset", "15"]) == 0
    signature = tf.saved_model.load(world["finetuned"]).signatures[f"{task}_ids"]
    # QA's beam (top_k of beam_size 20 starts) needs windows of at least 20 tokens, as in TF.
    _compare(output, signature, world["vocab_size"], words=(2, 5) if task == "chunk" else None,
             shapes=((1, 20), (3, 27)) if task == "squad" else SHAPES)
    model, metadata = _exported(output)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [15]
    assert metadata["electra_tf.signature"] == f"{task}_ids"
    with open(os.path.join(world["finetuned"], "assets.extra", "labels.json")) as f:
        labels = json.load(f).get(task)
    assert (json.loads(metadata["labels"]) if "labels" in metadata else None) == labels


def test_errors_are_one_line_and_nothing_is_replaced_without_overwrite(pretraining, tmp_path, capsys):
    world = pretraining
    output = tmp_path / "m.onnx"
    output.write_bytes(b"keep")
    code = main(["--quiet", "to-onnx", "--model-dir", world["export"], "--output", str(output)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "pass --overwrite" in err
    assert output.read_bytes() == b"keep"
    code = main(["--quiet", "to-onnx", "--model-dir", world["model_dir"], "--task", "toy",
                 "--output", str(tmp_path / "x.onnx")])
    assert code == 2 and "--task applies to a fine-tuned SavedModel" in capsys.readouterr().err
    code = main(["--quiet", "to-onnx", "--model-dir", world["export"], "--opset", "9",
                 "--output", str(tmp_path / "x.onnx")])
    assert code == 2 and "--opset 9" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x.onnx")
    assert main(["--quiet", "to-onnx", "--model-dir", world["export"], "--output", str(output),
                 "--overwrite"]) == 0
    assert output.read_bytes()[:4] != b"keep"


@pytest.mark.slow
def test_a_multi_task_model_needs_task(world, tmp_path, capsys):
    code = main(["--quiet", "to-onnx", "--model-dir", world["finetuned"], "--output", str(tmp_path / "x.onnx")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "holds 4 tasks (chunk, squad, sts, toy): pass --task" in err
    code = main(["--quiet", "to-onnx", "--model-dir", world["finetuned"], "--task", "nope",
                 "--output", str(tmp_path / "x.onnx")])
    assert code == 2 and "no signature nope_ids (tasks with one: chunk, squad, sts, toy)" in \
        capsys.readouterr().err


def test_a_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch):
    from electra_tf.convert.onnx_export import export_onnx

    monkeypatch.setitem(sys.modules, "tf2onnx", None)  # `import tf2onnx` raises ImportError
    with pytest.raises(ConversionError, match=r"needs the \[onnx\] extra .*pip install"):
        export_onnx(str(tmp_path), str(tmp_path / "m.onnx"))
