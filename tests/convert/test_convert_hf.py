"""Parity with an independent implementation: Hugging Face transformers (PyTorch, CPU).

- from-google: a TF1 checkpoint written by tf.compat.v1 savers is imported by us AND read by
  transformers' own reader of Google's format (`load_tf_weights_in_electra`, whose name mapping is
  not ours); discriminator sequence output and logits, and generator MLM logits, must agree within
  1e-4 (float32) on real text tokenised by the project tokenizer.
- to-hf: our model directory -> safetensors directory -> `from_pretrained` with no missing or
  unexpected weights, same outputs; `AutoTokenizer` loads the tokenizer offline.
- to-google: our checkpoint in Google's format is read by `load_tf_weights_in_electra`.

Skipped only when the test extras (torch, transformers) are not installed.
"""

import contextlib
import io
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a test extra (pip install -r requirements-test.txt)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is a test extra (pip install -r requirements-test.txt)")
from transformers.models.electra.modeling_electra import load_tf_weights_in_electra  # noqa: E402

from electra_tf.convert import google, hf  # noqa: E402
from electra_tf.convert.names import ConversionError  # noqa: E402

from tests import convert_fixtures as cf  # noqa: E402

TOLERANCE = 1e-4  # max abs difference, float32 (issue #6)
H, L, E = cf.TINY["hidden_size"], cf.TINY["num_hidden_layers"], cf.TINY["embedding_size"]


def hf_from_tf1(model_class, prefix, vocab_size, hidden, part):
    """A transformers model filled by transformers' own TF1 reader (prints a line per weight)."""
    config = cf.hf_config(vocab_size, hidden, L, E)
    model = model_class(config)
    with contextlib.redirect_stdout(io.StringIO()):
        load_tf_weights_in_electra(model, config, prefix, discriminator_or_generator=part)
    return model


def report(name, diff):
    print(f"parity {name}: max abs diff {diff:.3g}")  # shown with pytest -s; see docs/conversion.md
    assert diff <= TOLERANCE, (name, diff)


@pytest.mark.parametrize("generator_hidden, real_vocab", [
    (128, True),  # Small++ (same-size generator) scaled down, real BERT vocab when fetched
    (32, False),  # official 1/4 generator
])
def test_imported_google_checkpoint_matches_transformers(tmp_path, generator_hidden, real_vocab):
    vocab = cf.text_vocab_path(str(tmp_path), real=real_vocab)
    vocab_size = cf.vocab_size_of(vocab)
    weights = cf.official_weights(vocab_size, generator_hidden, seed=11)
    prefix = cf.write_google_checkpoint(str(tmp_path / "google" / "model.ckpt-500"), weights, 500,
                                        adam_slots=real_vocab)
    result = google.import_google_checkpoint(prefix, vocab, str(tmp_path / "data" / "models" / "imported"))
    model = result.model
    ids, mask, seg = cf.encode_text(vocab)

    seq, logits = cf.ours_discriminator(model, ids, mask, seg)
    ref = hf_from_tf1(transformers.ElectraForPreTraining, prefix, vocab_size, H, "discriminator")
    ref_seq, ref_logits = cf.hf_discriminator(ref, ids, mask, seg)
    report(f"discriminator sequence_output (gen {generator_hidden})", cf.max_abs_diff(seq, ref_seq))
    report(f"discriminator logits (gen {generator_hidden})", cf.max_abs_diff(logits, ref_logits))
    assert np.abs(ref_logits).max() > 1.0  # the comparison is not between near-zero numbers

    mlm = cf.ours_generator_logits(model, ids, mask, seg)
    ref = hf_from_tf1(transformers.ElectraForMaskedLM, prefix, vocab_size, generator_hidden, "generator")
    ref_mlm = cf.hf_generator_logits(ref, ids, mask, seg)
    assert mlm.shape == ref_mlm.shape == ids.shape + (vocab_size,)
    report(f"generator MLM logits (gen {generator_hidden})", cf.max_abs_diff(mlm, ref_mlm))
    assert np.abs(ref_mlm).max() > 5.0


def test_discriminator_only_checkpoint_matches_transformers(tmp_path):
    vocab = cf.text_vocab_path(str(tmp_path), real=False)
    weights = cf.official_weights(cf.vocab_size_of(vocab), None, seed=12)
    prefix = cf.write_google_checkpoint(str(tmp_path / "google" / "disc"), weights, 0, adam_slots=False)
    result = google.import_google_checkpoint(prefix, vocab, str(tmp_path / "data" / "models" / "d"))
    assert result.fresh_parts == ("generator", "generator_predictions")
    ids, mask, seg = cf.encode_text(vocab)
    seq, logits = cf.ours_discriminator(result.model, ids, mask, seg)
    ref = hf_from_tf1(transformers.ElectraForPreTraining, prefix, cf.vocab_size_of(vocab), H, "discriminator")
    ref_seq, ref_logits = cf.hf_discriminator(ref, ids, mask, seg)
    report("discriminator-only sequence_output", cf.max_abs_diff(seq, ref_seq))
    report("discriminator-only logits", cf.max_abs_diff(logits, ref_logits))


# --- to-hf --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    vocab = cf.text_vocab_path(str(root), real=True)
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab))
    directory, model, _ = cf.make_model_dir(str(root), hparams, vocab, seed=5, step=300)
    return directory, model, vocab


def load_hf(model_class, directory):
    model, info = model_class.from_pretrained(directory, output_loading_info=True, local_files_only=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    assert info["mismatched_keys"] == [], info
    return model


def test_to_hf_discriminator_loads_in_transformers_with_the_same_outputs(tmp_path, model_dir):
    directory, model, vocab = model_dir
    out = str(tmp_path / "hf_disc")
    hf.export_hf(directory, out)
    assert sorted(os.listdir(out)) == sorted(set(hf.OUTPUTS) - {hf.SPM_MODEL_NAME})
    ids, mask, seg = cf.encode_text(vocab)
    seq, logits = cf.ours_discriminator(model, ids, mask, seg)

    ref_seq, ref_logits = cf.hf_discriminator(load_hf(transformers.ElectraForPreTraining, out), ids, mask, seg)
    report("to-hf discriminator sequence_output", cf.max_abs_diff(seq, ref_seq))
    report("to-hf discriminator logits", cf.max_abs_diff(logits, ref_logits))
    base = transformers.ElectraModel.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        hidden = base(**cf.torch_inputs(ids, mask, seg)).last_hidden_state.numpy()
    report("to-hf ElectraModel last_hidden_state", cf.max_abs_diff(seq, hidden))

    # Safetensors (a JSON header, not a pickle), float32, PyTorch [out, in] Linear weights.
    from safetensors import safe_open
    with safe_open(os.path.join(out, hf.WEIGHTS_NAME), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_tensor("electra.embeddings_project.weight").shape == (H, E)
    with open(os.path.join(out, hf.WEIGHTS_NAME), "rb") as f:
        assert f.read(9)[8:9] == b"{"
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["ElectraForPreTraining"] and config["num_attention_heads"] == 2

    # The tokenizer loads offline and tokenises as the project tokenizer does.
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    first, second = cf.SENTENCES[0]
    encoded = tokenizer(first, second)
    np.testing.assert_array_equal(encoded["input_ids"], ids[0][mask[0] == 1])
    np.testing.assert_array_equal(encoded["token_type_ids"], seg[0][mask[0] == 1])


def test_to_hf_generator_loads_as_masked_lm(tmp_path, model_dir):
    directory, model, vocab = model_dir
    out = str(tmp_path / "hf_gen")
    hf.export_hf(directory, out, part="generator")
    ref = load_hf(transformers.ElectraForMaskedLM, out)
    # The output projection is the word-embedding table (tied), as in the official model.
    assert ref.generator_lm_head.weight.data_ptr() == ref.electra.embeddings.word_embeddings.weight.data_ptr()
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert (config["hidden_size"], config["embedding_size"], config["num_attention_heads"]) == (32, E, 1)
    ids, mask, seg = cf.encode_text(vocab)
    report("to-hf generator MLM logits", cf.max_abs_diff(cf.ours_generator_logits(model, ids, mask, seg),
                                                       cf.hf_generator_logits(ref, ids, mask, seg)))
    with pytest.raises(ConversionError, match="pass --overwrite"):
        hf.export_hf(directory, out, part="generator")
    hf.export_hf(directory, out, part="generator", overwrite=True)


def test_to_hf_generator_with_its_own_embeddings(tmp_path):
    vocab = cf.text_vocab_path(str(tmp_path), real=False)
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab), untied_generator_embeddings=True)
    directory, model, _ = cf.make_model_dir(str(tmp_path), hparams, vocab, seed=6)
    out = str(tmp_path / "hf_gen")
    hf.export_hf(directory, out, part="generator")
    ids, mask, seg = cf.encode_text(vocab)
    ref = load_hf(transformers.ElectraForMaskedLM, out)
    report("to-hf untied-embeddings generator", cf.max_abs_diff(cf.ours_generator_logits(model, ids, mask, seg),
                                                              cf.hf_generator_logits(ref, ids, mask, seg)))


# --- to-google read by transformers -------------------------------------------------------------------
def test_to_google_is_read_by_transformers(tmp_path, model_dir):
    directory, model, vocab = model_dir
    prefix = google.export_google_checkpoint(directory, str(tmp_path / "google"))
    ids, mask, seg = cf.encode_text(vocab)
    vocab_size = cf.vocab_size_of(vocab)
    seq, logits = cf.ours_discriminator(model, ids, mask, seg)
    ref_seq, ref_logits = cf.hf_discriminator(
        hf_from_tf1(transformers.ElectraForPreTraining, prefix, vocab_size, H, "discriminator"), ids, mask, seg)
    report("to-google discriminator sequence_output", cf.max_abs_diff(seq, ref_seq))
    report("to-google discriminator logits", cf.max_abs_diff(logits, ref_logits))
    ref_mlm = cf.hf_generator_logits(
        hf_from_tf1(transformers.ElectraForMaskedLM, prefix, vocab_size, 32, "generator"), ids, mask, seg)
    report("to-google generator MLM logits", cf.max_abs_diff(cf.ours_generator_logits(model, ids, mask, seg), ref_mlm))
