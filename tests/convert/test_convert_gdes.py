"""`embedding_sharing` "gdes" (issue 34): every export writes the discriminator's MERGED embeddings
(shared block + delta), so its outputs equal the in-framework discriminator's: to-hf, to-keras-hub,
to-google, the SavedModel export, and the encoder weights fine-tuning starts from."""

import os

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config.model_config import get_bert_config
from electra_tf.convert import google, hf, keras_hub as kh_convert, names
from electra_tf.modeling.embeddings import DisentangledEmbeddings
from electra_tf.modeling.encoder import ElectraEncoder
from electra_tf.training import run_dir
from electra_tf.training.tf import export as export_lib
from electra_tf.vocab import load_vocab
from tests import convert_fixtures as cf

TOLERANCE = 1e-4  # max abs difference, float32 (as the other converter tests)


@pytest.fixture(scope="module")
def gdes_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gdes")
    vocab = cf.text_vocab_path(str(root), real=True)
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab), embedding_sharing="gdes")
    directory, model, weights = cf.make_model_dir(str(root), hparams, vocab, seed=7, step=40)
    return directory, model, weights, vocab


def test_official_layout_holds_the_merged_discriminator_block_and_the_generators(gdes_run):
    _, model, weights, _ = gdes_run
    embeddings = model.discriminator.embeddings
    assert isinstance(embeddings, DisentangledEmbeddings)
    deltas = [d.numpy() for d in embeddings.deltas()]
    assert all(np.abs(d).max() > 0 for d in deltas)  # make_model_dir's random merged - shared
    official = names.get_official_weights(model)
    for name, shared, delta in zip(("word_embeddings", "token_type_embeddings",
                                    "position_embeddings", "LayerNorm/gamma", "LayerNorm/beta"),
                                   embeddings.shared_variables(), deltas):
        np.testing.assert_array_equal(official[f"generator/embeddings/{name}"], shared.numpy())
        np.testing.assert_allclose(official[f"electra/embeddings/{name}"],
                                   shared.numpy() + delta, rtol=0, atol=1e-7)
        np.testing.assert_allclose(official[f"electra/embeddings/{name}"],
                                   weights[f"electra/embeddings/{name}"],
                                   rtol=0, atol=1e-6)  # (merged - shared) + shared: one rounding


def test_to_hf_discriminator_and_generator_equal_ours(tmp_path, gdes_run):
    transformers = pytest.importorskip("transformers")
    directory, model, _, vocab = gdes_run
    ids, mask, seg = cf.encode_text(vocab)
    seq, logits = cf.ours_discriminator(model, ids, mask, seg)
    hf.export_hf(directory, str(tmp_path / "disc"))
    ref = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / "disc"), local_files_only=True)
    ref_seq, ref_logits = cf.hf_discriminator(ref, ids, mask, seg)
    assert cf.max_abs_diff(seq, ref_seq) <= TOLERANCE
    assert cf.max_abs_diff(logits, ref_logits) <= TOLERANCE
    hf.export_hf(directory, str(tmp_path / "gen"), part="generator")
    gen = transformers.ElectraForMaskedLM.from_pretrained(str(tmp_path / "gen"), local_files_only=True)
    assert cf.max_abs_diff(cf.ours_generator_logits(model, ids, mask, seg),
                           cf.hf_generator_logits(gen, ids, mask, seg)) <= TOLERANCE


def test_to_keras_hub_discriminator_equals_ours(tmp_path, gdes_run):
    directory, model, _, vocab = gdes_run
    out = str(tmp_path / "kh")
    kh_convert.export_keras_hub(directory, out)
    ids, mask, seg = cf.encode_text(vocab)
    ours, _ = cf.ours_discriminator(model, ids, mask, seg)
    backbone = keras_hub.models.ElectraBackbone.from_preset(out)
    for layer in backbone.transformer_layers:  # keras-hub's tanh GELU -> ELECTRA's exact one
        layer._feedforward_intermediate_dense.activation = keras.activations.gelu
    theirs = backbone({"token_ids": tf.constant(ids), "segment_ids": tf.constant(seg),
                       "padding_mask": tf.constant(mask)}, training=False)["sequence_output"].numpy()
    assert cf.max_abs_diff(ours, theirs) <= TOLERANCE


def test_to_google_writes_the_merged_discriminator_block(tmp_path, gdes_run):
    directory, model, _, vocab = gdes_run
    prefix = google.export_google_checkpoint(directory, str(tmp_path / "google"))
    reader = tf.train.load_checkpoint(prefix)
    official = names.get_official_weights(model)
    for name in ("electra/embeddings/word_embeddings", "electra/embeddings/LayerNorm/gamma",
                 "generator/embeddings/word_embeddings"):
        np.testing.assert_array_equal(reader.get_tensor(name), official[name])
    transformers = pytest.importorskip("transformers")
    from transformers.models.electra.modeling_electra import load_tf_weights_in_electra

    config = cf.hf_config(cf.vocab_size_of(vocab), cf.TINY["hidden_size"], cf.TINY["num_hidden_layers"],
                          cf.TINY["embedding_size"])
    ref = transformers.ElectraForPreTraining(config)
    load_tf_weights_in_electra(ref, config, prefix, discriminator_or_generator="discriminator")
    ids, mask, seg = cf.encode_text(vocab)
    seq, logits = cf.ours_discriminator(model, ids, mask, seg)
    ref_seq, ref_logits = cf.hf_discriminator(ref, ids, mask, seg)
    assert cf.max_abs_diff(seq, ref_seq) <= TOLERANCE and cf.max_abs_diff(logits, ref_logits) <= TOLERANCE


def test_saved_model_and_fine_tuning_start_from_the_merged_discriminator(gdes_run):
    directory, model, _, vocab_path = gdes_run
    loaded = run_dir.load_run(directory)  # the checkpoint holds the deltas
    for a, b in zip(loaded.model.discriminator.embeddings.deltas(), model.discriminator.embeddings.deltas()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    paths = export_lib.export_all(loaded.model, load_vocab(vocab_path), loaded.config, step=loaded.step)
    ids, mask, seg = cf.encode_text(vocab_path)
    seq, _ = cf.ours_discriminator(model, ids, mask, seg)
    served = tf.saved_model.load(paths["discriminator"]).signatures["serving_default"](
        input_ids=tf.constant(ids), input_mask=tf.constant(mask), segment_ids=tf.constant(seg))
    assert cf.max_abs_diff(seq, served["sequence_output"]) <= TOLERANCE
    # Fine-tuning reads the SavedModel's variables into a plain (tied-layout) encoder.
    encoder = ElectraEncoder.from_model_config(get_bert_config(loaded.config), name="electra")
    variables = os.path.join(paths["discriminator"], "variables", "variables")
    status = tf.train.Checkpoint(encoder=encoder).read(variables)
    status.expect_partial().assert_existing_objects_matched()
    inputs = {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask), "segment_ids": tf.constant(seg)}
    assert cf.max_abs_diff(seq, encoder(inputs, training=False)["sequence_output"]) <= TOLERANCE
