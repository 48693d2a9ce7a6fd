"""BERT's character classes as RE2 patterns, generated from Python's `unicodedata`.

BERT's BasicTokenizer decides with Python's `unicodedata` which characters it deletes, which
separate words, which accents it strips and which characters form a word of their own; the
TensorFlow ops that reproduce it (`basic_tokenizer`) match these classes as RE2 patterns built
here, once per process, from the same data:

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

`code_point_masks` (numpy, no TensorFlow) is also what the TensorFlow-free tokenizer's Python
patterns are built from (`portable_tokenization`). `lowercase_fixes` lists the characters that
`tf.strings.lower` (TensorFlow's older ICU) lowercases differently from Python's `str.lower`,
probed on every code point that survives cleaning (it imports TensorFlow; nothing else here
does).
"""

from __future__ import annotations

import functools
import logging
import unicodedata
from typing import NamedTuple, Tuple

import numpy as np

logger = logging.getLogger(__name__)

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
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


def re2_char(cp: int) -> str:
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
    parts = [re2_char(lo) if lo == hi else f"{re2_char(lo)}-{re2_char(hi)}"
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


class CodePointMasks(NamedTuple):
    """Boolean [0x110000] arrays over all code points; see `UnicodeTables`."""

    deleted: np.ndarray
    whitespace: np.ndarray
    nonspacing_marks: np.ndarray
    split: np.ndarray


@functools.lru_cache(maxsize=None)
def code_point_masks() -> CodePointMasks:
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
    return CodePointMasks(deleted=deleted, whitespace=whitespace,
                           nonspacing_marks=of(lambda name: name == "Mn"), split=split)


@functools.lru_cache(maxsize=None)
def unicode_tables() -> UnicodeTables:
    """The character classes of BERT's BasicTokenizer as RE2 patterns (built once per process)."""
    masks = code_point_masks()
    return UnicodeTables(
        deleted=_re2_class(masks.deleted),
        whitespace=_re2_class(masks.whitespace),
        nonspacing_marks=_re2_class(masks.nonspacing_marks),
        split=_re2_class(masks.split),
        unicode_version=unicodedata.unidata_version,
    )


@functools.lru_cache(maxsize=None)
def lowercase_fixes() -> Tuple[Tuple[str, str], ...]:
    """(character, Python lowercase) for every character `tf.strings.lower` maps differently.

    Probes all code points that survive cleaning. A fix is kept only if ICU leaves the Python
    lowercase unchanged (so remapping before `tf.strings.lower` yields Python's result).
    """
    import tensorflow as tf  # only the TensorFlow tokenizer needs these fixes

    masks = code_point_masks()
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
