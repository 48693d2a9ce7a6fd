"""BERT's FullTokenizer, computed in-graph with TensorFlow string ops and tensorflow-text.

The official tokenizer (`model/tokenization.py`, identical to BERT's) is, per input string:

1. decode UTF-8 dropping undecodable bytes; delete U+0000, U+FFFD and every character of Unicode
   category C* except \\t \\n \\r; map \\t \\n \\r and category Zs to a space;
2. put spaces around CJK ideographs (`CJK_RANGES`);
3. split on Python whitespace (`str.split()`);
4. per word: if `do_lower_case`, `str.lower()`, then, only if lowercasing AND `strip_accents`,
   NFD and delete category Mn (quirk: `strip_accents` has no effect without lowercasing);
5. split off every punctuation character (ASCII 33-47, 58-64, 91-96, 123-126, or category P*);
6. WordPiece: greedy longest-match-first with "##" continuations; a word longer than 200 code
   points, or with any part that cannot be matched, becomes a single [UNK].

Here steps 1 and 4 are TensorFlow ops (`tf.strings.regex_replace`, `tf.strings.lower`,
`tensorflow_text.normalize_utf8`) over whole strings, and steps 2, 3, 5 and 6 are
`tensorflow_text.FastWordpieceTokenizer` in its end-to-end mode (it splits on whitespace,
punctuation and CJK ideographs itself, then runs WordPiece). Lowercasing whole strings equals
BERT's per-word lowercasing because a space is neither cased nor case-ignorable (the final-sigma
context stops there), and splitting CJK after lowercasing equals splitting before because
lowercasing and NFD never create or remove a CJK ideograph. The whole pipeline is one
`tf.function`, used both by the dataset builder (`Tokenizer.encode_batch`, one graph call per
batch) and by the exported SavedModel (`Tokenizer.graph_tokenizer()`), so training data and
serving tokenise identically.

Where the libraries differ from BERT, and how each difference is closed:

- tensorflow-text's `BertTokenizer` and `FastBertTokenizer` lowercase by case folding
  ("ß"->"ss", "ﬁ"->"fi", "ΟΔΟΣ"->"οδοσ" without final sigma; `BertTokenizer` also folds
  full-width "Ａ"->"a"), and turn control characters into spaces ("a\\x00b" -> "a", "b" where
  BERT deletes them and gives "ab"). BERT uses `str.lower()`. We use
  `tf.strings.lower(encoding="utf-8")` (ICU full lowercase mapping: "İ"->"i̇", final sigma
  "ΟΔΟΣ"->"οδος", "ß", "ﬁ" and full-width forms kept), and our own NFD + Mn removal, applied only
  when lowercasing (BERT's quirk).
- The ICU inside TensorFlow (behind `tf.strings.lower`) is older than Python's `unicodedata`
  (Unicode 14.0 in Python 3.11): with TF 2.21, 40 letters added in Unicode 14 are left
  uppercase. At construction we compare `tf.strings.lower` with `str.lower` on every code point
  that survives cleaning, and remap the differing characters to Python's lowercase before ICU
  lowercases the rest (`_lowercase_fixes`; only rows containing one pay for it). Residual: the
  final-sigma rule sees those letters as uncased ("ⰯΣ" gives "ⱟσ" where Python gives "ⱟς").
- tensorflow-text's `BertTokenizer` replaces only Cc/Cf with spaces; BERT deletes all of C*
  (including unassigned Cn, private-use Co) and U+FFFD. RE2's `\\p{..}` classes also follow RE2's
  own Unicode version. Every character class here (deleted, whitespace, Mn, punctuation + CJK) is
  therefore generated from Python's `unicodedata` as explicit code-point ranges
  (`unicode_tables`): the same data BERT's Python code consults.
- BERT splits words on `str.isspace()` characters, which after cleaning are the space, Zs and
  also U+2028 / U+2029 (Zl, Zp): all are mapped to a space. FastWordpieceTokenizer then splits on
  ICU White_Space and `u_ispunct` plus the same ASCII ranges and CJK blocks; on every code point
  that survives cleaning this equals BERT's rule (checked exhaustively by
  `tests/data/test_tokenization.py`).
- FastWordpieceTokenizer limits a word by UTF-8 bytes (`max_bytes_per_word`), BERT by 200 code
  points. We set the byte limit to 4 * 200 (a word over it has over 200 code points) and, before
  WordPiece, replace each word of more than 200 code points with one private-use placeholder
  character that no vocab token starts with, so it becomes exactly one [UNK]. Only rows with a
  run of 201+ non-space characters take this (slower) path.
- BERT decodes bytes with errors="ignore"; `tf.strings.unicode_transcode(errors="ignore")` drops
  the same bytes (checked against Python's decoder). Transcoding is slow, so only rows that are
  not well-formed UTF-8 take it. Lone surrogates in a Python `str` are encoded with
  "surrogatepass" and dropped there, as BERT drops category Cs.
- FastWordpieceTokenizer leaves out vocab tokens that contain punctuation (other than a single
  punctuation character) and rejects tokens over 256 UTF-8 bytes. BERT can never match the former
  (a word never contains punctuation) nor a token longer than 200 code points, so those are
  replaced by inert stand-ins; a matchable token over 256 bytes raises ValueError.
"""

from __future__ import annotations

import functools
import logging
import unicodedata
from typing import Callable, List, NamedTuple, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.vocab import UNK_TOKEN, WORDPIECE, Vocab

logger = logging.getLogger(__name__)

# Official WordpieceTokenizer(max_input_chars_per_word=200): longer words become [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
# Official WordPiece continuation prefix.
SUFFIX_INDICATOR = "##"
# A code point takes at most 4 bytes in UTF-8: a word over 4 * 200 bytes has over 200 code points.
MAX_UTF8_BYTES_PER_CHAR = 4
# tensorflow-text's FastWordpieceTokenizer rejects vocab tokens longer than this (excluding "##").
FAST_WORDPIECE_MAX_TOKEN_BYTES = 256
# Official BasicTokenizer._is_chinese_char blocks (inclusive ranges).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
# Official _is_punctuation: all non-alphanumeric printable ASCII counts as punctuation.
ASCII_PUNCTUATION_RANGES = ((33, 47), (58, 64), (91, 96), (123, 126))
# Official _is_whitespace / _is_control: these three controls are whitespace, not deleted.
WHITESPACE_CONTROLS = "\t\n\r"
# Official _clean_text deletes these two code points in addition to category C*.
DELETED_CODE_POINTS = (0x0000, 0xFFFD)
# BMP private-use area: deleted by cleaning (category Co), so a character from it can never
# reach WordPiece from the input and is free to stand in for an over-long word.
_PLACEHOLDER_RANGE = (0xE000, 0xF8FF)
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
# RE2 compiles these ranges to an automaton accepting exactly the well-formed UTF-8 strings
# (no overlong forms, surrogates or code points above U+10FFFF), as Python's decoder does.
_VALID_UTF8 = "(?s)[\\x{0}-\\x{d7ff}\\x{e000}-\\x{10ffff}]*"


def _re2_char(cp: int) -> str:
    return f"\\x{{{cp:x}}}"


def _re2_class(mask: np.ndarray, negate: bool = False) -> str:
    """An RE2 character class matching the code points where `mask` [0x110000] is true.

    Surrogates are left out: RE2 matches UTF-8, where they cannot occur.
    """
    mask = mask.copy()
    mask[_SURROGATES[0]:_SURROGATES[1] + 1] = False
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    parts = [_re2_char(lo) if lo == hi else f"{_re2_char(lo)}-{_re2_char(hi)}"
             for lo, hi in zip(starts.tolist(), ends.tolist())]
    return "[" + ("^" if negate else "") + "".join(parts) + "]"


class UnicodeTables(NamedTuple):
    """RE2 classes generated from Python's `unicodedata` (what BERT's Python code consults).

    Attributes:
        deleted: characters `_clean_text` deletes: U+0000, U+FFFD, category C* except \\t\\n\\r.
        whitespace: characters BERT treats as a word separator, other than the space itself:
            \\t\\n\\r, category Zs, and every other `str.isspace()` character that survives
            cleaning (U+2028, U+2029).
        nonspacing_marks: category Mn (removed after NFD when stripping accents).
        split: characters that always form a word of their own: punctuation and CJK ideographs.
        unicode_version: `unicodedata.unidata_version` the classes were built from.
    """

    deleted: str
    whitespace: str
    nonspacing_marks: str
    split: str
    unicode_version: str


def is_bert_punctuation(cp: int) -> bool:
    """Official `_is_punctuation` on a code point."""
    if any(lo <= cp <= hi for lo, hi in ASCII_PUNCTUATION_RANGES):
        return True
    return unicodedata.category(chr(cp)).startswith("P")


def is_cjk(cp: int) -> bool:
    """Official `_is_chinese_char`."""
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


class _CodePointMasks(NamedTuple):
    """Boolean [0x110000] arrays over all code points; see `UnicodeTables`."""

    deleted: np.ndarray
    whitespace: np.ndarray
    nonspacing_marks: np.ndarray
    split: np.ndarray


@functools.lru_cache(maxsize=None)
def _code_point_masks() -> _CodePointMasks:
    size = _MAX_CODE_POINT + 1
    names = sorted({unicodedata.category(chr(cp)) for cp in range(size)})
    index = {name: i for i, name in enumerate(names)}
    category = np.fromiter((index[unicodedata.category(chr(cp))] for cp in range(size)),
                           dtype=np.int16, count=size)

    def of(predicate):
        return np.isin(category, [index[name] for name in names if predicate(name)])

    deleted = of(lambda name: name.startswith("C"))
    for ch in WHITESPACE_CONTROLS:
        deleted[ord(ch)] = False
    deleted[list(DELETED_CODE_POINTS)] = True
    # str.split() (BERT's whitespace_tokenize) also splits on non-Zs spaces such as U+2028.
    whitespace = of(lambda name: name == "Zs")
    whitespace[[cp for cp in range(size) if chr(cp).isspace()]] = True
    whitespace &= ~deleted
    whitespace[ord(" ")] = False  # mapped to itself: leaving it out saves one rewrite per space
    split = of(lambda name: name.startswith("P"))
    for lo, hi in ASCII_PUNCTUATION_RANGES + CJK_RANGES:
        split[lo:hi + 1] = True
    return _CodePointMasks(deleted=deleted, whitespace=whitespace,
                           nonspacing_marks=of(lambda name: name == "Mn"), split=split)


@functools.lru_cache(maxsize=None)
def unicode_tables() -> UnicodeTables:
    """The character classes of BERT's BasicTokenizer as RE2 patterns (built once per process)."""
    masks = _code_point_masks()
    return UnicodeTables(
        deleted=_re2_class(masks.deleted),
        whitespace=_re2_class(masks.whitespace),
        nonspacing_marks=_re2_class(masks.nonspacing_marks),
        split=_re2_class(masks.split),
        unicode_version=unicodedata.unidata_version,
    )


@functools.lru_cache(maxsize=None)
def _lowercase_fixes() -> Tuple[Tuple[str, str], ...]:
    """(character, Python lowercase) for every character `tf.strings.lower` maps differently.

    Probes all code points that survive cleaning. A fix is kept only if ICU leaves the Python
    lowercase unchanged (so remapping before `tf.strings.lower` yields Python's result).
    """
    masks = _code_point_masks()
    survivors = ~(masks.deleted | masks.whitespace)
    survivors[_SURROGATES[0]:_SURROGATES[1] + 1] = False
    chars = [chr(cp) for cp in np.flatnonzero(survivors).tolist()]
    lowered = tf.strings.lower(tf.constant(chars), encoding="utf-8").numpy()
    diverging = [ch for ch, low in zip(chars, lowered) if low.decode("utf-8") != ch.lower()]
    if not diverging:
        return ()
    targets = [ch.lower() for ch in diverging]
    relowered = tf.strings.lower(tf.constant(targets), encoding="utf-8").numpy()
    fixes = []
    for ch, target, again in zip(diverging, targets, relowered):
        if again.decode("utf-8") == target:
            fixes.append((ch, target))
        else:
            logger.warning("cannot reproduce Python's lowercase of U+%04X with tf.strings.lower",
                           ord(ch))
    return tuple(fixes)


def _patch_rows(strings: tf.Tensor, needs_patch: tf.Tensor,
                patch: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
    """Applies `patch` to the rows where `needs_patch` is true, leaving the others untouched.

    Args:
        strings: tf.string [batch].
        needs_patch: tf.bool [batch].
        patch: maps a tf.string [k] to a tf.string [k].

    Returns:
        tf.string [batch].
    """
    patch_rows = tf.cast(tf.where(needs_patch)[:, 0], tf.int32)
    keep_rows = tf.cast(tf.where(tf.logical_not(needs_patch))[:, 0], tf.int32)
    return tf.dynamic_stitch(
        [keep_rows, patch_rows],
        [tf.gather(strings, keep_rows), patch(tf.gather(strings, patch_rows))])


def drop_invalid_utf8(strings: tf.Tensor) -> tf.Tensor:
    """Drops the bytes that are not UTF-8 (as BERT's errors="ignore" decoding does).

    Transcoding is slow: only rows that are not valid UTF-8 pay for it.

    Args:
        strings: tf.string [batch].

    Returns:
        tf.string [batch].
    """
    return _patch_rows(
        strings, tf.logical_not(tf.strings.regex_full_match(strings, _VALID_UTF8)),
        lambda rows: tf.strings.unicode_transcode(rows, "UTF-8", "UTF-8", errors="ignore"))


class GraphBasicTokenizer(tf.Module):
    """BERT's BasicTokenizer as TensorFlow ops (steps 1-5 of the module docstring).

    Args:
        do_lower_case: bool. Lowercase (and, with `strip_accents`, strip accents).
        strip_accents: bool. NFD + delete Mn; only applies when `do_lower_case` (official quirk).
    """

    def __init__(self, do_lower_case: bool = True, strip_accents: bool = True, name=None):
        super().__init__(name=name)
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = bool(strip_accents)
        tables = unicode_tables()
        self._deleted = tables.deleted
        self._whitespace = tables.whitespace
        self._nonspacing_marks = tables.nonspacing_marks
        self._split = tables.split
        self._fixes = _lowercase_fixes() if self.do_lower_case else ()
        self._fix_pattern = (
            "(?s).*[" + "".join(_re2_char(ord(ch)) for ch, _ in self._fixes) + "].*"
            if self._fixes else None)

    def _lowercase(self, strings: tf.Tensor) -> tf.Tensor:
        if self._fixes:
            def remap(rows):
                for ch, target in self._fixes:
                    rewrite = target.replace("\\", "\\\\")  # backslash is special in a rewrite
                    rows = tf.strings.regex_replace(rows, _re2_char(ord(ch)), rewrite)
                return rows

            has_fix = tf.strings.regex_full_match(strings, self._fix_pattern)
            strings = _patch_rows(strings, has_fix, remap)
        return tf.strings.lower(strings, encoding="utf-8")

    def _normalize(self, strings: tf.Tensor) -> tf.Tensor:
        strings = drop_invalid_utf8(strings)
        strings = tf.strings.regex_replace(strings, self._deleted, "")
        strings = tf.strings.regex_replace(strings, self._whitespace, " ")
        if self.do_lower_case:
            strings = self._lowercase(strings)
            if self.strip_accents:
                strings = tf_text.normalize_utf8(strings, "NFD")
                strings = tf.strings.regex_replace(strings, self._nonspacing_marks, "")
        return strings

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def normalize(self, strings: tf.Tensor) -> tf.Tensor:
        """Cleaned (and lowercased / accent-stripped) text; every separator is a plain space.

        Args:
            strings: tf.string [batch], UTF-8 (undecodable bytes are dropped).

        Returns:
            tf.string [batch]. Splitting it on spaces and around `UnicodeTables.split`
            characters gives BERT's BasicTokenizer words.
        """
        return self._normalize(strings)

    def _words(self, strings: tf.Tensor) -> tf.RaggedTensor:
        return tf_text.regex_split(
            self._normalize(strings), delim_regex_pattern=f" +|{self._split}",
            keep_delim_regex_pattern=self._split)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, strings: tf.Tensor) -> tf.RaggedTensor:
        """BERT BasicTokenizer words.

        Args:
            strings: tf.string [batch].

        Returns:
            tf.RaggedTensor of tf.string [batch, (words)].
        """
        return self._words(strings)


def _fast_wordpiece_vocab(tokens: Sequence[str]) -> List[str]:
    """The vocab as handed to FastWordpieceTokenizer (ids unchanged).

    Tokens BERT can never match and FastWordpieceTokenizer cannot hold (over 256 UTF-8 bytes)
    are swapped for unique inert stand-ins containing punctuation, which FastWordpiece skips.
    """
    present = set(tokens)
    out = list(tokens)
    for i, token in enumerate(tokens):
        body = token[len(SUFFIX_INDICATOR):] if (
            token.startswith(SUFFIX_INDICATOR) and token != SUFFIX_INDICATOR) else token
        if len(body.encode("utf-8")) <= FAST_WORDPIECE_MAX_TOKEN_BYTES:
            continue
        if len(body) <= MAX_INPUT_CHARS_PER_WORD:
            raise ValueError(
                f"vocab token {i} ({token[:40]!r}...) is {len(body.encode('utf-8'))} UTF-8 bytes "
                f"long; tensorflow-text's FastWordpieceTokenizer supports at most "
                f"{FAST_WORDPIECE_MAX_TOKEN_BYTES}")
        stand_in = f"[unmatchable:{i}]"
        while stand_in in present:
            stand_in += "!"
        present.add(stand_in)
        out[i] = stand_in
    return out


def _placeholder(tokens: Sequence[str]) -> str:
    """A private-use character that starts no vocab token (so a word of it is one [UNK])."""
    first_chars = set()
    for token in tokens:
        body = token[len(SUFFIX_INDICATOR):] if token.startswith(SUFFIX_INDICATOR) else token
        if token:
            first_chars.add(token[0])
        if body:
            first_chars.add(body[0])
    for cp in range(_PLACEHOLDER_RANGE[0], _PLACEHOLDER_RANGE[1] + 1):
        if chr(cp) not in first_chars:
            return chr(cp)
    raise ValueError("every private-use character U+E000-U+F8FF starts a vocab token; "
                     "cannot mark over-long words")


class GraphFullTokenizer(tf.Module):
    """BERT's FullTokenizer as one `tf.function`: text to WordPiece ids.

    Tracks into a SavedModel (the FastWordpiece model is a captured constant); loading it needs
    `import tensorflow_text` first, to register the ops.

    Args:
        vocab_tokens: token strings in id order.
        unk_token: str. Must be in `vocab_tokens`.
        do_lower_case: bool.
        strip_accents: bool.
    """

    def __init__(self, vocab_tokens: Sequence[str], unk_token: str = UNK_TOKEN,
                 do_lower_case: bool = True, strip_accents: bool = True, name=None):
        super().__init__(name=name)
        self.basic_tokenizer = GraphBasicTokenizer(do_lower_case, strip_accents)
        self.vocab_size = len(vocab_tokens)
        self._placeholder = _placeholder(vocab_tokens)
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=_fast_wordpiece_vocab(vocab_tokens),
            suffix_indicator=SUFFIX_INDICATOR,
            max_bytes_per_word=MAX_UTF8_BYTES_PER_CHAR * MAX_INPUT_CHARS_PER_WORD,
            token_out_type=tf.int32,
            unknown_token=unk_token,
            no_pretokenization=False,
        )
        # A row can hold an over-long word only if it has a run of 201+ non-space characters.
        self._long_run = f"[^ ]{{{MAX_INPUT_CHARS_PER_WORD + 1},}}"
        self._has_long_run = f"(?s).*{self._long_run}.*"

    def _mark_long_words(self, strings: tf.Tensor) -> tf.Tensor:
        split = self.basic_tokenizer._split

        def replace(rows):
            # Isolate punctuation / CJK first (FastWordpiece splits there anyway), so that every
            # remaining run of non-spaces is exactly one BERT word.
            rows = tf.strings.regex_replace(rows, split, r" \0 ")
            return tf.strings.regex_replace(rows, self._long_run, self._placeholder)

        has_long_run = tf.strings.regex_full_match(strings, self._has_long_run)
        return _patch_rows(strings, has_long_run, replace)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, strings: tf.Tensor) -> tf.RaggedTensor:
        """WordPiece ids of each string, without [CLS]/[SEP].

        Args:
            strings: tf.string [batch], UTF-8 text.

        Returns:
            tf.RaggedTensor of tf.int32 [batch, (tokens)] (row_splits tf.int64).
        """
        normalized = self.basic_tokenizer._normalize(strings)
        return self._wordpiece.tokenize(self._mark_long_words(normalized))


class Tokenizer:
    """The tokenizer of a `Vocab`: BERT's FullTokenizer for WordPiece, the model's SentencePiece.

    Args:
        vocab: electra_tf.vocab.Vocab.
        do_lower_case: bool. Lowercase the text (official default True). WordPiece only: a
            SentencePiece model normalises text its own way (stored in the model), and the
            tokenizer's `do_lower_case` / `strip_accents` are then False.
        strip_accents: bool. Strip accents; only effective with `do_lower_case` (official quirk).
            WordPiece only.
    """

    def __init__(self, vocab: Vocab, do_lower_case: bool = True, strip_accents: bool = True):
        self.vocab = vocab
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        if vocab.kind == WORDPIECE:
            self._graph = GraphFullTokenizer(
                vocab.tokens, unk_token=vocab.tokens[vocab.special.unk_id],
                do_lower_case=do_lower_case, strip_accents=strip_accents)
        else:
            from electra_tf.data.spm_tokenization import GraphSentencePieceTokenizer  # imports this

            self._graph = GraphSentencePieceTokenizer(vocab.model)
            # Nothing is lowercased or stripped before the model (it normalises itself): word
            # splitters keyed on these (QA's BasicTokenizer words) must not do it either.
            self.do_lower_case = self.strip_accents = False
        self._tokenize = self._graph.tokenize.get_concrete_function()

    def _to_tensor(self, texts: Sequence) -> tf.Tensor:
        try:
            return tf.constant(texts, dtype=tf.string)
        except (UnicodeEncodeError, ValueError):
            # Lone surrogates: encode them as (invalid) UTF-8 bytes; the graph drops those bytes,
            # as BERT drops category Cs.
            return tf.constant(
                [t.encode("utf-8", "surrogatepass") if isinstance(t, str) else t for t in texts],
                dtype=tf.string)

    def encode_batch(self, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """Tokenises a batch in one graph call.

        Args:
            texts: sequence of str (or UTF-8 bytes), length n.

        Returns:
            (ids, row_splits): ids int32 [total_tokens], the ids of all texts concatenated;
            row_splits int64 [n + 1], text i is ids[row_splits[i]:row_splits[i + 1]].
        """
        if len(texts) == 0:
            return np.zeros([0], np.int32), np.zeros([1], np.int64)
        ragged = self._tokenize(self._to_tensor(list(texts)))
        return ragged.flat_values.numpy(), ragged.row_splits.numpy()

    def encode(self, text: str) -> List[int]:
        """WordPiece ids of one text (no [CLS]/[SEP])."""
        ids, _ = self.encode_batch([text])
        return ids.tolist()

    def wordpieces(self, text: str) -> List[str]:
        """Token strings (WordPieces or SentencePiece pieces) of one text."""
        return [self.vocab.tokens[i] for i in self.encode(text)]

    def graph_tokenizer(self) -> tf.Module:
        """The `tf.Module` whose `tokenize(tf.string [batch]) -> tf.RaggedTensor int32
        [batch, (tokens)]` this tokenizer runs; usable inside tf.function and SavedModels."""
        return self._graph
