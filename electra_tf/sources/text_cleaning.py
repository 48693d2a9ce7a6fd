"""Turning the default corpus's raw sources into clean prose, one sentence per line.

Pure functions, no I/O: the fetch step (`electra_tf.sources.fetch`) reads the package members and
hands their text here. Each `*_documents` function yields documents, each document a list of
sentences, which the fetch step writes in the dataset builder's input format (one sentence per
line, a blank line after each document).

- `clean_wikitext`: MediaWiki markup to plain paragraphs (templates, refs, tables, headings,
  file/category links and HTML removed; link text kept; a few inline templates such as
  `{{convert}}` and `{{lang}}` rendered to their visible text). It is an approximation of what
  MediaWiki renders, written for encyclopedia prose, not a full parser.
- `split_sentences`: a rule-based sentence splitter (abbreviations, initials, decimals, quotes).
  Also approximate: e.g. an abbreviation that really ends a sentence ("... in the U.S. Then")
  does not split. ELECTRA's builder only uses sentence ends as candidate segment boundaries, so
  such misses cost little.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
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
# Wikitext
# --------------------------------------------------------------------------------------------

# Section headings whose content is lists of links and citations, not prose.
SKIPPED_WIKI_SECTIONS = frozenset({
    "see also", "references", "external links", "further reading", "notes", "bibliography",
    "sources", "footnotes", "citations", "notes and references", "references and notes",
    "works cited", "literature", "gallery", "external link",
})
# Link namespaces that render as media or metadata, not as text.
_DROPPED_LINK_NAMESPACES = frozenset({"file", "image", "media", "category"})
# Paragraphs shorter than this many words are list fragments ("Fresh snow 0.8"), not prose.
MIN_WIKI_PARAGRAPH_WORDS = 3

# Tags whose whole content is dropped (citations, formulas, galleries, code, embedded data).
_DROPPED_TAG_NAMES = ("ref", "math", "gallery", "timeline", "imagemap", "score", "chem", "ce",
                      "syntaxhighlight", "source", "pre", "hiero", "references", "graph",
                      "mapframe", "templatedata", "table")
_DROPPED_ELEMENTS = re.compile(
    r"<(%s)\b[^>]*?(?:/>|>.*?</\1\s*>)" % "|".join(_DROPPED_TAG_NAMES), re.DOTALL | re.IGNORECASE)
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
# Innermost constructs (no nested opener inside), expanded repeatedly from the inside out.
_INNER_TEMPLATE = re.compile(r"\{\{((?:[^{}]|\{(?!\{)|\}(?!\}))*)\}\}")
_INNER_TABLE = re.compile(r"\{\|(?:(?!\{\||\|\}).)*\|\}", re.DOTALL)
# Inside a link, a balanced "[x]" is taken whole, so "[[File:a.png|b [c]]]" closes at the end.
_INNER_LINK = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)[^\[\]]*\]|\[(?!\[)|\](?!\]))*)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:|//)[^\s\]]*\s*([^\]]*)\]")
_BARE_URL = re.compile(r"\b(?:https?|ftp)://\S+")
_LINE_BREAK_TAG = re.compile(r"<br\s*/?>", re.IGNORECASE)
_HTML_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_BOLD_ITALIC = re.compile(r"'{2,}")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*:")
# Convert's range words between numbers ({{convert|1|to|3|km}}).
_CONVERT_JOINERS = frozenset({"-", "\u2013", "to", "and", "or", "x", "by", "+/-", "&"})
_NUMBER = re.compile(r"^[-+\u2212]?[\d.,]+(?:e\d+)?$")


def _split_template_args(body: str) -> List[str]:
    """Splits a template body on '|' outside [[links]] (templates inside are already expanded)."""
    parts, depth, current = [], 0, []
    i = 0
    while i < len(body):
        pair = body[i:i + 2]
        if pair == "[[":
            depth += 1
            current.append(pair)
            i += 2
        elif pair == "]]" and depth:
            depth -= 1
            current.append(pair)
            i += 2
        elif body[i] == "|" and depth == 0:
            parts.append("".join(current))
            current = []
            i += 1
        else:
            current.append(body[i])
            i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts]


def _render_template(body: str) -> str:
    """The visible text of a template, for the few inline ones that carry prose; else ''."""
    args = _split_template_args(body)
    name = args[0].strip().lower().replace("_", " ")
    positional = [a for a in args[1:] if "=" not in a.split("[[")[0]]
    if name in ("nowrap", "nobr", "small", "smaller", "big", "smallcaps", "sc", "flag",
                "nihongo", "nihongo2", "abbr", "lang-en", "em", "strong", "math", "mvar"):
        return positional[0] if positional else ""
    if name.startswith("lang-"):
        return positional[0] if positional else ""
    if name in ("lang", "transl", "transliteration"):
        return positional[-1] if len(positional) >= 2 else ""
    if name in ("convert", "cvt"):
        words = []
        for arg in positional:
            if _NUMBER.match(arg) or arg.lower() in _CONVERT_JOINERS:
                words.append(arg)
            else:
                words.append(arg)  # the unit
                break
        return " ".join(words)
    if name == "as of":
        return "As of " + positional[0] if positional else ""
    return ""


def _render_link(body: str) -> str:
    """The visible text of an internal link `[[target|text]]` ('' for files/categories)."""
    target, pipe, text = body.partition("|")
    target = target.strip()
    namespace = target.lstrip(":").split(":", 1)[0].strip().lower() if ":" in target else ""
    if namespace in _DROPPED_LINK_NAMESPACES and not target.startswith(":"):
        return ""
    if not text and _INTERLANGUAGE.match(target):
        return ""
    if text.strip():
        return text.strip()
    if pipe:  # the pipe trick: [[Paris (band)|]] shows "Paris"
        return re.sub(r"\s*\(.*?\)\s*$", "", target.split(":", 1)[-1]).strip()
    return target.lstrip(":").lstrip("#").strip()


def _expand_innermost(pattern: re.Pattern, render, text: str) -> str:
    """Replaces innermost matches of `pattern` until none is left (handles nesting)."""
    while True:
        new_text = pattern.sub(render, text)
        if new_text == text:
            return new_text
        text = new_text


def clean_wikitext(wikitext: str) -> List[str]:
    """Converts one article's MediaWiki markup to plain prose paragraphs.

    Removes comments, <ref>s and other non-prose elements (math, galleries, code), templates
    (rendering a few inline ones: nowrap, lang, convert, ...), tables, headings, file, image
    and category links, interlanguage links, HTML tags, bold/italic quotes, magic words,
    preformatted lines, and whole "See also" / "References" / "External links"-style sections.
    Keeps link text ("[[Latin]]" -> "Latin", "[[a|b]]" -> "b") and list items (each its own
    paragraph). Decodes HTML entities.

    Args:
        wikitext: str. The article source (already XML-unescaped).

    Returns:
        Paragraphs of clean text, each a single line; paragraphs with fewer than
        `MIN_WIKI_PARAGRAPH_WORDS` words are dropped.
    """
    text = _COMMENT.sub("", wikitext)
    text = _DROPPED_ELEMENTS.sub("", text)
    text = _expand_innermost(_INNER_TEMPLATE, lambda m: _render_template(m.group(1)), text)
    text = _expand_innermost(_INNER_TABLE, lambda m: "\n", text)
    text = _expand_innermost(_INNER_LINK, lambda m: _render_link(m.group(1)), text)
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1), text)
    text = _LINE_BREAK_TAG.sub(" ", text)
    text = _HTML_TAG.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
    text = _MAGIC_WORD.sub("", text)

    paragraphs: List[str] = []
    current: List[str] = []
    skipping = False

    def flush():
        if current:
            paragraph = tidy_text(_BARE_URL.sub("", html.unescape(" ".join(current))))
            if len(paragraph.split()) >= MIN_WIKI_PARAGRAPH_WORDS:
                paragraphs.append(paragraph)
            current.clear()

    for line in text.split("\n"):
        heading = _HEADING.match(line.strip())
        if heading:
            flush()
            title = tidy_text(html.unescape(heading.group(2))).lower()
            skipping = title in SKIPPED_WIKI_SECTIONS
            continue
        if skipping:
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith(("{|", "|", "!", "----", "{{", "}}")) \
                or line.startswith(" "):
            # Blank line, table or template debris, horizontal rule, or a preformatted line.
            flush()
            continue
        list_item = re.match(r"^[*#:;]+\s*", stripped)
        if list_item:
            flush()
            current.append(stripped[list_item.end():])
            flush()
            continue
        current.append(stripped)
    flush()
    return paragraphs


def wiki_xml_documents(xml_source) -> Iterator[Document]:
    """Yields one document (list of sentences) per Wikipedia article of a MediaWiki XML dump.

    Only main-namespace (ns 0) pages are used; redirects and pages left empty by cleaning are
    skipped.

    Args:
        xml_source: a file path or binary file object holding the (decompressed) XML dump.

    Yields:
        Lists of sentences, one list per article, in dump order.
    """
    for _, element in ET.iterparse(xml_source, events=("end",)):
        if _local_name(element.tag) != "page":
            continue
        namespace = redirect = text = None
        for child in element.iter():
            name = _local_name(child.tag)
            if name == "ns":
                namespace = (child.text or "").strip()
            elif name == "redirect":
                redirect = True
            elif name == "text":
                text = child.text or ""
        element.clear()  # bounded memory on big dumps
        if namespace != "0" or redirect or not text:
            continue
        sentences = [s for p in clean_wikitext(text) for s in split_sentences(p)]
        if sentences:
            yield sentences


def _local_name(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


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
