"""The Hugging Face export's tokenizer.json for a SentencePiece vocabulary: the same ids as the
in-graph tokenizer, checked through transformers' PreTrainedTokenizerFast on multilingual text
(accents, CJK, Korean, emoji, odd whitespace), for models trained in the test."""

import os

import pytest

pytest.importorskip("sentencepiece")
transformers = pytest.importorskip(
    "transformers", reason="transformers is a test extra (pip install -r requirements-test.txt)")

from electra_tf.convert.hf_spm_tokenizer import build_spm_tokenizer, spm_settings  # noqa: E402
from electra_tf.convert.hf_tokenizer import write_tokenizer_json  # noqa: E402
from electra_tf.data.text.spm_learning import learn_spm  # noqa: E402
from electra_tf.data.text.tokenization import Tokenizer  # noqa: E402
from electra_tf.vocab import load_vocab  # noqa: E402
from tests.spm_fixtures import SAMPLE_TEXTS, WORDS, train_model, write_corpus  # noqa: E402

TEXTS = SAMPLE_TEXTS + [
    "a\u3000b ideographic space", "x\u00a0y no-break", " \t ", "ABC  DEF\r\nghi", "😀😀 unk🎉run",
    "e\u0301 combining vs é", "Ｔｏｋｙｏ ｶﾀｶﾅ half-width", "tab\there", "x" * 300,
    " ".join(WORDS), "Großbuchstaben ÄÖÜ ÆØÅ æøå",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("hf_spm")))


def _fast(vocab, directory):
    path = os.path.join(directory, "tokenizer.json")
    write_tokenizer_json(path, vocab, True, True)
    tokens, special = vocab.tokens, vocab.special
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=path, unk_token=tokens[special.unk_id], pad_token=tokens[special.pad_id],
        cls_token=tokens[special.cls_id], sep_token=tokens[special.sep_id],
        mask_token=tokens[special.mask_id])


def _check_parity(vocab, fast):
    tokenizer = Tokenizer(vocab)
    ids, splits = tokenizer.encode_batch(TEXTS)
    special = vocab.special
    for i, text in enumerate(TEXTS):
        ours = ids[splits[i]:splits[i + 1]].tolist()
        assert fast(text)["input_ids"] == [special.cls_id] + ours + [special.sep_id], text
    encoded = fast(TEXTS[1], TEXTS[3])
    first = tokenizer.encode(TEXTS[1])
    second = tokenizer.encode(TEXTS[3])
    assert encoded["input_ids"] == ([special.cls_id] + first + [special.sep_id] + second
                                    + [special.sep_id])
    assert encoded["token_type_ids"] == [0] * (len(first) + 2) + [1] * (len(second) + 1)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_learned_model_ids_equal_in_transformers(corpus, tmp_path, do_lower_case):
    vocab = learn_spm([corpus], 150, str(tmp_path / "spm.model"), do_lower_case=do_lower_case)
    _check_parity(vocab, _fast(vocab, str(tmp_path)))


def test_byte_fallback_and_conventional_names(corpus, tmp_path):
    path = train_model(str(tmp_path / "bytes.model"), corpus, vocab_size=400, pad_id=0, unk_id=1,
                       bos_id=2, eos_id=3, user_defined_symbols="<mask>", byte_fallback=True,
                       character_coverage=0.98)
    vocab = load_vocab(path)
    assert spm_settings(vocab.model).byte_fallback
    fast = _fast(vocab, str(tmp_path))
    _check_parity(vocab, fast)
    assert fast.cls_token == "<s>" and fast.mask_token_id == vocab.special.mask_id


def _bpe(corpus, path, vocab_size=150, **options):
    return load_vocab(train_model(path, corpus, vocab_size=vocab_size, model_type="bpe",
                                  pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                                  control_symbols="[CLS],[SEP],[MASK]", **options))


@pytest.mark.parametrize("options", [{}, {"vocab_size": 400, "byte_fallback": True,
                                          "character_coverage": 0.98},
                                     {"vocab_size": 300, "normalization_rule_name": "nmt_nfkc_cf"}],
                         ids=["bpe", "byte_fallback", "case_folded"])
def test_bpe_model_ids_equal_in_transformers(corpus, tmp_path, options):
    # Was a ValueError (issue 47); 9000 random strings also agree with sentencepiece's encoder.
    vocab = _bpe(corpus, str(tmp_path / "bpe.model"), **options)
    assert spm_settings(vocab.model).model_type == 2
    _check_parity(vocab, _fast(vocab, str(tmp_path)))


def test_char_model_is_a_one_line_error(corpus, tmp_path):
    path = train_model(str(tmp_path / "char.model"), corpus, model_type="char", pad_id=0, unk_id=1,
                       bos_id=-1, eos_id=-1, control_symbols="[CLS],[SEP],[MASK]")
    with pytest.raises(ValueError, match="char.model is a char model; the Hugging Face export "
                                         "supports unigram models .* and bpe models"):
        build_spm_tokenizer(load_vocab(path))


def _spm_run(root, vocab):
    """A run directory trained with the SentencePiece model `vocab` (random weights)."""
    from electra_tf.training import run_dir
    from tests import convert_fixtures as cf

    model_dir = cf.make_model_dir(root, cf.tiny_hparams(vocab.size), vocab.path)[0]
    os.replace(os.path.join(model_dir, "vocab.txt"), os.path.join(model_dir, run_dir.SPM_MODEL_NAME))
    return model_dir


def test_to_hf_of_a_bpe_run_writes_a_tokenizer_giving_its_ids(corpus, tmp_path):
    # Was a ValueError traceback after config.json, model.safetensors and the tokenizer configs
    # were written (no tokenizer.json), and the rerun refused for the files already there.
    from electra_tf.convert.__main__ import main as convert_main

    vocab = _bpe(corpus, str(tmp_path / "bpe.model"))
    model_dir = _spm_run(str(tmp_path), vocab)
    out = str(tmp_path / "hf")
    assert convert_main(["--quiet", "to-hf", "--model-dir", model_dir, "--output-dir", out]) == 0
    assert "tokenizer.json" in os.listdir(out) and "spm.model" in os.listdir(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    ours = Tokenizer(vocab)
    special = vocab.special
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == [special.cls_id] + ours.encode(text) + [special.sep_id]


def test_to_hf_of_a_model_it_cannot_express_is_one_line_and_writes_nothing(corpus, tmp_path, capsys):
    from electra_tf.convert.__main__ import main as convert_main
    from tests import fault_fixtures as faults

    path = train_model(str(tmp_path / "char.model"), corpus, model_type="char", pad_id=0,
                       unk_id=1, bos_id=-1, eos_id=-1, control_symbols="[CLS],[SEP],[MASK]")
    model_dir = _spm_run(str(tmp_path), load_vocab(path))
    out = str(tmp_path / "hf")
    for _ in range(2):  # the same one line again: nothing written blocks the rerun
        code = convert_main(["--quiet", "to-hf", "--model-dir", model_dir, "--output-dir", out])
        line = faults.one_error_line(code, capsys.readouterr().err,
                                     "python -m electra_tf.convert to-hf")
        assert "is a char model" in line and f"nothing was written to {out}" in line, line
        assert not os.path.exists(out)
