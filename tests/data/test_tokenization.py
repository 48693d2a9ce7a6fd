"""Tokenisation parity with BERT's FullTokenizer (parity item 7 of official_electra.md).

Two independent references:
- `SpecFullTokenizer` below: pure Python written from section 1.2 of the spec (no TensorFlow);
- HF `tokenizers` (BertNormalizer + BertPreTokenizer + WordPiece, max 200 chars per word), which
  is BERT's tokenizer re-implemented in Rust. It differs from BERT in a few places (listed in
  `HF_DEVIATIONS`): per-character lowercasing (no final sigma), keeping unassigned code points,
  stripping accents without lowercasing, and its own Unicode tables. There the spec reference
  decides.
Every comparison is exact id equality.
"""

import os
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import normalizers, pre_tokenizers
from tokenizers.models import WordPiece

from electra_tf.data.text.basic_tokenizer import GraphBasicTokenizer
from electra_tf.data.text.tokenization import MAX_INPUT_CHARS_PER_WORD, Tokenizer
from electra_tf.data.text.unicode_tables import unicode_tables
from electra_tf.vocab import load_vocab

from tests.pretraining_fixtures import REPO_ROOT
REAL_VOCAB = os.path.join(REPO_ROOT, "pretrain_data", "vocab.txt")
REAL_CORPUS = os.path.join(REPO_ROOT, "pretrain_data", "corpus")
FETCH_HINT = "run `python pretrain_data/fetch.py` to fetch the real BERT vocab and corpus"

# (do_lower_case, strip_accents); the third is the official quirk (strip without lowercasing).
SETTINGS = [(True, True), (True, False), (False, True), (False, False)]


# ------------------------------------------------------------------------------------------------
# Spec reference: section 1.2 of official_electra.md, written independently of the implementation.
# ------------------------------------------------------------------------------------------------
SPEC_CJK = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]


def spec_is_cjk(ch):
    return any(lo <= ord(ch) <= hi for lo, hi in SPEC_CJK)


def spec_is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch)[0] == "P"


def spec_basic_tokenize(text, do_lower_case, strip_accents):
    if isinstance(text, bytes):
        text = text.decode("utf-8", "ignore")
    cleaned = []
    for ch in text:
        if ch in "\t\n\r" or unicodedata.category(ch) == "Zs":
            cleaned.append(" ")
        elif ord(ch) in (0, 0xFFFD) or unicodedata.category(ch)[0] == "C":
            continue
        else:
            cleaned.append(f" {ch} " if spec_is_cjk(ch) else ch)
    words = []
    for token in "".join(cleaned).split():
        if do_lower_case:
            token = token.lower()
            if strip_accents:
                token = "".join(c for c in unicodedata.normalize("NFD", token)
                                if unicodedata.category(c) != "Mn")
        current = ""
        for ch in token:
            if spec_is_punct(ch):
                words += [current, ch] if current else [ch]
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    return " ".join(words).split()


class SpecFullTokenizer:
    def __init__(self, tokens, do_lower_case=True, strip_accents=True):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.do_lower_case, self.strip_accents = do_lower_case, strip_accents

    def wordpiece(self, word):
        if len(word) > 200:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    pieces.append(piece)
                    start = end
                    break
            else:
                return ["[UNK]"]
        return pieces

    def encode(self, text):
        words = spec_basic_tokenize(text, self.do_lower_case, self.strip_accents)
        return [self.ids[p] for w in words for p in self.wordpiece(w)]


def make_hf(tokens, do_lower_case, strip_accents):
    hf = HFTokenizer(WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                               max_input_chars_per_word=200))
    # HF strips accents independently of lowercasing; BERT only when lowercasing.
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True,
        strip_accents=do_lower_case and strip_accents, lowercase=do_lower_case)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return hf


def hf_encode(hf, texts):
    return [e.ids for e in hf.encode_batch(list(texts), add_special_tokens=False)]


def rows(tokenizer, texts):
    ids, splits = tokenizer.encode_batch(texts)
    return [ids[splits[i]:splits[i + 1]].tolist() for i in range(len(texts))]


# ------------------------------------------------------------------------------------------------
# A small vocab written by the test, covering the special cases below.
# ------------------------------------------------------------------------------------------------
WORDS = ("hello world the quick brown fox un ##aff ##able cafe café naive naïve resume résumé "
         "angstrom ångström facade façade fiance ﬁ ﬁancé fi ##nce straße strasse ß ss ẞ "
         "istanbul i̇stanbul ı οδος οδοσ σας σ ς ὀδυσσευς οδυσσευς ａ ａｂｃ １２３ "
         "中 文 字 日 本 語 한국어 😀 ❤ 👍 hello123 abc ab ##c ##bc").split()


def write_test_vocab(path):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [chr(c) for c in range(33, 127)] + list("éèêëïîôöüçåñœæøαβγδεζηθικλμνξοπρστυφχψω")
    tokens = specials + [f"[unused{i}]" for i in range(3)]
    for t in chars + ["##" + c for c in chars] + WORDS:
        if t not in tokens:
            tokens.append(t)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return load_vocab(str(path))


@pytest.fixture(scope="module")
def test_vocab(tmp_path_factory):
    return write_test_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


@pytest.fixture(scope="module")
def real_vocab():
    if not os.path.isfile(REAL_VOCAB):
        pytest.skip(f"{REAL_VOCAB} is missing: {FETCH_HINT}")
    return load_vocab(REAL_VOCAB)


_tokenizer_cache = {}


def get_tokenizer(vocab, do_lower_case, strip_accents):
    key = (vocab.path, do_lower_case, strip_accents)
    if key not in _tokenizer_cache:
        _tokenizer_cache[key] = Tokenizer(vocab, do_lower_case, strip_accents)
    return _tokenizer_cache[key]


CASES = [
    # empty and whitespace only (Zs, Zl, Zp, tabs, newlines)
    "", " ", "   \t\n\r ", "\u3000\u00a0\u2028\u2029\u202f",
    "hello\u2028world", "hello\u3000world\u00a0the",
    # plain text, mixed case
    "Hello World", "HELLO, WORLD!", "the quick brown fox unaffable",
    # accents, with and without lowercasing
    "Café naïve RÉSUMÉ Ångström façade", "cafe\u0301 e\u0301", "\u0301abc", "a\u0301\u0302\u0327b",
    "CAFÉ", "Ñandú",
    # CJK ideographs (split) vs Hangul / kana (not split); compatibility and extension B
    "中文abc字", "日本語のテキスト", "한국어 텍스트", "\uf900\u4e00x\U00020000y", "hello中world",
    # ASCII punctuation incl. symbols that are not Unicode P*
    "Hello, world! (a) [b] {c} a-b a_b a/b a@b a#b", "$^`~ a$b a^b a`b a~b a|b a+b a<b>c",
    # Unicode punctuation (P*) and non-punctuation symbols (S*)
    "«quoted» „de“ — dash… ¿qué? ¡sí! ‘single’ “double” a·b", "¥€£ ©®™ a°b ±", "a\u2014b\u2026c",
    "a\u0387b\u037ec",
    # control characters, NUL, U+FFFD
    "a\x01b\x7fc\x1bd", "tab\there\nnew\rline", "a\x0bb\x0cc", "a\x85b a\x1cb a\x1fb",
    "a\x00b", "\x00", "a\ufffdb", "\ufffd\ufffd",
    # zero-width and other format characters (Cf), private use, unassigned
    "a\u200bb", "a\u200cb\u200dc", "\ufeffhello", "a\u2060b a\u00adb", "a\ue000b", "a\U0010fffdb",
    "a\u0378b", "a\U000e0001b",
    # full-width forms, ligatures
    "ＡＢＣ １２３ ！", "ａｂｃ", "ﬁ ﬂ ﬃ ﬁancé", "ﬁ",
    # Turkish dotted / dotless i
    "İstanbul", "ISTANBUL ıi İ", "İ",
    # German sharp s
    "Straße STRASSE ß ẞ",
    # Greek sigma: final vs medial, contexts
    "ΟΔΟΣ", "ΣΑΣ", "Σ", "ΑΣ.", "ΑΣ'Α", "ὈΔΥΣΣΕΎΣ", "ΟΔΟΣ中", "σας ΣΑΣ Σας",
    # emoji (So), skin tones (Sk), ZWJ sequences, flags
    "I ❤️ NY 😀👍🏽", "👨\u200d👩\u200d👧", "🇺🇸",
    # words at and around the 200-character limit (code points, counted after normalisation)
    "a" * 199, "a" * 200, "a" * 201, "a" * 201 + " hello", "x" * 1000, "a" * 5000 + " b",
    "é" * 200, "é" * 201, "É" * 150 + "é" * 51, "İ" * 100, "İ" * 101, "a" * 150 + "\u0301" * 60,
    "ab" * 100 + "." + "cd" * 150, "-" * 300, "中" * 300, ("a" * 199 + "中") * 3,
    "hello " + "\u0301" * 250,
    # over-long runs broken by a separator are not over-long words (and a deleted one joins them)
    "a" * 150 + "\u2028" + "a" * 150, "a" * 150 + "\u3000" + "a" * 150, "a" * 150 + "," + "a" * 150,
    "a" * 150 + "中" + "a" * 150, "a" * 150 + "\x00" + "a" * 60, "a" * 150 + "\u200b" + "a" * 50,
    # unmatchable words become one [UNK]
    "hello☃world", "☃", "q\u0416z", "hello qqq☃",
    # lone surrogate (category Cs)
    "a\ud800b",
]

# Cases where HF tokenizers 0.23 (not our implementation) differs from the spec reference.
HF_DEVIATIONS = {
    "ΟΔΟΣ", "ΣΑΣ", "ΑΣ.", "ὈΔΥΣΣΕΎΣ", "ΟΔΟΣ中", "σας ΣΑΣ Σας",  # no final sigma
    "a\u0378b", "a\U000e0001b",  # unassigned code points are kept
    "a\ud800b",  # HF cannot take a lone surrogate
}


@pytest.mark.parametrize("do_lower_case,strip_accents", SETTINGS)
def test_special_cases_match_spec_reference(test_vocab, do_lower_case, strip_accents):
    tok = get_tokenizer(test_vocab, do_lower_case, strip_accents)
    spec = SpecFullTokenizer(test_vocab.tokens, do_lower_case, strip_accents)
    got = rows(tok, CASES)
    for text, ids in zip(CASES, got):
        assert ids == spec.encode(text), repr(text)


@pytest.mark.parametrize("do_lower_case,strip_accents", SETTINGS)
def test_special_cases_match_hf(test_vocab, do_lower_case, strip_accents):
    cases = [c for c in CASES if c not in HF_DEVIATIONS]
    tok = get_tokenizer(test_vocab, do_lower_case, strip_accents)
    hf = make_hf(test_vocab.tokens, do_lower_case, strip_accents)
    for text, ids, expected in zip(cases, rows(tok, cases), hf_encode(hf, cases)):
        assert ids == expected, repr(text)


def test_examples_spelled_out(test_vocab):
    tok = get_tokenizer(test_vocab, True, True)
    assert tok.wordpieces("UNaffable Café") == ["un", "##aff", "##able", "cafe"]
    assert tok.wordpieces("ΟΔΟΣ") == ["οδος"]  # final sigma, as Python's str.lower
    assert tok.wordpieces("Straße ﬁ") == ["straße", "ﬁ"]  # no NFKC case folding
    assert tok.wordpieces("İstanbul") == ["istanbul"]  # i + U+0307, then the mark is stripped
    assert tok.wordpieces("a\x00b\ufffdc\u200bd") == ["abc", "##d"]  # deleted, joined
    assert tok.wordpieces("a" * 200) == ["a"] + ["##a"] * 199
    assert tok.wordpieces("a" * 201) == ["[UNK]"]
    assert tok.wordpieces("hello☃world, 中文") == ["[UNK]", ",", "中", "文"]
    keep_case = get_tokenizer(test_vocab, False, True)
    assert keep_case.wordpieces("Café") == ["C", "##a", "##f", "##é"]  # no stripping (quirk)
    assert get_tokenizer(test_vocab, True, False).wordpieces("İstanbul") == ["i̇stanbul"]
    # Lowercasing can lengthen a word past the limit: 101 "İ" -> 202 code points.
    assert get_tokenizer(test_vocab, True, False).wordpieces("İ" * 101) == ["[UNK]"]


def _every_code_point_sample():
    """Every code point except surrogates; unassigned and private-use ones thinned to 1 in 97."""
    out = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        cat = unicodedata.category(chr(cp))
        if cat in ("Cn", "Co") and cp % 97:
            continue
        out.append(chr(cp))
    return out


# Without lowercasing only cleaning and splitting act, which both settings below also exercise.
@pytest.mark.parametrize("do_lower_case,strip_accents", [(True, True), (True, False)])
def test_basic_tokenizer_matches_spec_on_every_code_point(do_lower_case, strip_accents):
    chars = _every_code_point_sample()
    texts = ["Ab" + ch + "c" + ch for ch in chars]
    basic = GraphBasicTokenizer(do_lower_case, strip_accents)
    words = basic.tokenize(tf.constant(texts))
    for ch, text, got in zip(chars, texts, words.to_list()):
        assert [w.decode("utf-8") for w in got] == spec_basic_tokenize(
            text, do_lower_case, strip_accents), f"U+{ord(ch):04X}"


def test_library_word_boundaries_match_bert():
    """FastWordpieceTokenizer's own whitespace/punctuation/CJK split equals BERT's on every code
    point that survives cleaning (the module relies on this)."""
    deleted = [ch for ch in _every_code_point_sample()
               if (unicodedata.category(ch)[0] == "C" and ch not in "\t\n\r") or ord(ch) == 0xFFFD]
    chars = sorted(set(_every_code_point_sample()) - set(deleted))
    fw = tf_text.FastWordpieceTokenizer(["[UNK]", "b", "##b"], token_out_type=tf.int32)
    lengths = fw.tokenize(["b" + ch + "b" for ch in chars]).row_lengths().numpy()
    for ch, n in zip(chars, lengths):
        if ch == "b":
            continue
        bert_boundary = (ch.isspace() or unicodedata.category(ch) == "Zs" or spec_is_punct(ch)
                         or spec_is_cjk(ch))
        # A boundary gives "b", ("[UNK]",) "b"; inside a word the whole "b?b" is one [UNK].
        assert (n != 1) == bert_boundary, f"U+{ord(ch):04X}"


def test_unicode_tables_use_python_unicodedata():
    assert unicode_tables().unicode_version == unicodedata.unidata_version


def test_invalid_utf8_bytes_are_dropped_like_bert(test_vocab):
    tok = get_tokenizer(test_vocab, True, True)
    spec = SpecFullTokenizer(test_vocab.tokens)
    data = [b"a\xffb", b"caf\xc3\xa9\xc3", b"\xe2\x82hello", b"a\xed\xa0\x80b", b"\xc0\x80x",
            "naïve".encode("utf-8")]
    for raw, ids in zip(data, rows(tok, data)):
        assert ids == spec.encode(raw), raw


def test_encode_batch_api(test_vocab):
    tok = Tokenizer(test_vocab)
    assert (tok.vocab, tok.do_lower_case, tok.strip_accents) == (test_vocab, True, True)
    texts = ["hello world", "", "   ", "the fox"]
    ids, splits = tok.encode_batch(texts)
    assert ids.dtype == np.int32 and splits.dtype == np.int64
    assert splits.tolist() == [0, 2, 2, 2, 4]
    assert ids.tolist() == [test_vocab.tokens.index(t) for t in ["hello", "world", "the", "fox"]]
    assert tok.encode("hello world") == ids[:2].tolist()
    assert tok.wordpieces("hello fox") == ["hello", "fox"]
    empty_ids, empty_splits = tok.encode_batch([])
    assert empty_ids.shape == (0,) and empty_splits.tolist() == [0]
    # Batch composition does not change a row's result.
    assert rows(tok, texts[::-1]) == rows(tok, texts)[::-1]


def test_graph_tokenizer_in_tf_function_dataset_and_savedmodel(test_vocab, tmp_path):
    tok = Tokenizer(test_vocab)
    graph = tok.graph_tokenizer()
    texts = ["Hello World!", "", "a" * 201 + " ΟΔΟΣ", "İstanbul 中文"]
    expected = rows(tok, texts)

    @tf.function
    def wrapped(x):
        return graph.tokenize(x)

    out = wrapped(tf.constant(texts))
    assert isinstance(out, tf.RaggedTensor) and out.dtype == tf.int32
    assert out.to_list() == expected
    ds = tf.data.Dataset.from_tensor_slices(texts).batch(2).map(graph.tokenize)
    assert [r for batch in ds for r in batch.to_list()] == expected

    module = tf.Module()
    module.tokenizer = graph
    module.serve = tf.function(lambda x: graph.tokenize(x).to_tensor(),
                               input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(module, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    assert loaded.tokenizer.tokenize(tf.constant(texts)).to_list() == expected
    padded = loaded.serve(tf.constant(texts)).numpy()
    assert [row[:len(e)].tolist() for row, e in zip(padded, expected)] == expected


def test_vocab_token_limits(tmp_path):
    base = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##a", "\ue000x", "\ue001"]

    def vocab_with(extra, name):
        path = tmp_path / name
        path.write_text("\n".join(base + extra) + "\n", encoding="utf-8")
        return load_vocab(str(path))

    # A token BERT can never match (over 200 code points) and over FastWordpiece's 256-byte limit
    # is tolerated; the placeholder for over-long words avoids characters that start tokens.
    tok = Tokenizer(vocab_with(["b" * 300], "long.txt"))
    unk = tok.vocab.special.unk_id
    assert tok.encode("a" * 201 + " aa") == [unk, 5, 6]
    assert tok.encode("b" * 300) == [unk]
    # A matchable token over 256 bytes cannot be represented: a clear error.
    with pytest.raises(ValueError, match="UTF-8 bytes"):
        Tokenizer(vocab_with(["é" * 150], "matchable.txt"))


# ------------------------------------------------------------------------------------------------
# Real BERT uncased vocab and the default corpus (fetched by pretrain_data/fetch.py).
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus_sample():
    if not os.path.isdir(REAL_CORPUS) or not os.listdir(REAL_CORPUS):
        pytest.skip(f"{REAL_CORPUS} is missing: {FETCH_HINT}")
    lines = []
    for name in sorted(os.listdir(REAL_CORPUS)):
        with open(os.path.join(REAL_CORPUS, name), encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f):
                line = line.rstrip("\n")
                # Every 8th line, plus every line that is not plain ASCII.
                if line and (i % 8 == 0 or not line.isascii()):
                    lines.append(line)
    return lines


@pytest.mark.parametrize("do_lower_case,strip_accents", [(True, True), (False, False)])
def test_real_corpus_matches_hf_and_spec(real_vocab, corpus_sample, do_lower_case, strip_accents):
    tok = get_tokenizer(real_vocab, do_lower_case, strip_accents)
    hf = make_hf(real_vocab.tokens, do_lower_case, strip_accents)
    spec = SpecFullTokenizer(real_vocab.tokens, do_lower_case, strip_accents)
    got = rows(tok, corpus_sample)
    expected = hf_encode(hf, corpus_sample)
    assert sum(len(r) for r in got) > 100_000
    for i, (text, ids, hf_ids) in enumerate(zip(corpus_sample, got, expected)):
        if ids != hf_ids or i % 50 == 0 or not text.isascii():
            assert ids == spec.encode(text), repr(text)


@pytest.mark.parametrize("do_lower_case,strip_accents", SETTINGS)
def test_real_vocab_special_cases(real_vocab, do_lower_case, strip_accents):
    tok = get_tokenizer(real_vocab, do_lower_case, strip_accents)
    spec = SpecFullTokenizer(real_vocab.tokens, do_lower_case, strip_accents)
    hf = make_hf(real_vocab.tokens, do_lower_case, strip_accents)
    cases = [c for c in CASES if c not in HF_DEVIATIONS]
    hf_ids = dict(zip(cases, hf_encode(hf, cases)))
    for text, ids in zip(CASES, rows(tok, CASES)):
        assert ids == spec.encode(text), repr(text)
        if text in hf_ids:
            assert ids == hf_ids[text], repr(text)


def test_real_vocab_known_ids(real_vocab):
    tok = get_tokenizer(real_vocab, True, True)
    assert real_vocab.special.unk_id == 100
    assert tok.wordpieces("Hello, unaffable world!") == ["hello", ",", "una", "##ffa", "##ble",
                                                          "world", "!"]
    assert tok.encode("the") == [1996]
    assert len(tok.encode("a" * MAX_INPUT_CHARS_PER_WORD)) > 1
    assert tok.encode("a" * (MAX_INPUT_CHARS_PER_WORD + 1)) == [100]
