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
from electra_tf.data.spm_learning import learn_spm  # noqa: E402
from electra_tf.data.tokenization import Tokenizer  # noqa: E402
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


def test_bpe_model_is_a_one_line_error(corpus, tmp_path):
    path = train_model(str(tmp_path / "bpe.model"), corpus, model_type="bpe", pad_id=0, unk_id=1,
                       bos_id=-1, eos_id=-1, control_symbols="[CLS],[SEP],[MASK]")
    with pytest.raises(ValueError, match="bpe.model is a bpe model; the Hugging Face export "
                                         "supports unigram"):
        build_spm_tokenizer(load_vocab(path))
