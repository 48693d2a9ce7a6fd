"""Turning the default corpus's raw sources into clean prose, one sentence per line.

Pure functions, no I/O: the fetch step (`electra_tf.sources.fetch`) reads the package members and
hands their text here. Each `*_documents` function yields documents, each document a list of
sentences, which the fetch step writes in the dataset builder's input format (one sentence per
line, a blank line after each document).

- Wikipedia's MediaWiki markup is cleaned in `wikitext` (built on `split_sentences` and
  `tidy_text` here).
- `split_sentences`: a rule-based sentence splitter (abbreviations, initials, decimals, quotes).
  Also approximate: e.g. an abbreviation that really ends a sentence ("... in the U.S. Then")
  does not split. ELECTRA's builder only uses sentence ends as candidate segment boundaries, so
  such misses cost little.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, List

Document = List[str]

# --------------------------------------------------------------------------------------------
# Sentence splitting
# --------------------------------------------------------------------------------------------

# Words that end in a period without ending a sentence (lowercased, without the period).
# "etc" is left out: it ends sentences as often as not.
ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof st jr sr rev hon gen col lt sgt capt cmdr adm gov pres sen rep messrs mme
    mlle esq fr vs v cf e.g i.e viz al approx ca c vol vols pp p ch chap fig figs ed eds eq
    est dept univ assn bros inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec mt
    ft u.s u.k u.n a.d b.c op ph.d
""".split())
# Abbreviations only when a number follows ("No. 2"); otherwise ordinary words ("I said no.").
NUMBER_ABBREVIATIONS = frozenset({"no", "nos"})

# A candidate boundary: terminal punctuation, optional closing quotes/brackets, whitespace, and
# a next sentence that starts with an (optionally quoted/bracketed) capital letter or digit.
_BOUNDARY = re.compile(r"""([.!?]+)(["'\u201d\u2019)\]]*)\s+"""
                       r"""(?=["'\u201c\u2018(\[]*[A-Z0-9\u00c0-\u00de])""")
# The word (run of non-space characters) that ends right before a candidate period.
_LAST_WORD = re.compile(r"(\S+)$")
_SINGLE_INITIAL = re.compile(r"^[(\"'\u201c\u2018]*[A-Z]$")
_DOTTED_ACRONYM = re.compile(r"^[(\"'\u201c\u2018]*(?:[A-Za-z]\.)+[A-Za-z]$")
_SPACES = re.compile(r"\s+")
# A list number opening a paragraph ("1. <sense>", "2) ..."): not a sentence of its own.
_ENUMERATOR = re.compile(r"^\(?\d{1,2}[.)]$")


def _is_abbreviation(word: str) -> bool:
    """Whether `word` (the text before a single '.') marks an abbreviation, not a sentence end."""
    if _SINGLE_INITIAL.match(word) or _DOTTED_ACRONYM.match(word):
        return True  # "J. R. R. Tolkien", "U.S. Army"
    return word.lstrip("(\"'\u201c\u2018").lower() in ABBREVIATIONS


def split_sentences(text: str) -> List[str]:
    """Splits a paragraph into sentences with simple rules (approximate).

    A sentence ends at '.', '!' or '?' (plus any closing quotes or brackets) followed by
    whitespace and a capital letter, digit, or an opening quote/bracket before one. A single '.'
    does not end a sentence after a known abbreviation ("Dr.", "e.g."), a single capital
    initial ("J."), a dotted acronym ("U.S.") or a list number opening the paragraph ("1.").
    Decimals ("3.14") never split since no space
    follows the point.

    Args:
        text: str. One paragraph; internal whitespace (including newlines) is collapsed.

    Returns:
        The sentences, stripped, in order; [] for blank input.
    """
    text = _SPACES.sub(" ", text).strip()
    if not text:
        return []
    sentences = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        if match.group(1) == ".":
            word = _LAST_WORD.search(text, start, match.start())
            if word and _is_abbreviation(word.group(1)):
                continue
            if (word and word.group(1).lower() in NUMBER_ABBREVIATIONS
                    and text[match.end()].isdigit()):
                continue
            if not sentences and _ENUMERATOR.match(text[start:match.end(2)]):
                continue
        sentences.append(text[start:match.end(2)].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


def tidy_text(text: str) -> str:
    """Collapses whitespace and repairs the gaps that removed markup leaves behind.

    E.g. "Albedo ( ) or x , y" -> "Albedo or x, y".
    """
    text = _SPACES.sub(" ", text)
    # Parentheses emptied by removed templates/refs, possibly holding leftover separators.
    text = re.sub(r"\(\s*[,;:]*\s*\)", "", text)
    text = re.sub(r"\(\s*[,;:]\s*", "(", text)
    text = re.sub(r"\s*[,;:]\s*\)", ")", text)
    text = re.sub(r"\(\s+", "(", text)
    text = re.sub(r"\s+([,.;:!?)\]])", r"\1", text)
    text = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text)
    return _SPACES.sub(" ", text).strip()


# --------------------------------------------------------------------------------------------
# Lee news corpus (gensim's lee_background.cor: one story per line)
# --------------------------------------------------------------------------------------------


def lee_documents(text: str) -> Iterator[Document]:
    """Yields one document per non-blank line (one news story per line)."""
    for line in text.splitlines():
        sentences = split_sentences(tidy_text(line))
        if sentences:
            yield sentences


# --------------------------------------------------------------------------------------------
# Jane Austen (janeaustenr: one character vector of text lines per novel)
# --------------------------------------------------------------------------------------------

_CHAPTER_HEADING = re.compile(r"^\s*chapter\s+([ivxlc]+|\d+)\.?\s*$", re.IGNORECASE)
# Non-prose lines inside a novel: volume headings and end marks.
_NOVEL_NON_PROSE = re.compile(r"^\s*(?:volume\s+([ivxlc]+|\d+)|finis|the end)\.?\s*$",
                              re.IGNORECASE)
# Editorial back matter after the last chapter (an edition's "A NOTE ON THE TEXT"): not Austen.
_NOVEL_BACK_MATTER = re.compile(r"^\s*a note on the text\s*$", re.IGNORECASE)
# Project Gutenberg marks italics as _word_.
_UNDERSCORE_EMPHASIS = re.compile(r"_([^_\n]+)_")


def novel_chapter_documents(lines: Iterable[str]) -> Iterator[Document]:
    """Yields one document per chapter of a novel given as wrapped text lines.

    Text before the first "CHAPTER ..." line (title, author, first volume heading) is dropped;
    paragraphs are runs of non-blank lines; "VOLUME ..." headings and "FINIS"/"THE END" are
    dropped, and so is an edition's closing "A NOTE ON THE TEXT"; `_italic_` underscores are
    removed.

    Args:
        lines: the novel's lines; None (R's NA) counts as blank.

    Yields:
        Lists of sentences, one per chapter.
    """
    chapter: List[str] = []
    paragraph: List[str] = []
    in_chapter = False

    def end_paragraph():
        if paragraph:
            text = _UNDERSCORE_EMPHASIS.sub(r"\1", " ".join(paragraph))
            chapter.extend(split_sentences(tidy_text(text)))
            paragraph.clear()

    for line in lines:
        line = line or ""
        if _NOVEL_BACK_MATTER.match(line):
            break
        if _CHAPTER_HEADING.match(line):
            end_paragraph()
            if chapter:
                yield list(chapter)
            chapter.clear()
            in_chapter = True
            continue
        if not in_chapter:
            continue
        if not line.strip() or _NOVEL_NON_PROSE.match(line):
            end_paragraph()
            continue
        paragraph.append(line.strip())
    end_paragraph()
    if chapter:
        yield list(chapter)


# --------------------------------------------------------------------------------------------
# FOLDOC (dictd format: foldoc.index + foldoc.dict)
# --------------------------------------------------------------------------------------------

_DICTD_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# dictd's own metadata entries (database name, URL, info), not dictionary content.
_DICTD_META_PREFIX = "00-database-"
# Body lines of an entry are indented by this many spaces; deeper lines are code or tables.
FOLDOC_BODY_INDENT = 3
_FOLDOC_DATE = re.compile(r"^\(\d{4}-\d{2}-\d{2}\)$")
_FOLDOC_SOURCE = re.compile(r"^\[.*\]$", re.DOTALL)
# Subject tags: "<programming>", "<file format, tool>" (also after a sense number "2.").
_FOLDOC_DOMAIN = re.compile(r"<[a-z][A-Za-z0-9 ,/&'.+-]*>\s*")
# Paragraphs with fewer letters than this share of their non-space characters are tables of
# digits or symbols (e.g. the "pi" entry's 1000 digits), not prose.
MIN_FOLDOC_LETTER_FRACTION = 0.5
_FOLDOC_PRONUNCIATION = re.compile(r"^/[^/\s][^/]*/(?:,? or /[^/]*/)*\s*")
_FOLDOC_CROSS_REF = re.compile(r"\{([^{}]*)\}")
_FOLDOC_EMAIL = re.compile(r"<[^<>\s]+@[^<>\s]+>")
_FOLDOC_EMPHASIS = re.compile(r"__([^_]+)__")


def dictd_decode_number(text: str) -> int:
    """Decodes dictd's base-64 offsets/lengths ("Gb9L" -> int), most significant digit first."""
    value = 0
    for char in text:
        digit = _DICTD_B64.find(char)
        if digit < 0:
            raise ValueError(f"invalid dictd base64 digit {char!r} in {text!r}")
        value = value * 64 + digit
    return value


def dictd_entries(index_text: str, dict_text: str) -> Iterator[str]:
    """Yields each distinct entry's raw text of a dictd database, in file order.

    Args:
        index_text: str. The `.index` file: "headword<TAB>offset<TAB>length" lines.
        dict_text: str. The decompressed `.dict` file, decoded as latin-1 so byte offsets
            equal character offsets (decode each entry as UTF-8 afterwards).
    """
    spans = set()
    for line in index_text.splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or fields[0].startswith(_DICTD_META_PREFIX):
            continue
        spans.add((dictd_decode_number(fields[1]), dictd_decode_number(fields[2])))
    for offset, length in sorted(spans):
        yield dict_text[offset:offset + length]


def _render_cross_ref(match: re.Match) -> str:
    inner = _SPACES.sub(" ", match.group(1)).strip()
    # "{text (url)}" shows text; "{(url)}" has only the URL to show.
    link = re.match(r"^(.*?)\s*\(([^()]*)\)$", inner)
    if link and (":" in link.group(2) or "." in link.group(2)):
        return link.group(1) or link.group(2)
    return inner


def foldoc_entry_sentences(entry: str) -> Document:
    """Cleans one FOLDOC entry (headwords, blank line, indented body) into sentences.

    Drops the headword lines, subject tags ("<programming>"), a leading pronunciation
    ("/broh'k*t/"), deeper-indented lines (code, tables), source notes ("[{Jargon File}]"),
    the trailing date ("(1995-02-07)"), e-mail addresses and paragraphs that are mostly digits
    or symbols; turns "{cross reference}" into its plain text. Entries whose body is only a
    cross reference (aliases) give [].
    """
    lines = entry.split("\n")
    # Headwords: the non-indented lines before the first blank line.
    body_start = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    body = "\n".join(lines[body_start:])
    if _FOLDOC_CROSS_REF.fullmatch(body.strip().rstrip(".")):
        return []  # an alias entry: "broker" -> "{object request broker}"
    # Cross references may span lines, even blank ones: render them before finding paragraphs.
    body = _FOLDOC_CROSS_REF.sub(_render_cross_ref, body)
    paragraphs: List[List[str]] = [[]]
    for line in body.split("\n"):
        if not line.strip():
            paragraphs.append([])
        elif len(line) - len(line.lstrip(" ")) > FOLDOC_BODY_INDENT:
            continue
        else:
            paragraphs[-1].append(line.strip())
    sentences: Document = []
    for text in (" ".join(p) for p in paragraphs if p):
        if _FOLDOC_DATE.match(text) or _FOLDOC_SOURCE.match(text):
            continue
        text = _FOLDOC_DOMAIN.sub("", text)
        if not sentences:
            text = _FOLDOC_PRONUNCIATION.sub("", text)
        text = _FOLDOC_EMAIL.sub("", text)
        text = _FOLDOC_EMPHASIS.sub(r"\1", text)
        visible = text.replace(" ", "")
        if sum(c.isalpha() for c in visible) < MIN_FOLDOC_LETTER_FRACTION * len(visible):
            continue
        sentences.extend(split_sentences(tidy_text(text)))
    return sentences


def foldoc_documents(index_text: str, dict_text: str) -> Iterator[Document]:
    """Yields one document per FOLDOC entry that has prose (aliases and empty ones skipped)."""
    for raw in dictd_entries(index_text, dict_text):
        sentences = foldoc_entry_sentences(raw.encode("latin-1").decode("utf-8", "replace"))
        if sentences:
            yield sentences
