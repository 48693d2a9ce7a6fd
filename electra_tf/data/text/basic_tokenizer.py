"""BERT's BasicTokenizer as TensorFlow ops: cleaning, lowercasing, accent stripping, words.

Steps 1-5 of BERT's tokenizer (`tokenization`'s module docstring) over whole strings of a batch:
`GraphBasicTokenizer.normalize` gives the cleaned (and lowercased, accent-stripped) text whose
spaces and `unicode_tables` split characters separate BERT's words, which is what
FastWordpieceTokenizer reads (`tokenization.GraphFullTokenizer`); `tokenize` gives the words
themselves (the fine-tuning tasks' word splits). Where the libraries differ from BERT here, and
how each difference is closed:

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
  lowercases the rest (`unicode_tables.lowercase_fixes`; only rows containing one pay for it).
  Residual: the final-sigma rule sees those letters as uncased ("ⰯΣ" gives "ⱟσ" where Python
  gives "ⱟς").
- BERT decodes bytes with errors="ignore"; `tf.strings.unicode_transcode(errors="ignore")` drops
  the same bytes (checked against Python's decoder). Transcoding is slow, so only rows that are
  not well-formed UTF-8 take it. Lone surrogates in a Python `str` are encoded with
  "surrogatepass" (`tokenization.Tokenizer`) and dropped there, as BERT drops category Cs.

`drop_invalid_utf8` is the SentencePiece tokenizer's too (`spm_tokenization`).
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.data.text.unicode_tables import lowercase_fixes, re2_char, unicode_tables

# RE2 compiles these ranges to an automaton accepting exactly the well-formed UTF-8 strings
# (no overlong forms, surrogates or code points above U+10FFFF), as Python's decoder does.
_VALID_UTF8 = "(?s)[\\x{0}-\\x{d7ff}\\x{e000}-\\x{10ffff}]*"


def patch_rows(strings: tf.Tensor, needs_patch: tf.Tensor,
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
    return patch_rows(
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
        self._fixes = lowercase_fixes() if self.do_lower_case else ()
        self._fix_pattern = (
            "(?s).*[" + "".join(re2_char(ord(ch)) for ch, _ in self._fixes) + "].*"
            if self._fixes else None)

    def _lowercase(self, strings: tf.Tensor) -> tf.Tensor:
        if self._fixes:
            def remap(rows):
                for ch, target in self._fixes:
                    rewrite = target.replace("\\", "\\\\")  # backslash is special in a rewrite
                    rows = tf.strings.regex_replace(rows, re2_char(ord(ch)), rewrite)
                return rows

            has_fix = tf.strings.regex_full_match(strings, self._fix_pattern)
            strings = patch_rows(strings, has_fix, remap)
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
