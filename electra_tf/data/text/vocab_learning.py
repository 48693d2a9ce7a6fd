"""Learning a WordPiece vocab from a corpus (`build_pretraining_dataset.py --learn-vocab SIZE`).

The corpus is streamed line by line through the same BERT BasicTokenizer graph the dataset
builder tokenises with (`GraphBasicTokenizer`: cleaning, lowercasing, accent stripping, CJK and
punctuation splitting), so the vocab is learned on exactly the words WordPiece will later see.
Word counts go to tensorflow-text's WordPiece learner (`wordpiece_tokenizer_learner_lib.learn`,
the algorithm behind `bert_vocab_from_dataset` and keras-hub's `compute_word_piece_vocabulary`).

Output layout (ids are line numbers):
- `vocab_size >= BERT_LAYOUT_MIN_VOCAB_SIZE`: BERT's layout. [PAD]=0, [unused0]..[unused98] at
  1-99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103, then the learned tokens.
- smaller: compact. [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then the learned tokens.
Learned tokens are the alphabet (every character the learner keeps, and its "##" continuation
unless it is punctuation or CJK, which never continue a word), then subwords by decreasing count.
When the learner returns fewer tokens than fit, the file is padded to exactly `vocab_size` lines
with further [unusedN] tokens; when it returns more, the least frequent subwords are dropped.

Memory is bounded by the number of distinct words kept (`MAX_DISTINCT_WORDS`), not by corpus
size: lines are read in bounded chunks, and when the count table overflows, its rarest half is
dropped (exact for any corpus with fewer distinct words; approximate beyond).
"""

from __future__ import annotations

import collections
import logging
from typing import Dict, Iterator, List, Sequence, Tuple

import tensorflow as tf
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

from electra_tf import atomic
from electra_tf.data.text.basic_tokenizer import GraphBasicTokenizer
from electra_tf.data.text.tokenization import SUFFIX_INDICATOR
from electra_tf.data.text.unicode_tables import is_bert_punctuation, is_cjk
from electra_tf.vocab import (CLS_TOKEN, MASK_TOKEN, PAD_TOKEN, SEP_TOKEN, UNK_TOKEN, Vocab,
                              load_vocab)

logger = logging.getLogger(__name__)

# From this size on, the official BERT layout ([UNK]=100 ... [MASK]=103) costs under 10%.
BERT_LAYOUT_MIN_VOCAB_SIZE = 1000
# Official uncased vocab: [PAD]=0, [unused0]..[unused98] at ids 1-99, [UNK]=100, [CLS]=101,
# [SEP]=102, [MASK]=103.
BERT_NUM_LEADING_UNUSED = 99
COMPACT_SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
# tensorflow-text learner defaults (wordpiece_tokenizer_learner_lib.learn).
MAX_TOKEN_LENGTH = 50
MAX_UNIQUE_CHARS = 1000
# A subword must occur at least this often to be learned (the learner's default lower_thresh):
# rarer ones would hardly be trained. A corpus too small to fill the vocab is padded instead.
MIN_SUBWORD_COUNT = 10
# Count-table bound: about 300 MB of Python strings and counts at the cap.
MAX_DISTINCT_WORDS = 1 << 21
# Streaming: at most this many characters per read (a line longer than this is cut; a word cut in
# two is miscounted once, which does not matter for a vocab) and per tokenizer call.
READ_CHUNK_CHARS = 1 << 20
BATCH_CHARS = 1 << 22
BATCH_LINES = 8192


def special_layout(vocab_size: int) -> List[str]:
    """The reserved tokens at the start of a learned vocab of `vocab_size` entries."""
    if vocab_size >= BERT_LAYOUT_MIN_VOCAB_SIZE:
        return ([PAD_TOKEN] + [f"[unused{i}]" for i in range(BERT_NUM_LEADING_UNUSED)]
                + [UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN])
    return list(COMPACT_SPECIAL_TOKENS)


def _line_batches(files: Sequence[str]) -> Iterator[List[str]]:
    batch, chars = [], 0
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            while True:
                line = f.readline(READ_CHUNK_CHARS)
                if not line:
                    break
                batch.append(line)
                chars += len(line)
                if chars >= BATCH_CHARS or len(batch) >= BATCH_LINES:
                    yield batch
                    batch, chars = [], 0
    if batch:
        yield batch


def count_words(files: Sequence[str], do_lower_case: bool = True,
                strip_accents: bool = True) -> Dict[str, int]:
    """Counts BERT BasicTokenizer words over the files, streaming.

    Args:
        files: UTF-8 text files (undecodable bytes are replaced, then deleted by cleaning).
        do_lower_case, strip_accents: as for `Tokenizer`.

    Returns:
        dict word -> count.
    """
    basic = GraphBasicTokenizer(do_lower_case, strip_accents)
    counts = collections.Counter()
    for batch in _line_batches(files):
        words = basic.tokenize(tf.constant(batch, dtype=tf.string)).flat_values
        unique, _, batch_counts = tf.unique_with_counts(words)
        counts.update(dict(zip(unique.numpy().tolist(), batch_counts.numpy().tolist())))
        if len(counts) > MAX_DISTINCT_WORDS:
            kept = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_DISTINCT_WORDS // 2]
            logger.warning("more than %d distinct words: dropping the %d rarest",
                           MAX_DISTINCT_WORDS, len(counts) - len(kept))
            counts = collections.Counter(dict(kept))
    return {word.decode("utf-8"): count for word, count in counts.items()}


def _can_continue_a_word(char: str) -> bool:
    return not (is_bert_punctuation(ord(char)) or is_cjk(ord(char)))


def learn_vocab(files: Sequence[str], vocab_size: int, output_path: str,
                do_lower_case: bool = True, strip_accents: bool = True) -> Vocab:
    """Learns a WordPiece vocab of exactly `vocab_size` tokens and writes it to `output_path`.

    Args:
        files: corpus text files (one sentence per line; blank lines are ignored here).
        vocab_size: int. Number of lines of the written vocab, special tokens included.
        output_path: str. Written atomically (temporary file + rename), replacing any existing
            file: the caller decides whether replacing is allowed.
        do_lower_case, strip_accents: the normalisation the vocab will be used with.

    Returns:
        The written vocab, as `load_vocab(output_path)`.

    Raises:
        ValueError: `vocab_size` cannot hold the special tokens and the corpus alphabet, or the
            files hold no words.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab size must be a positive integer, got {vocab_size!r}")
    if not files:
        raise ValueError("no corpus files to learn a vocab from")
    counts = count_words(files, do_lower_case, strip_accents)
    if not counts:
        raise ValueError(f"no words to learn a vocab from in {len(files)} corpus file(s)")
    # Deterministic input order: the learner breaks some ties by input order.
    word_counts = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    specials = special_layout(vocab_size)
    essential = _essential_tokens(word_counts, vocab_size, specials)
    subwords = _learn_subwords(word_counts, vocab_size - len(specials), essential)
    tokens = specials + essential + subwords
    padding = vocab_size - len(tokens)
    tokens += _padding_tokens(vocab_size, padding)
    assert len(tokens) == vocab_size and len(set(tokens)) == vocab_size

    atomic.write_text(output_path, "".join(token + "\n" for token in tokens))
    logger.info("wrote a %d-token vocab to %s: %d special, %d alphabet, %d subwords, %d padding",
                vocab_size, output_path, len(specials), len(essential), len(subwords), padding)
    if padding > 0.05 * vocab_size:
        logger.warning("the corpus has only %d subwords seen at least %d times: %d of the %d vocab "
                       "entries are [unusedN] padding", len(subwords), MIN_SUBWORD_COUNT, padding,
                       vocab_size)
    return load_vocab(output_path)


def _essential_tokens(word_counts: List[Tuple[str, int]], vocab_size: int,
                      specials: List[str]) -> List[str]:
    """The corpus alphabet and its "##" continuations, which every learned vocab holds.

    Args:
        word_counts: (word, count) pairs, most frequent first.
        vocab_size: int. Size of the vocab being learned.
        specials: the reserved tokens that come before these (`special_layout`).

    Returns:
        The alphabet (sorted), then "##" + each character that can continue a word.

    Raises:
        ValueError: no word is short enough to learn from, or `vocab_size` cannot hold the
            specials and these tokens.
    """
    alphabet = sorted(learner.get_allowed_chars(
        learner.get_input_words(word_counts, [], MAX_TOKEN_LENGTH), MAX_UNIQUE_CHARS))
    if not alphabet:
        raise ValueError(f"no words of at most {MAX_TOKEN_LENGTH} characters in the corpus")
    essential = alphabet + [SUFFIX_INDICATOR + c for c in alphabet if _can_continue_a_word(c)]
    if vocab_size < len(specials) + len(essential):
        raise ValueError(
            f"vocab size {vocab_size} is too small: it must hold {len(specials)} special tokens "
            f"and the corpus alphabet of {len(alphabet)} characters with their "
            f"{len(essential) - len(alphabet)} '##' continuations, at least "
            f"{len(specials) + len(essential)} entries")
    return essential


def _learn_subwords(word_counts: List[Tuple[str, int]], budget: int,
                    essential: List[str]) -> List[str]:
    """Runs the WordPiece learner and keeps the subwords that fit beside `essential`.

    Args:
        word_counts: (word, count) pairs, most frequent first.
        budget: int. Tokens available after the special tokens.
        essential: the alphabet and its continuations (`_essential_tokens`), kept anyway.

    Returns:
        At most `budget - len(essential)` learned tokens not in `essential`, in the learner's
        (count) order.
    """
    logger.info("learning %d WordPiece tokens from %d distinct words", budget, len(word_counts))
    learned = learner.learn(word_counts, vocab_size=budget, reserved_tokens=[],
                            lower_thresh=MIN_SUBWORD_COUNT, max_token_length=MAX_TOKEN_LENGTH,
                            max_unique_chars=MAX_UNIQUE_CHARS, include_joiner_token=True,
                            joiner=SUFFIX_INDICATOR)
    # Drop continuations that can never match (punctuation / CJK never continue a word).
    subwords = []
    seen = set(essential)
    for token in learned:
        if token in seen:
            continue
        body = token[len(SUFFIX_INDICATOR):] if token.startswith(SUFFIX_INDICATOR) else token
        if token.startswith(SUFFIX_INDICATOR) and not all(_can_continue_a_word(c) for c in body):
            continue
        seen.add(token)
        subwords.append(token)
    return subwords[:budget - len(essential)]


def _padding_tokens(vocab_size: int, padding: int) -> List[str]:
    """`padding` further [unusedN] tokens, numbered on from those of the special layout."""
    first = BERT_NUM_LEADING_UNUSED if vocab_size >= BERT_LAYOUT_MIN_VOCAB_SIZE else 0
    return [f"[unused{i}]" for i in range(first, first + padding)]
