"""A SentencePiece pretraining run end to end: --learn-spm build, 20 steps with whole-word
masking, the exported discriminator's serve_text, and (tests/convert) the HF export."""

import os

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("sentencepiece")
import tensorflow_text  # noqa: E402,F401  registers the SentencePiece op serve_text uses

from electra_tf.data.build.build_config import BuildConfig  # noqa: E402
from electra_tf.data.build.builder import build_dataset  # noqa: E402
from electra_tf.data.text.tokenization import Tokenizer  # noqa: E402
from electra_tf.errors import ElectraError  # noqa: E402
from electra_tf.training import run_dir  # noqa: E402
from electra_tf.training.tf import trainer as trainer_lib  # noqa: E402
from electra_tf.vocab import load_vocab  # noqa: E402
from tests import pretraining_fixtures as fx  # noqa: E402
from tests.spm_fixtures import SAMPLE_TEXTS, write_corpus  # noqa: E402

pytestmark = pytest.mark.slow  # a build, 20 training steps and an export: ~1 min on 2 cores

STEPS = 20
SPM_SIZE = 160


@pytest.fixture(scope="module")
def spm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm_run")
    corpus = write_corpus(str(root / "corpus"), lines=800)
    data_dir = str(root / "data")
    manifest = build_dataset(BuildConfig(
        corpus_dir=os.path.dirname(corpus), learn_spm=SPM_SIZE, max_seq_length=fx.MAX_SEQ_LENGTH,
        output_dir=os.path.join(data_dir, "pretrain_tfrecords"), eval_fraction=0.1))
    config = fx.tiny_config(data_dir, "spm", vocab_size=SPM_SIZE, num_train_steps=STEPS,
                            iterations_per_loop=10, save_checkpoints_steps=STEPS,
                            masking="whole_word", do_export=True)
    result = trainer_lib.run(config)
    return {"root": root, "data_dir": data_dir, "config": config, "manifest": manifest,
            "result": result, "vocab": load_vocab(os.path.join(data_dir, "spm.model"))}


def test_trains_with_the_learned_model(spm_run):
    config, vocab = spm_run["config"], spm_run["vocab"]
    assert config.vocab_file == os.path.join(spm_run["data_dir"], "spm.model")  # found alone
    assert spm_run["manifest"]["vocab"]["sha256"] == vocab.sha256
    assert fx.latest_step(config.model_dir) == STEPS
    saved = load_vocab(os.path.join(config.model_dir, run_dir.SPM_MODEL_NAME))
    assert saved.kind == "sentencepiece" and saved.sha256 == vocab.sha256
    assert not os.path.exists(os.path.join(config.model_dir, run_dir.VOCAB_NAME))
    export = spm_run["result"]["export"]["discriminator"]
    assert os.listdir(os.path.join(export, "assets.extra")).count(run_dir.SPM_MODEL_NAME) == 1


def test_serve_text_tokenizes_with_the_model(spm_run):
    vocab = spm_run["vocab"]
    path = spm_run["result"]["export"]["discriminator"]
    module = tf.saved_model.load(path)
    texts = [t for t in SAMPLE_TEXTS if t.strip()]
    out = module.signatures["serve_text"](text=tf.constant(texts))
    ids, mask = out["input_ids"].numpy(), out["input_mask"].numpy()
    tokenizer = Tokenizer(vocab)
    for row, text in enumerate(texts):
        expected = ([vocab.special.cls_id] + tokenizer.encode(text)[:fx.MAX_SEQ_LENGTH - 2]
                    + [vocab.special.sep_id])
        assert ids[row, :len(expected)].tolist() == expected, text
        assert mask[row].sum() == len(expected)
    assert np.isfinite(out["replaced_probs"].numpy()).all()


def test_another_model_is_refused_at_training_time(spm_run, tmp_path):
    from electra_tf.data.text.spm_learning import learn_spm

    other = learn_spm([os.path.join(spm_run["root"], "corpus", "corpus.txt")], 100,
                      str(tmp_path / "other.model"))
    config = fx.tiny_config(spm_run["data_dir"], "spm_other", vocab_size=SPM_SIZE,
                            num_train_steps=2, vocab_file=other.path)
    with pytest.raises(ElectraError, match="differs from the given vocab"):
        trainer_lib.run(config)


def _toy_task(data_dir):
    rng = np.random.default_rng(0)
    task_dir = os.path.join(data_dir, "finetuning_data", "toy")
    os.makedirs(task_dir, exist_ok=True)
    cue = {"pos": ["København", "café"], "neg": ["東京", "한국어"]}
    filler = ["the", "quick", "fox", "über", "data"]
    for split, n in (("train", 64), ("dev", 16), ("test", 16)):
        with open(os.path.join(task_dir, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            for i in range(n):
                label = ("pos", "neg")[i % 2]
                words = list(rng.choice(filler, 4)) + [rng.choice(cue[label])]
                f.write(" ".join(words) + f"\t{label}\n")


def test_finetunes_and_serves_raw_text_with_the_model(spm_run):
    from electra_tf.commands.finetune import with_spm_model
    from electra_tf.finetuning import runner
    from electra_tf.finetuning.config import FinetuningConfig
    from electra_tf.finetuning.pretrained import PretrainedError

    data_dir, model = spm_run["data_dir"], os.path.join(spm_run["data_dir"], "spm.model")
    _toy_task(data_dir)
    hparams = {"task_names": ["toy"], "max_seq_length": fx.MAX_SEQ_LENGTH, "train_batch_size": 16,
               "eval_batch_size": 16, "num_train_epochs": 1, "log_steps": 1000,
               "mixed_precision": "float32"}
    # Without --spm-model, the run's own copy is the vocabulary.
    derived = FinetuningConfig.create("spm", data_dir, hparams)
    assert derived.vocab_file.endswith(os.path.join("spm", run_dir.SPM_MODEL_NAME))
    config = FinetuningConfig.create("spm", data_dir, with_spm_model(hparams, model))
    assert config.vocab_file == model
    results = runner.run(config)
    export = results["trials"][0]["export"]
    saved = load_vocab(os.path.join(export, "assets.extra", run_dir.SPM_MODEL_NAME))
    assert saved.kind == "sentencepiece" and saved.sha256 == spm_run["vocab"].sha256
    loaded = tf.saved_model.load(export)
    out = loaded.signatures["serving_default"](text=tf.constant(["København café 😀", "東京"]))
    assert all(np.isfinite(v.numpy()).all() for v in out.values() if v.dtype.is_floating)
    # Another SentencePiece model than the pretrained one: refused, one line.
    other = os.path.join(spm_run["root"], "other_ft.model")
    from electra_tf.data.text.spm_learning import learn_spm

    learn_spm([os.path.join(spm_run["root"], "corpus", "corpus.txt")], 100, other)
    with pytest.raises(PretrainedError, match="is not the vocabulary the starting point"):
        runner.run(FinetuningConfig.create("spm", data_dir, with_spm_model(hparams, other)),
                   overwrite=True)


def test_hf_export_reloads_with_the_same_ids_and_outputs(spm_run, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from electra_tf.convert import hf

    out = str(tmp_path / "hf")
    hf.export_hf(spm_run["config"].model_dir, out)
    assert hf.SPM_MODEL_NAME in os.listdir(out) and hf.VOCAB_NAME not in os.listdir(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = transformers.ElectraForPreTraining.from_pretrained(out, local_files_only=True).eval()
    texts = [t for t in SAMPLE_TEXTS if t.strip()]
    module = tf.saved_model.load(spm_run["result"]["export"]["discriminator"])
    served = module.signatures["serve_text"](text=tf.constant(texts))
    for row, text in enumerate(texts):
        encoded = tokenizer(text, truncation=True, max_length=fx.MAX_SEQ_LENGTH,
                            return_tensors="pt")
        n = int(served["input_mask"][row].numpy().sum())
        assert encoded["input_ids"][0].tolist() == served["input_ids"][row, :n].numpy().tolist()
        with torch.no_grad():
            logits = model(**encoded).logits[0].numpy()
        probs = 1.0 / (1.0 + np.exp(-logits))
        np.testing.assert_allclose(probs, served["replaced_probs"][row, :n].numpy(), atol=1e-4)
    # keras-hub's ElectraTokenizer is WordPiece only: refused, one line.
    from electra_tf.convert.keras_hub import export_keras_hub
    from electra_tf.convert.names import ConversionError

    with pytest.raises(ConversionError, match="trained with a SentencePiece model"):
        export_keras_hub(spm_run["config"].model_dir, str(tmp_path / "kh"))
