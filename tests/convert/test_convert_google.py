"""from-google and to-google: Google's TF1 checkpoints written by tf.compat.v1 savers, in and out.

The numerical parity of imported models with an independent implementation (Hugging Face) is in
test_convert_hf.py; here: size inference, the model directory the trainer continues from, the
error messages, and the exact ours -> Google -> ours round trip.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import PretrainingConfig
from electra_tf.convert import google, google_sizes, names
from electra_tf.convert.model_dir import load_model_dir
from electra_tf.convert.names import ConversionError
from electra_tf.training import checkpoint_files, npz_checkpoint
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import load_vocab
from tests import convert_fixtures as cf


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return cf.write_text_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"))


def checkpoint(directory, vocab, generator_hidden=128, step=4000, drop=(), adam_slots=False, **kwargs):
    weights = cf.official_weights(cf.vocab_size_of(vocab), generator_hidden, **kwargs)
    for name in drop:
        del weights[name]
    prefix = cf.write_google_checkpoint(str(directory / "google" / "electra_small"), weights, step,
                                        adam_slots=adam_slots)
    return prefix, weights


@pytest.fixture(scope="module")
def small_pp(tmp_path_factory, vocab):
    """Small++ shapes scaled down (generator as wide as the discriminator), with Adam slots."""
    return checkpoint(tmp_path_factory.mktemp("small_pp"), vocab, generator_hidden=128, adam_slots=True)


def out_dir(tmp_path, name="imported"):
    return str(tmp_path / "data" / "models" / name)


# --- Size inference ---------------------------------------------------------------------------------
def official_shapes_of(hidden, layers, embedding, gen_hidden, vocab=30522):
    """Shapes (only) of a released-size checkpoint, from the hand-written layout."""
    shapes = {"electra/embeddings/word_embeddings": (vocab, embedding),
              "electra/embeddings/position_embeddings": (512, embedding),
              "electra/embeddings/token_type_embeddings": (2, embedding)}
    for scope, width in (("electra", hidden), ("generator", gen_hidden)):
        for i in range(layers):
            shapes[f"{scope}/encoder/layer_{i}/attention/self/query/kernel"] = (width, width)
            shapes[f"{scope}/encoder/layer_{i}/intermediate/dense/kernel"] = (width, 4 * width)
    shapes["generator_predictions/output_bias"] = (vocab,)
    shapes["discriminator_predictions/dense/kernel"] = (hidden, hidden)
    return shapes


@pytest.mark.parametrize("dims, expected", [
    # Released ELECTRA-Small is Small++: generator as wide as the discriminator (README, issue #39).
    ((256, 12, 128, 256), {"model_size": "small", "generator_hidden_size": 1.0}),
    # The paper's Small: the official default 1/4 generator needs no hparam.
    ((256, 12, 128, 64), {"model_size": "small"}),
    # Base: the preset (embedding 768, generator 0.33333 -> 256) already reproduces the shapes.
    ((768, 12, 768, 256), {"model_size": "base"}),
    # Large: generator 256 of 1024 is the default 0.25.
    ((1024, 24, 1024, 256), {"model_size": "large"}),
])
def test_released_sizes_resolve_to_the_official_hparams(tmp_path, dims, expected):
    sizes = google_sizes.infer_sizes(official_shapes_of(*dims))
    config, hparams = google_sizes.resolve_config(sizes, out_dir(tmp_path))
    assert hparams == dict(expected, vocab_size=30522, embedding_size=dims[2])
    from electra_tf.config.model_config import get_bert_config, get_generator_config
    bert = get_bert_config(config)
    generator = get_generator_config(config, bert)
    assert (bert.hidden_size, bert.num_hidden_layers, bert.embedding_size) == dims[:3]
    assert generator.hidden_size == dims[3] and generator.num_hidden_layers == dims[1]
    assert config.model_dir == out_dir(tmp_path)


# --- from-google ------------------------------------------------------------------------------------
def test_import_writes_the_model_dir_the_trainer_continues_from(tmp_path, vocab, small_pp):
    prefix, weights = small_pp
    result = google.import_google_checkpoint(prefix + ".index", vocab, out_dir(tmp_path))  # file accepted
    root = out_dir(tmp_path)
    assert sorted(os.listdir(root)) == ["config.json", "init_checkpoint", "vocab.txt"]
    assert result.global_step == 4000
    assert result.loaded_parts == ("electra", "generator", "generator_predictions", "discriminator_predictions")
    assert result.fresh_parts == ()
    assert result.hparams["generator_hidden_size"] == 1.0
    with open(os.path.join(root, "vocab.txt"), "rb") as a, open(vocab, "rb") as b:
        assert a.read() == b.read()

    # The trainer's side of the contract: config.json -> the same model; restore model and step.
    config = PretrainingConfig.load(os.path.join(root, "config.json"))
    assert config.generator_hidden_size == 1.0 and config.model_dir == root
    model = ElectraPretrainer.from_pretraining_config(config, load_vocab(os.path.join(root, "vocab.txt")).special)
    model.build_from_sequence_length()
    step = tf.Variable(0, dtype=tf.int64)
    path = tf.train.latest_checkpoint(os.path.join(root, checkpoint_files.INIT_CHECKPOINT_DIR))
    assert path.endswith(os.path.join(checkpoint_files.INIT_CHECKPOINT_DIR, "ckpt-0"))
    tf.train.Checkpoint(model=model, step=step).restore(path).assert_existing_objects_matched()
    assert int(step.numpy()) == 4000
    restored = names.get_official_weights(model)
    assert set(restored) == set(weights)
    for name, value in weights.items():  # exact: no Adam slot (all 7.0) was read instead
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_import_writes_a_tensorflow_free_copy_of_the_same_weights(tmp_path, vocab, small_pp):
    """init_checkpoint/ckpt-0.npz, what --backend jax / torch start from: the model variables
    of TensorFlow's ckpt-0 (the seed states too), the imported step, no optimizer."""
    prefix, weights = small_pp
    result = google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path))
    init_dir = os.path.join(out_dir(tmp_path), checkpoint_files.INIT_CHECKPOINT_DIR)
    assert sorted(os.listdir(init_dir)) == ["checkpoint", "ckpt-0.data-00000-of-00001",
                                            "ckpt-0.index", "ckpt-0.npz"]
    path = os.path.join(init_dir, checkpoint_files.INIT_PORTABLE_NAME)
    meta = npz_checkpoint.read_meta(path)
    assert (meta["step"], meta["optimizer_paths"], meta["data_state"]) == (4000, [], None)
    assert npz_checkpoint.checkpoint_problem(path) is None
    model = ElectraPretrainer.from_pretraining_config(result.config, load_vocab(vocab).special)
    model.build_from_sequence_length()
    assert npz_checkpoint.restore(path, model, None).step == 4000
    for ours, imported in zip(npz_checkpoint.model_variables(model),
                              npz_checkpoint.model_variables(result.model), strict=True):
        np.testing.assert_array_equal(ours.numpy(), imported.numpy(), err_msg=ours.path)
    restored = names.get_official_weights(model)
    for name, value in weights.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_quarter_generator_needs_no_generator_hparam(tmp_path, vocab):
    prefix, weights = checkpoint(tmp_path, vocab, generator_hidden=32)
    result = google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path))
    assert "generator_hidden_size" not in result.hparams and result.config.generator_hidden_size == 0.25
    got = names.get_official_weights(result.model)
    for name, value in weights.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_discriminator_only_checkpoint_gets_a_fresh_seeded_generator(tmp_path, vocab, caplog):
    # No generator/* and no generator_predictions/*: generator initialised fresh, and said so.
    prefix, weights = checkpoint(tmp_path, vocab, generator_hidden=None)
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        result = google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path, "disc"),
                                                 hparams={"generator_hidden_size": 1.0})
    assert result.loaded_parts == ("electra", "discriminator_predictions")
    assert result.fresh_parts == ("generator", "generator_predictions")
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "no generator/* / generator_predictions/* variables" in message
    assert "initialised fresh" in message and "generator hidden_size 128" in message
    fresh = names.get_official_weights(result.model)
    np.testing.assert_array_equal(fresh["electra/encoder/layer_0/output/dense/kernel"],
                                  weights["electra/encoder/layer_0/output/dense/kernel"])
    assert fresh["generator/encoder/layer_0/output/dense/kernel"].shape == (512, 128)
    assert np.std(fresh["generator/encoder/layer_0/output/dense/kernel"]) > 0.01  # initialised
    # Fresh parts follow the config's seed: a second import gives the same generator.
    again = google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path, "disc2"),
                                            hparams={"generator_hidden_size": 1.0})
    np.testing.assert_array_equal(names.get_official_weights(again.model)["generator_predictions/dense/kernel"],
                                  fresh["generator_predictions/dense/kernel"])


def test_checkpoint_without_discriminator_head_gets_a_fresh_one(tmp_path, vocab, caplog):
    prefix, _ = checkpoint(tmp_path, vocab, discriminator_head=False)
    with caplog.at_level(logging.WARNING, logger="electra_tf"):
        result = google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path))
    assert result.fresh_parts == ("discriminator_predictions",)
    assert "discriminator_predictions/*" in caplog.text


def test_mlm_head_without_generator_encoder_means_a_tied_generator(tmp_path, vocab):
    weights = cf.official_weights(cf.vocab_size_of(vocab), 32)
    tied = {k: v for k, v in weights.items() if not k.startswith("generator/")}
    # A tied generator's head reads the discriminator: [H, E] instead of [Hg, E].
    tied["generator_predictions/dense/kernel"] = np.ones([128, 64], np.float32)
    prefix = cf.write_google_checkpoint(str(tmp_path / "tied" / "model.ckpt-3"), tied, 3)
    result = google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path))
    assert result.hparams["untied_generator"] is False
    assert result.fresh_parts == ()


@pytest.mark.parametrize("hparams, model_size, message", [
    # vocab size
    ({"vocab_size": 30}, None,
     r"electra/embeddings/word_embeddings has shape \[(\d+), 64\], but the model configured by "
     r"model_size=small, --hparams \{\"vocab_size\": 30\} expects \[30, 64\]"),
    # hidden size (model_size says 256 wide; the embedding width is stated too)
    ({"embedding_size": 64}, "small",
     r"electra/embeddings_project/kernel has shape \[64, 128\], but the model configured by "
     r"model_size=small.* expects \[64, 256\]"),
    # generator size: a 1/4 generator stated, a same-size one in the checkpoint
    ({"generator_hidden_size": 0.25}, None,
     r"generator/embeddings_project/kernel has shape \[64, 128\], but .* expects \[64, 32\]"),
])
def test_mismatches_name_the_variable_and_both_shapes(tmp_path, vocab, small_pp, hparams, model_size, message):
    prefix, _ = small_pp
    with pytest.raises(ConversionError, match=message):
        google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path), hparams=hparams,
                                        model_size=model_size)
    assert not os.path.exists(out_dir(tmp_path))  # nothing written


def test_missing_variable_and_vocab_mismatch_are_errors(tmp_path, vocab, small_pp):
    prefix, _ = checkpoint(tmp_path, vocab, drop=["electra/encoder/layer_1/output/LayerNorm/beta"])
    with pytest.raises(ConversionError, match=r"lacks variable electra/encoder/layer_1/output/LayerNorm/beta "
                                              r"\(expected shape \[128\]"):
        google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path))

    prefix, _ = small_pp
    bigger = str(tmp_path / "bigger_vocab.txt")
    with open(vocab) as f, open(bigger, "w") as g:
        g.write(f.read() + "extra1\nextra2\n")
    n = cf.vocab_size_of(vocab)
    with pytest.raises(ConversionError, match=rf"has {n + 2} tokens, but checkpoint variable "
                                              rf"electra/embeddings/word_embeddings has shape \[{n}, 64\]"):
        google.import_google_checkpoint(prefix, bigger, out_dir(tmp_path))

    with pytest.raises(ConversionError, match="no such checkpoint"):
        google.import_google_checkpoint(str(tmp_path / "nothing"), vocab, out_dir(tmp_path))


def test_output_dir_is_never_silently_replaced(tmp_path, vocab, small_pp):
    prefix, _ = small_pp
    google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path))
    with pytest.raises(ConversionError, match="already holds config.json, vocab.txt, init_checkpoint; pass --overwrite"):
        google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path))
    google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path), overwrite=True)
    # A directory where training already wrote checkpoints would ignore the import: refused.
    with open(os.path.join(out_dir(tmp_path), "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "ckpt-0"\n')
    tf.train.Checkpoint(v=tf.Variable(1.0)).write(os.path.join(out_dir(tmp_path), "ckpt-0"))
    with pytest.raises(ConversionError, match="holds a training run's checkpoints"):
        google.import_google_checkpoint(prefix, vocab, out_dir(tmp_path), overwrite=True)
    # A run of --backend jax / torch there (ckpt-N.npz) too.
    jax_run = out_dir(tmp_path, "jax_run")
    google.import_google_checkpoint(prefix, vocab, jax_run)
    shutil.copy(os.path.join(jax_run, checkpoint_files.INIT_CHECKPOINT_DIR,
                             checkpoint_files.INIT_PORTABLE_NAME),
                os.path.join(jax_run, npz_checkpoint.file_name(4010)))
    with pytest.raises(ConversionError, match="holds a training run's checkpoints"):
        google.import_google_checkpoint(prefix, vocab, jax_run, overwrite=True)
    # An object-based (TF2) checkpoint is not Google's format.
    with pytest.raises(ConversionError, match="TF2 object-based checkpoint"):
        google.import_google_checkpoint(os.path.join(out_dir(tmp_path), "ckpt-0"), vocab, out_dir(tmp_path, "x"))


def test_continue_hparams_follow_the_official_readme():
    hp = google.continue_hparams({"generator_hidden_size": 1.0}, 4_000_000)
    assert hp["num_train_steps"] == 4_010_000
    assert hp["learning_rate"] == pytest.approx(2e-4 * (4e6 + 10000) / 10000)
    assert hp["generator_hidden_size"] == 1.0
    # The user's own choices win.
    assert google.continue_hparams({"learning_rate": 1e-4}, 5)["learning_rate"] == 1e-4


# --- to-google --------------------------------------------------------------------------------------
def test_ours_to_google_to_ours_is_exact(tmp_path, vocab):
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab))
    model_dir, _, weights = cf.make_model_dir(str(tmp_path), hparams, vocab, step=1234)
    google_dir = str(tmp_path / "google_out")
    prefix = google.export_google_checkpoint(model_dir, google_dir)
    assert prefix == os.path.join(google_dir, "model.ckpt-1234")
    assert tf.train.latest_checkpoint(google_dir) == prefix
    listed = dict(tf.train.list_variables(prefix))
    # Exactly the official names and shapes (spec 5.9, hand-written in the fixture), plus global_step.
    official = cf.official_weights(cf.vocab_size_of(vocab), 32)
    assert set(listed) == set(official) | {"global_step"}
    for name, value in official.items():
        assert tuple(listed[name]) == value.shape, name
    reader = tf.train.load_checkpoint(prefix)
    assert int(reader.get_tensor("global_step")) == 1234
    assert reader.get_variable_to_dtype_map()["electra/encoder/layer_0/attention/self/query/kernel"] == tf.float32

    # The directory is accepted too (its `checkpoint` state file names the checkpoint).
    result = google.import_google_checkpoint(google_dir, os.path.join(google_dir, "vocab.txt"),
                                             out_dir(tmp_path, "back"))
    assert result.global_step == 1234 and result.fresh_parts == ()
    assert result.config.generator_hidden_size == 0.25
    back = names.get_official_weights(result.model)
    assert set(back) == set(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)

    with pytest.raises(ConversionError, match="pass --overwrite"):
        google.export_google_checkpoint(model_dir, google_dir)


def test_export_reads_only_the_model_from_the_latest_checkpoint(tmp_path, vocab):
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab), generator_hidden_size=1.0)
    model_dir, _, weights = cf.make_model_dir(str(tmp_path), hparams, vocab, step=7)
    loaded = load_model_dir(model_dir)
    assert loaded.step == 7 and loaded.checkpoint.endswith("ckpt-7")
    got = names.get_official_weights(loaded.model)
    np.testing.assert_array_equal(got["generator_predictions/output_bias"], weights["generator_predictions/output_bias"])
    with pytest.raises(ConversionError, match="no such checkpoint"):
        load_model_dir(model_dir, checkpoint=os.path.join(model_dir, "ckpt-8"))
    with pytest.raises(ConversionError, match="no config.json"):
        load_model_dir(str(tmp_path))
    # A config whose model does not match the checkpoint is refused, not half-loaded.
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config["generator_hidden_size"] = 0.25
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ConversionError, match="does not match"):
        load_model_dir(model_dir)
