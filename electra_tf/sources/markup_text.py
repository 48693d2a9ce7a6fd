"""Documentation markup (reStructuredText, HTML, Perl POD) to prose paragraphs.

Pure functions, no I/O: the fetch step (`electra_tf.sources.fetch`) reads the pages of a
documentation package and hands their text here. The goal is English prose for pretraining, not
a faithful rendering, so everything that is not running text is dropped:

- code: literal blocks (RST `::`, `.. code-block::`), `<pre>`, POD verbatim paragraphs;
- tables, navigation, sidebars, headings, directive bodies other than admonitions;
- paragraphs that fail `is_prose` (too short, too many code symbols, too few letters).

Inline markup keeps its visible text (`:ref:\\`text <target>\\`` -> "text", ``C<foo>`` -> "foo").
Each page becomes one document: the sentences of its prose paragraphs (`prose_document`).
"""

from __future__ import annotations

import html.parser
import re
from typing import Iterable, Iterator, List, Mapping

from electra_tf.sources.text_cleaning import Document, split_sentences

# A paragraph shorter than this is a label, caption or fragment, not prose.
MIN_PROSE_WORDS = 6
# At least this share of a paragraph's non-space characters must be letters ...
MIN_LETTER_FRACTION = 0.75
# ... and at most this share may be characters that mark code or paths.
MAX_CODE_SYMBOL_FRACTION = 0.04
_CODE_SYMBOLS = frozenset("{}[]<>=;_/\\|*&^%$#@~`")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
# A sentence needs a lower-case word: lines in capitals or of identifiers only are not prose.
_LOWER_WORD = re.compile(r"\b[a-z]{2,}\b")
_SPACES = re.compile(r"\s+")


def is_prose(paragraph: str) -> bool:
    """Whether a paragraph reads as English running text (heuristic).

    Args:
        paragraph: str. One paragraph, markup already removed.

    Returns:
        True when it has at least `MIN_PROSE_WORDS` words, letters make up at least
        `MIN_LETTER_FRACTION` of its non-space characters, code symbols at most
        `MAX_CODE_SYMBOL_FRACTION`, and it has lower-case words.
    """
    compact = _SPACES.sub("", paragraph)
    if not compact or len(_WORD.findall(paragraph)) < MIN_PROSE_WORDS:
        return False
    letters = sum(c.isalpha() for c in compact)
    symbols = sum(c in _CODE_SYMBOLS for c in compact)
    return (letters >= MIN_LETTER_FRACTION * len(compact)
            and symbols <= MAX_CODE_SYMBOL_FRACTION * len(compact)
            and _LOWER_WORD.search(paragraph) is not None)


def prose_document(paragraphs: Iterable[str]) -> Document:
    """The sentences of the paragraphs that pass `is_prose`, in order.

    Args:
        paragraphs: iterable of str. Paragraphs of one page, markup removed.

    Returns:
        A document: a list of sentences ([] when no paragraph is prose).
    """
    sentences: Document = []
    for paragraph in paragraphs:
        paragraph = _SPACES.sub(" ", paragraph).strip()
        if is_prose(paragraph):
            sentences.extend(split_sentences(paragraph))
    return sentences


# --------------------------------------------------------------------------------------------
# reStructuredText (Sphinx sources)
# --------------------------------------------------------------------------------------------

# Directives whose body is prose (admonitions); every other directive's body is dropped
# (code-block, toctree, image, table, kernel-doc, ...).
PROSE_DIRECTIVES = frozenset({"note", "warning", "important", "tip", "hint", "caution",
                              "attention", "danger", "error", "admonition", "seealso",
                              "versionadded", "versionchanged", "deprecated", "topic",
                              "sidebar", "rubric", "only", "container"})
_DIRECTIVE = re.compile(r"^\.\.\s+([A-Za-z][\w:.+-]*)::(.*)$")
_COMMENT_OR_TARGET = re.compile(r"^\.\.(\s|$)")
# A section adornment: one repeated punctuation character (at least 3 of them).
_ADORNMENT = re.compile(r"^([=\-`:'\"~^_*+#<>.])\1{2,}\s*$")
_TABLE_LINE = re.compile(r"^\s*(?:[+|]|={2,}\s+=)")
_FIELD = re.compile(r"^:[^:\s][^:]*:(\s|$)")
_BULLET = re.compile(r"^([-*+\u2022]|#\.|\(?\d{1,3}[.)]|\(?[a-zA-Z][.)])\s+")
_OPTION_LIST = re.compile(r"^-{1,2}\w")
# Inline markup, innermost first.
_ROLE = re.compile(r":[\w:+.-]+:`([^`]*)`")
_ROLE_AFTER = re.compile(r"`([^`]*)`:[\w:+.-]+:")
_LINK_TEXT = re.compile(r"^(.*?)\s*<[^<>]*>$", re.DOTALL)
_REFERENCE = re.compile(r"`([^`]+)`__?")
_LITERAL = re.compile(r"``(.+?)``")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")
_INTERPRETED = re.compile(r"`([^`]+)`")
_FOOTNOTE_REF = re.compile(r"\s*\[(?:#\w*|\*|\d+)\]_")
_SUBSTITUTION = re.compile(r"\|([^|\s][^|]*)\|_{0,2}")
# A named reference ("PEP_", "Section__"); not "__init__" or other dunder names.
_NAMED_REF = re.compile(r"(?<![\w`])([A-Za-z0-9](?:[\w-]*[A-Za-z0-9])?)__?(?=[\s.,;:!?)]|$)")


def _role_text(match: re.Match) -> str:
    body = match.group(1)
    link = _LINK_TEXT.match(body)
    text = link.group(1) if link and link.group(1) else body
    return text.lstrip("~!")


def rst_inline_text(text: str) -> str:
    """Replaces reStructuredText inline markup with its visible text.

    Args:
        text: str. A paragraph of RST.

    Returns:
        The paragraph with roles (`:ref:\\`text <target>\\`` -> "text"), references,
        literals, emphasis, footnote references and substitutions rendered as plain text.
    """
    text = _FOOTNOTE_REF.sub("", text)
    text = _NAMED_REF.sub(r"\1", text)
    text = _ROLE.sub(_role_text, text)
    text = _ROLE_AFTER.sub(_role_text, text)
    text = _LITERAL.sub(r"\1", text)
    text = _REFERENCE.sub(_role_text, text)
    text = _INTERPRETED.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _SUBSTITUTION.sub(r"\1", text)
    return text.replace("\\", "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _rst_blocks(lines: List[str]) -> Iterator[List[str]]:
    """Groups lines into blocks (runs of non-blank lines), dropping code and directive bodies."""
    skip_above = None  # drop lines indented deeper than this (a literal or directive body)
    block: List[str] = []
    for raw in lines:
        line = raw.expandtabs(8).rstrip()
        if not line:
            if block:
                yield block
                block = []
            continue
        indent = _indent(line)
        if skip_above is not None:
            if indent > skip_above:
                continue
            skip_above = None
        stripped = line.strip()
        directive = _DIRECTIVE.match(stripped)
        if directive:
            if block:
                yield block
                block = []
            if directive.group(1).lower() not in PROSE_DIRECTIVES:
                skip_above = indent
            elif directive.group(2).strip():
                block = [directive.group(2).strip()]
            continue
        if _COMMENT_OR_TARGET.match(stripped):
            if block:
                yield block
                block = []
            skip_above = indent  # a comment's or target's continuation lines
            continue
        block.append(line)
        if stripped.endswith("::"):
            # The paragraph introduces a literal block: keep the paragraph, drop the code
            # (every following line indented deeper than the paragraph).
            skip_above = _indent(block[0])
            yield block
            block = []
    if block:
        yield block


def _block_paragraphs(block: List[str]) -> Iterator[str]:
    """Turns one block into paragraphs: list items split, titles/tables/fields dropped."""
    if any(_ADORNMENT.match(line.strip()) for line in block):
        return  # a section title with its adornment (or a transition)
    if any(_TABLE_LINE.match(line) for line in block):
        return
    if (len(block) > 1 and _indent(block[1]) > _indent(block[0])
            and not _BULLET.match(block[0].strip())):
        block = block[1:]  # a definition list's term: a label, not a sentence
    items: List[List[str]] = []  # [] marks a dropped field or option entry
    for line in block:
        stripped = line.strip()
        bullet = _BULLET.match(stripped)
        if _FIELD.match(stripped) or (_OPTION_LIST.match(stripped) and not bullet):
            items.append([])  # field lists (":Author: ...") and option lists are metadata
        elif bullet:
            items.append([stripped[bullet.end():]])
        elif not items:
            items.append([stripped])
        elif not items[-1]:
            if _indent(line) == 0:
                items.append([stripped])  # after a field, unindented text is a new paragraph
        else:
            items[-1].append(stripped)
    for item in items:
        if item:
            text = " ".join(item)
            if text.endswith("::"):
                text = text[:-1]  # "as follows::" renders as "as follows:"
            yield rst_inline_text(text)


def rst_paragraphs(text: str) -> List[str]:
    """The prose-candidate paragraphs of a reStructuredText page.

    Drops section titles, tables, comments and targets, field and option lists, literal
    blocks (after `::`) and the bodies of directives other than admonitions
    (`PROSE_DIRECTIVES`); keeps list items as paragraphs of their own.

    Args:
        text: str. The RST source (e.g. a Sphinx `_sources/*.rst.txt`).

    Returns:
        Paragraphs with inline markup rendered as plain text (not yet `is_prose`-filtered).
    """
    paragraphs = []
    for block in _rst_blocks(text.splitlines()):
        paragraphs.extend(_block_paragraphs(block))
    return paragraphs


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

# Elements whose whole content is dropped: code, tables, navigation, page furniture.
SKIPPED_HTML_TAGS = frozenset({"script", "style", "pre", "table", "nav", "head", "header",
                               "footer", "form", "select", "button", "svg", "math", "textarea",
                               "noscript", "object", "iframe", "h1", "h2", "h3", "h4", "h5",
                               "h6", "dt", "caption", "figcaption", "kbd", "samp"})
# Elements dropped by class (Sphinx, DocBook, javadoc and rustdoc page furniture, code blocks).
SKIPPED_HTML_CLASSES = frozenset({
    "sphinxsidebar", "related", "footer", "headerlink", "highlight", "toctree-wrapper",
    "navheader", "navfooter", "navigation", "toc", "breadcrumbs", "sidebar", "sidebar-elems",
    "programlisting", "screen", "synopsis", "literallayout", "cmdsynopsis", "funcsynopsis",
    "sub-nav", "top-nav", "summary", "member-signature", "type-signature", "src", "example-wrap",
    "code-header", "codeblock", "codeblockpre", "sourceCode", "doc-src", "linenodiv",
})
# Elements that start a new paragraph.
_BLOCK_TAGS = frozenset({"p", "div", "li", "dd", "ul", "ol", "dl", "blockquote", "section",
                         "article", "body", "tr", "td", "th", "br", "hr", "main", "aside",
                         "center", "title", "figure", "details", "summary", "address"})
_VOID_TAGS = frozenset({"br", "hr", "img", "input", "meta", "link", "area", "base", "col",
                        "embed", "param", "source", "track", "wbr"})


class _ProseHTMLParser(html.parser.HTMLParser):
    """Collects the text of an HTML page as paragraphs, skipping `SKIPPED_HTML_*` elements."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: List[str] = []
        self._parts: List[str] = []
        self._skip_tag = None  # the tag that opened the element being skipped
        self._skip_depth = 0

    def _flush(self):
        if self._parts:
            text = "".join(self._parts).strip()
            if text:
                self.paragraphs.append(text)
            self._parts = []

    def handle_starttag(self, tag, attrs):
        if self._skip_tag is not None:
            if tag == self._skip_tag and tag not in _VOID_TAGS:
                self._skip_depth += 1
            return
        classes = set()
        for name, value in attrs:
            if name == "class" and value:
                classes.update(value.split())
        if tag in SKIPPED_HTML_TAGS or classes & SKIPPED_HTML_CLASSES:
            if tag in _BLOCK_TAGS or tag in SKIPPED_HTML_TAGS:
                self._flush()
            if tag not in _VOID_TAGS:
                self._skip_tag, self._skip_depth = tag, 1
            return
        if tag in _BLOCK_TAGS:
            self._flush()

    def handle_startendtag(self, tag, attrs):
        if self._skip_tag is None and tag in _BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag):
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._skip_tag = None
            return
        if tag in _BLOCK_TAGS:
            self._flush()

    def handle_data(self, data):
        if self._skip_tag is None:
            self._parts.append(data)

    def close(self):
        super().close()
        self._flush()


def html_paragraphs(text: str) -> List[str]:
    """The prose-candidate paragraphs of an HTML page.

    Block elements (`p`, `li`, `dd`, `div`, ...) delimit paragraphs; code, tables, headings,
    navigation and page furniture (`SKIPPED_HTML_TAGS`, `SKIPPED_HTML_CLASSES`) are dropped;
    inline elements (`a`, `code`, `em`) keep their text. Entities are decoded.

    Args:
        text: str. The HTML source of one page.

    Returns:
        Paragraphs in page order (not yet `is_prose`-filtered).
    """
    parser = _ProseHTMLParser()
    parser.feed(text)
    parser.close()
    return parser.paragraphs


# --------------------------------------------------------------------------------------------
# Perl POD
# --------------------------------------------------------------------------------------------

_POD_CODE = re.compile(r"([A-Z])<(?:<+\s+(.*?)\s+>+|([^<>]*))>", re.DOTALL)
_POD_ESCAPE = re.compile(r"E<([^<>]*)>")
# E<lt> and E<gt> stand in as private-use characters until the other codes are rendered, so
# the brackets they produce are never read as the start or end of a code.
_POD_LT, _POD_GT = "\ue000", "\ue001"
_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&",
                 "apos": "'", "nbsp": " "}


def _pod_code(match: re.Match) -> str:
    code, body = match.group(1), match.group(2) if match.group(2) is not None else match.group(3)
    if code in "XZ":
        return ""  # index entries and zero-width markers
    if code == "L":
        text = body.split("|", 1)[0] if "|" in body else body
        return text.split("/", 1)[-1].strip('"') if "|" not in body and "/" in text else text
    return body  # B, I, C, F, S: the text itself


def _pod_escape(match: re.Match) -> str:
    body = match.group(1)
    if body in ("lt", "gt"):
        return _POD_LT if body == "lt" else _POD_GT
    try:
        if body.isdigit():
            return chr(int(body))
        if body.startswith("0x"):
            return chr(int(body, 16))
    except (ValueError, OverflowError):
        return ""
    return _POD_ENTITIES.get(body, "")


def pod_inline_text(text: str) -> str:
    """Replaces POD formatting codes (`B<>`, `C<< >>`, `L<text|target>`, `E<gt>`) with text."""
    text = _POD_ESCAPE.sub(_pod_escape, text)
    previous = None
    while previous != text:  # innermost codes first, until none is left
        previous = text
        text = _POD_CODE.sub(_pod_code, text)
    return text.replace(_POD_LT, "<").replace(_POD_GT, ">")


def pod_paragraphs(text: str) -> List[str]:
    """The prose-candidate paragraphs of a POD document.

    Ordinary paragraphs are kept; verbatim (indented) paragraphs, command paragraphs
    (`=head1`, `=item`, ...) and `=begin`/`=for` blocks are dropped, as is everything
    outside `=pod`...`=cut`.

    Args:
        text: str. The POD source (a `.pod` file, or a `.pm` with POD in it).

    Returns:
        Paragraphs with formatting codes rendered as plain text.
    """
    paragraphs = []
    in_pod = False
    in_begin = False
    for block in re.split(r"\n\s*\n", text):
        if not block.strip():
            continue
        if block.startswith("="):
            command = block.split(None, 1)[0]
            if command == "=cut":
                in_pod = False
            else:
                in_pod = True
                if command == "=begin":
                    in_begin = True
                elif command == "=end":
                    in_begin = False
            continue
        if not in_pod or in_begin or block[0] in " \t":
            continue
        paragraphs.append(pod_inline_text(block))
    return paragraphs


# --------------------------------------------------------------------------------------------
# Pages
# --------------------------------------------------------------------------------------------

PARAGRAPH_READERS = {"rst": rst_paragraphs, "html": html_paragraphs, "pod": pod_paragraphs}


def page_documents(pages: Mapping[str, bytes], markup: str) -> Iterator[Document]:
    """One document per page, in sorted path order: the page's prose sentences.

    Args:
        pages: {path: bytes}. The pages (UTF-8; undecodable bytes are replaced).
        markup: str. "rst", "html" or "pod" (`PARAGRAPH_READERS`).

    Yields:
        Documents (lists of sentences); pages without prose yield nothing.

    Raises:
        KeyError: an unknown markup name (sources.json is checked before this runs).
    """
    paragraphs_of = PARAGRAPH_READERS[markup]
    for path in sorted(pages):
        document = prose_document(paragraphs_of(pages[path].decode("utf-8", "replace")))
        if document:
            yield document
