"""The dataset builder's tokenizers without TensorFlow: BERT's FullTokenizer and SentencePiece.

`tokenization.Tokenizer` runs in a TensorFlow graph (tensorflow-text); `PortableTokenizer` gives
the same ids where TensorFlow is not installed (a JAX or PyTorch machine), with the same
`encode_batch` interface, so the builder packs the same examples (`build_pretraining_dataset.py
--tokenizer`, `tokenizer_choice`).

**WordPiece.** BERT's BasicTokenizer (steps 1-5 of `tokenization`'s module docstring) is Python
string work over whole lines, with the character classes of `unicode_tables` (Python's
`unicodedata`, the data BERT's own Python code consults): deleted characters and word separators
replaced, spaces put around CJK ideographs, then `str.lower()` (BERT's own call), then NFD with
the nonspacing marks (Mn) removed when lowercasing with `strip_accents` (BERT's quirk: without
lowercasing nothing is stripped), then spaces around punctuation (`BasicTokenizer.normalize`).
The classes are `re` patterns of the basic plane (matched by table lookup); the rare astral
characters (emoji, CJK extensions) are looked up one by one, since `re` tries astral ranges
linearly. A pure-ASCII line (most lines of an English corpus) needs only `str.lower()` (and a
`translate` when it holds a control character). A batch's words are then cut out of its UTF-8
bytes by one regex (ASCII punctuation splits there; the rest was spaced out), and each distinct
word is tokenised once by Hugging Face `tokenizers`' `WordPiece` model (Rust, with BERT's "##"
continuations and 200-character limit: a longer word, or one with a part that cannot be matched,
is one [UNK]); its ids are cached per tokenizer, so a batch costs a dict lookup per word and
numpy gathers. HF's own `BertNormalizer` and `BertPreTokenizer` are not used: they lowercase
character by character (no final sigma), keep unassigned code points, strip accents without
lowercasing and split by their own Unicode tables (`tests/data/test_tokenization.py`,
`HF_DEVIATIONS`; docs/design.md, "Building without TensorFlow").

Equal to the TensorFlow tokenizer on every corpus and special case of the tests, on every code
point in context, for all four settings of lowercasing and accent stripping
(`tests/data/test_portable_tokenization.py`), except one class of input, where this one is
BERT's and TensorFlow's is not: a Greek capital sigma whose final-sigma context (the cased
letter before it, none after it, across case-ignorable characters) holds a character that
TensorFlow's ICU does not know (Unicode 14 letters such as U+2C2F GLAGOLITIC CAPITAL LETTER
CAUDATE CHRIVI: "ⰯΣ" is "ⱟς" here and in BERT, "ⱟσ" in TensorFlow; `basic_tokenizer`'s
residual). A vocab with a matchable token over 256 UTF-8 bytes is refused by the TensorFlow
tokenizer and tokenised here. The builder therefore records which tokenizer built a dataset in
its manifest and never mixes the two in one build (`tokenizer_choice`).

**SentencePiece.** The `sentencepiece` package's processor on the model's bytes (the library
tensorflow-text's op wraps; the model carries its normalisation), ids unchanged, no sampling,
no BOS/EOS; bytes that are not UTF-8 (and lone surrogates) are dropped first, as the graph
does.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
import unicodedata
from typing import Dict, List, Sequence, Tuple

import numpy as np

from electra_tf.data.text.unicode_tables import CJK_RANGES, code_point_masks
from electra_tf.vocab import WORDPIECE, Vocab

# Official WordpieceTokenizer(max_input_chars_per_word=200) and its continuation prefix.
MAX_INPUT_CHARS_PER_WORD = 200
SUFFIX_INDICATOR = "##"
# Words whose WordPiece ids are remembered per tokenizer (~60 MB at the cap); a full cache is
# emptied (a batch's own words are kept whatever their number). Word frequencies are Zipfian:
# nearly every word of a batch is a hit.
WORD_CACHE_SIZE = 1 << 18
_SURROGATES = (0xD800, 0xDFFF)
_BMP = 0x10000
# Official _is_punctuation for ASCII: 33-47, 58-64, 91-96, 123-126.
_ASCII_PUNCTUATION = r"!-/:-@\[-`{-~"


def _bmp_class(mask: np.ndarray) -> "re.Pattern":
    """A Python `re` pattern of one character of the basic plane where `mask` is true.

    Only the basic plane: `re` matches a class of its ranges by table lookup, but tries astral
    ranges one by one (~1.5 us per character of text for BERT's deleted class). Astral
    characters, rare in text (emoji, CJK extensions), are looked up in `_Patterns.kinds`."""
    bmp = mask[:_BMP].astype(np.int8)
    edges = np.diff(np.concatenate([[0], bmp, [0]]))
    starts = np.flatnonzero(edges == 1).tolist()
    ends = (np.flatnonzero(edges == -1) - 1).tolist()
    parts = [re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
             for a, b in zip(starts, ends)]
    return re.compile("[" + "".join(parts) + "]")


# Bits of `_Patterns.kinds`, one byte per code point.
_DELETED, _CJK, _MARK, _PUNCTUATION = 1, 2, 4, 8


class _Patterns:
    """BERT's character classes (`unicode_tables.code_point_masks`) as Python patterns (basic
    plane) and a byte per code point (astral characters)."""

    def __init__(self):
        masks = code_point_masks()
        deleted = masks.deleted.copy()
        deleted[_SURROGATES[0]:_SURROGATES[1] + 1] = True  # lone surrogates: category Cs
        cjk = np.zeros_like(deleted)
        for lo, hi in CJK_RANGES:
            cjk[lo:hi + 1] = True
        punctuation = masks.split & ~cjk
        assert not masks.whitespace[_BMP:].any()  # every separator is in the basic plane
        self.deleted = _bmp_class(deleted)
        self.whitespace = _bmp_class(masks.whitespace)
        self.cjk = _bmp_class(cjk)
        self.marks = _bmp_class(masks.nonspacing_marks)
        self.punctuation = _bmp_class(punctuation)
        self.astral = re.compile(f"[{re.escape(chr(_BMP))}-{re.escape(chr(0x10FFFF))}]")
        self.kinds = (deleted * _DELETED + cjk * _CJK + masks.nonspacing_marks * _MARK
                      + punctuation * _PUNCTUATION).astype(np.uint8).tobytes()
        # ASCII: the deleted controls and the separators (tab, line feed, carriage return).
        self.ascii_clean = str.maketrans({cp: None if deleted[cp] else " " for cp in range(128)
                                          if deleted[cp] or masks.whitespace[cp]})

    def astral_clean(self, match: "re.Match") -> str:
        """Step 1-2 for one astral character: deleted, or spaced out (CJK), or kept."""
        ch = match.group()
        kind = self.kinds[ord(ch)]
        return "" if kind & _DELETED else f" {ch} " if kind & _CJK else ch

    def astral_split(self, match: "re.Match") -> str:
        """Step 5 for one astral character: spaced out (punctuation), or kept."""
        ch = match.group()
        return f" {ch} " if self.kinds[ord(ch)] & _PUNCTUATION else ch

    def astral_strip_and_split(self, match: "re.Match") -> str:
        """Steps 4 (marks) and 5 for one astral character."""
        ch = match.group()
        kind = self.kinds[ord(ch)]
        return "" if kind & _MARK else f" {ch} " if kind & _PUNCTUATION else ch


@functools.lru_cache(maxsize=None)
def _patterns() -> _Patterns:
    return _Patterns()


# The words of a `BasicTokenizer.normalize`d text: one ASCII punctuation character, or a run of
# characters that are neither that nor a space (other punctuation is spaced out already). On
# its UTF-8 bytes (faster: a batch is mostly ASCII) a multi-byte character is part of a word.
WORDS = re.compile(f"[^ {_ASCII_PUNCTUATION}]+|[{_ASCII_PUNCTUATION}]")
_WORD_BYTES = re.compile(WORDS.pattern.encode("ascii"))


class BasicTokenizer:
    """BERT's BasicTokenizer as Python string work (steps 1-5 of the module docstring).

    Args:
        do_lower_case: bool. `str.lower()` (and, with `strip_accents`, NFD minus Mn).
        strip_accents: bool. Only applies when `do_lower_case` (official quirk).
    """

    def __init__(self, do_lower_case: bool = True, strip_accents: bool = True):
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = bool(strip_accents)
        self._p = _patterns()

    def normalize(self, text) -> str:
        """`text` cleaned, lowercased (and stripped), CJK and non-ASCII punctuation spaced out:
        its BERT words are `WORDS.findall(normalize(text))`, and it holds no U+0000.

        Args:
            text: str, or bytes (what is not UTF-8 is dropped, as BERT's errors="ignore").
        """
        if isinstance(text, bytes):
            text = text.decode("utf-8", "ignore")
        p = self._p
        if text.isascii():  # most lines of most corpora: no marks, no CJK, C-speed steps
            if not text.isprintable():
                text = text.translate(p.ascii_clean)
            return text.lower() if self.do_lower_case else text
        has_astral = p.astral.search(text) is not None
        if has_astral:
            text = p.astral.sub(p.astral_clean, text)
        text = p.deleted.sub("", text)
        text = p.whitespace.sub(" ", text)
        text = p.cjk.sub(r" \g<0> ", text)
        strip = self.do_lower_case and self.strip_accents
        if self.do_lower_case:
            text = text.lower()
            if strip:
                text = p.marks.sub("", unicodedata.normalize("NFD", text))
        if has_astral:  # (NFD makes astral characters only out of astral ones)
            text = p.astral.sub(p.astral_strip_and_split if strip else p.astral_split, text)
        return p.punctuation.sub(r" \g<0> ", text)

    def tokenize(self, text) -> List[str]:
        """BERT's BasicTokenizer words of `text` (str or bytes)."""
        return WORDS.findall(self.normalize(text))


# Ends each row of a batch among its words: U+0000 is deleted by cleaning, so it is no word.
_ROW_END = b"\x00"


class _WordCache:
    """WordPiece ids of the words seen, as one flat array (a word's ids are a slice of it)."""

    def __init__(self, wordpiece):
        self._wordpiece = wordpiece
        self.clear()

    def clear(self) -> None:
        self.slots: Dict[bytes, int] = {_ROW_END: 0}
        self.starts = np.zeros(1024, np.int64)
        self.lengths = np.zeros(1024, np.int64)
        self.ids = np.zeros(4096, np.int32)
        self.num_ids = 0

    def add(self, words: List[bytes]) -> None:
        """Tokenises `words` (UTF-8, each without a space) with WordPiece, stores their ids."""
        rows = [e.ids for e in self._wordpiece.encode_batch_fast(
            [w.decode("utf-8") for w in words], add_special_tokens=False)]
        first = len(self.slots)
        lengths = np.fromiter(map(len, rows), np.int64, len(rows))
        flat = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum()))
        self.starts = _fit(self.starts, first + len(rows))
        self.lengths = _fit(self.lengths, first + len(rows))
        self.ids = _fit(self.ids, self.num_ids + len(flat))
        self.lengths[first:first + len(rows)] = lengths
        self.starts[first:first + len(rows)] = self.num_ids + np.cumsum(lengths) - lengths
        self.ids[self.num_ids:self.num_ids + len(flat)] = flat
        self.num_ids += len(flat)
        self.slots.update(zip(words, range(first, first + len(rows))))

    def lookup(self, words: List[bytes]) -> np.ndarray:
        """int64 [len(words)]: the slot of each word (UTF-8), adding the new ones."""
        new = set(words).difference(self.slots)
        if new:
            if len(self.slots) + len(new) > WORD_CACHE_SIZE:  # full: start again (a batch's
                self.clear()                                   # words are always all kept)
                new = set(words).difference(self.slots)
            self.add(sorted(new))
        return np.atleast_1d(np.array(operator.itemgetter(*words)(self.slots), np.int64))


def _fit(array: np.ndarray, size: int) -> np.ndarray:
    """`array`, grown (doubling) to hold at least `size` elements."""
    if size <= len(array):
        return array
    grown = np.zeros(max(size, 2 * len(array)), array.dtype)
    grown[:len(array)] = array
    return grown


class PortableTokenizer:
    """The builder's tokenizer without TensorFlow (see module docstring).

    Args:
        vocab: electra_tf.vocab.Vocab, either kind.
        do_lower_case, strip_accents: WordPiece only, as `tokenization.Tokenizer`'s (a
            SentencePiece model normalises itself: both are then False).
    """

    def __init__(self, vocab: Vocab, do_lower_case: bool = True, strip_accents: bool = True):
        self.vocab = vocab
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        if vocab.kind == WORDPIECE:
            self._basic = BasicTokenizer(do_lower_case, strip_accents)
            self._words = _WordCache(_hf_wordpiece(vocab))
        else:
            import sentencepiece

            self._sentencepiece = sentencepiece.SentencePieceProcessor(model_proto=vocab.model)
            self.do_lower_case = self.strip_accents = False

    def encode_batch(self, texts: Sequence) -> Tuple[np.ndarray, np.ndarray]:
        """Tokenises a batch (as `tokenization.Tokenizer.encode_batch`).

        Args:
            texts: sequence of str (or UTF-8 bytes), length n.

        Returns:
            (ids, row_splits): ids int32 [total_tokens], the ids of all texts concatenated;
            row_splits int64 [n + 1], text i is ids[row_splits[i]:row_splits[i + 1]].
        """
        if len(texts) == 0:
            return np.zeros([0], np.int32), np.zeros([1], np.int64)
        if self.vocab.kind != WORDPIECE:
            return self._encode_sentencepiece(texts)
        # All rows' words at once, each row ended by _ROW_END: C loops over words, not Python.
        text = " \x00 ".join(map(self._basic.normalize, texts)) + " \x00"
        words = _WORD_BYTES.findall(text.encode("utf-8"))
        cache = self._words
        slots = cache.lookup(words)
        lengths = cache.lengths[slots]
        ends = np.cumsum(lengths)
        splits = np.zeros(len(texts) + 1, np.int64)
        splits[1:] = ends[slots == 0]
        # The ids of word k are cache.ids[starts[k]:starts[k] + lengths[k]].
        offsets = np.repeat(cache.starts[slots] - (ends - lengths), lengths)
        ids = cache.ids[offsets + np.arange(len(offsets))]
        return ids, splits

    def _encode_sentencepiece(self, texts: Sequence) -> Tuple[np.ndarray, np.ndarray]:
        rows = self._sentencepiece.encode([_valid_utf8(t) for t in texts], out_type=int)
        splits = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(r) for r in rows], out=splits[1:])
        return np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(splits[-1])), splits

    def encode(self, text) -> List[int]:
        """The ids of one text (no [CLS]/[SEP])."""
        ids, _ = self.encode_batch([text])
        return ids.tolist()

    def wordpieces(self, text) -> List[str]:
        """Token strings (WordPieces or SentencePiece pieces) of one text."""
        return [self.vocab.tokens[i] for i in self.encode(text)]


def _hf_wordpiece(vocab: Vocab):
    """Hugging Face `tokenizers`: BERT's WordPiece over the vocab, for one word at a time (the
    whitespace pre-tokenizer leaves a word without spaces whole)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers
    from tokenizers.models import WordPiece

    model = WordPiece({token: i for i, token in enumerate(vocab.tokens)},
                      unk_token=vocab.tokens[vocab.special.unk_id],
                      continuing_subword_prefix=SUFFIX_INDICATOR,
                      max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    tokenizer = HFTokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def _valid_utf8(text) -> str:
    """`text` with the bytes that are not UTF-8 (and lone surrogates) dropped."""
    if isinstance(text, bytes):
        return text.decode("utf-8", "ignore")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "ignore")
    return text
