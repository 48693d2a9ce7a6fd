"""BERT's FullTokenizer, computed in-graph with TensorFlow string ops and tensorflow-text.

The official tokenizer (`model/tokenization.py`, identical to BERT's) is, per input string:

1. decode UTF-8 dropping undecodable bytes; delete U+0000, U+FFFD and every character of Unicode
   category C* except \\t \\n \\r; map \\t \\n \\r and category Zs to a space;
2. put spaces around CJK ideographs (`unicode_tables.CJK_RANGES`);
3. split on Python whitespace (`str.split()`);
4. per word: if `do_lower_case`, `str.lower()`, then, only if lowercasing AND `strip_accents`,
   NFD and delete category Mn (quirk: `strip_accents` has no effect without lowercasing);
5. split off every punctuation character (ASCII 33-47, 58-64, 91-96, 123-126, or category P*);
6. WordPiece: greedy longest-match-first with "##" continuations; a word longer than 200 code
   points, or with any part that cannot be matched, becomes a single [UNK].

Here steps 1 and 4 are TensorFlow ops (`basic_tokenizer.GraphBasicTokenizer`:
`tf.strings.regex_replace`, `tf.strings.lower`, `tensorflow_text.normalize_utf8`) over whole
strings, and steps 2, 3, 5 and 6 are `tensorflow_text.FastWordpieceTokenizer` in its end-to-end
mode (it splits on whitespace, punctuation and CJK ideographs itself, then runs WordPiece).
Lowercasing whole strings equals BERT's per-word lowercasing because a space is neither cased
nor case-ignorable (the final-sigma context stops there), and splitting CJK after lowercasing
equals splitting before because lowercasing and NFD never create or remove a CJK ideograph. The
whole pipeline is one `tf.function`, used both by the dataset builder (`Tokenizer.encode_batch`,
one graph call per batch) and by the exported SavedModel (`Tokenizer.graph_tokenizer()`), so
training data and serving tokenise identically. Where TensorFlow is not installed the builder
runs `portable_tokenization.PortableTokenizer` instead (the same ids; `tokenizer_choice`).

Where the libraries differ from BERT, each difference is closed where it arises: lowercasing and
the decoding of bytes that are not UTF-8 in `basic_tokenizer`; the character classes (deleted,
whitespace, Mn, punctuation + CJK), generated from Python's `unicodedata`, in `unicode_tables`,
with why FastWordpieceTokenizer's word splitting equals BERT's; and WordPiece's here:

- FastWordpieceTokenizer limits a word by UTF-8 bytes (`max_bytes_per_word`), BERT by 200 code
  points. We set the byte limit to 4 * 200 (a word over it has over 200 code points) and, before
  WordPiece, replace each word of more than 200 code points with one private-use placeholder
  character that no vocab token starts with, so it becomes exactly one [UNK]. Only rows with a
  run of 201+ non-space characters take this (slower) path.
- FastWordpieceTokenizer leaves out vocab tokens that contain punctuation (other than a single
  punctuation character) and rejects tokens over 256 UTF-8 bytes. BERT can never match the former
  (a word never contains punctuation) nor a token longer than 200 code points, so those are
  replaced by inert stand-ins; a matchable token over 256 bytes raises ValueError.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.data.text.basic_tokenizer import GraphBasicTokenizer, patch_rows
from electra_tf.data.text.spm_tokenization import GraphSentencePieceTokenizer
from electra_tf.vocab import UNK_TOKEN, WORDPIECE, Vocab

# Official WordpieceTokenizer(max_input_chars_per_word=200): longer words become [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
# Official WordPiece continuation prefix.
SUFFIX_INDICATOR = "##"
# A code point takes at most 4 bytes in UTF-8: a word over 4 * 200 bytes has over 200 code points.
MAX_UTF8_BYTES_PER_CHAR = 4
# tensorflow-text's FastWordpieceTokenizer rejects vocab tokens longer than this (excluding "##").
FAST_WORDPIECE_MAX_TOKEN_BYTES = 256
# BMP private-use area: deleted by cleaning (category Co), so a character from it can never
# reach WordPiece from the input and is free to stand in for an over-long word.
_PLACEHOLDER_RANGE = (0xE000, 0xF8FF)


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
        return patch_rows(strings, has_long_run, replace)

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
