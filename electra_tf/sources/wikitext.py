"""Wikipedia articles to clean prose: MediaWiki markup to paragraphs, a dump to documents.

Pure functions, no I/O (the fetch step reads the dump out of its package). `clean_wikitext`
turns MediaWiki markup into plain paragraphs (templates, refs, tables, headings, file/category
links and HTML removed; link text kept; a few inline templates such as `{{convert}}` and
`{{lang}}` rendered to their visible text). It is an approximation of what MediaWiki renders,
written for encyclopedia prose, not a full parser. Sentences are split by
`text_cleaning.split_sentences`.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from typing import Iterator, List

from electra_tf.sources.text_cleaning import Document, split_sentences, tidy_text


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
    return _wiki_paragraphs(_strip_wiki_markup(wikitext))


def _strip_wiki_markup(wikitext: str) -> str:
    """`clean_wikitext`'s first pass: the markup removed or rendered, lines kept."""
    text = _COMMENT.sub("", wikitext)
    text = _DROPPED_ELEMENTS.sub("", text)
    text = _expand_innermost(_INNER_TEMPLATE, lambda m: _render_template(m.group(1)), text)
    text = _expand_innermost(_INNER_TABLE, lambda m: "\n", text)
    text = _expand_innermost(_INNER_LINK, lambda m: _render_link(m.group(1)), text)
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1), text)
    text = _LINE_BREAK_TAG.sub(" ", text)
    text = _HTML_TAG.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
    return _MAGIC_WORD.sub("", text)


def _wiki_paragraphs(text: str) -> List[str]:
    """`clean_wikitext`'s second pass over the stripped lines: paragraphs and list items,
    skipping headings, skipped sections, table debris and preformatted lines."""
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
