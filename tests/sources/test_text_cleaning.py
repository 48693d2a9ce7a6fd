"""Tests for electra_tf.sources.text_cleaning and wikitext: wikitext cleaner, sentence splitter,
per-source text."""

import bz2
import io

import pytest

from electra_tf.sources import text_cleaning as tc
from electra_tf.sources import wikitext as wt


# ---------------------------------------------------------------------------------------------
# split_sentences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("The cat sat. The dog ran! Did it? Yes.",
     ["The cat sat.", "The dog ran!", "Did it?", "Yes."]),
    # Abbreviations, titles and initials do not end sentences.
    ("Dr. Smith met Mr. J. R. R. Tolkien in St. Louis. They talked.",
     ["Dr. Smith met Mr. J. R. R. Tolkien in St. Louis.", "They talked."]),
    ("It costs 3.14 dollars, e.g. Cheap ones. Others cost 2.5 times more.",
     ["It costs 3.14 dollars, e.g. Cheap ones.", "Others cost 2.5 times more."]),
    ("The U.S. Army grew. It was 1942.", ["The U.S. Army grew.", "It was 1942."]),
    # "No." abbreviates "number" only before a number.
    ("He was No. 2 in Vol. II here. I said no. No. Then he left.",
     ["He was No. 2 in Vol. II here.", "I said no.", "No.", "Then he left."]),
    # Closing quotes and brackets stay with their sentence; opening ones start the next.
    ('"My dear Mr. Bennet," said she. "Have you heard?" He had not.',
     ['"My dear Mr. Bennet," said she.', '"Have you heard?"', "He had not."]),
    ("He left (quietly.) Then she wrote.", ["He left (quietly.)", "Then she wrote."]),
    # Lowercase after a period: no split (approximate by design).
    ("It was approx. five feet. ok then.", ["It was approx. five feet. ok then."]),
    # Digits start sentences too; whitespace and newlines are collapsed.
    ("It ended.\n  1999 was next.", ["It ended.", "1999 was next."]),
    # A list number opening the paragraph is not a sentence; later numbers end sentences.
    ("2. An edge in a tree. It ended in 1939. Then peace.",
     ["2. An edge in a tree.", "It ended in 1939.", "Then peace."]),
    ("", []),
    ("   \n ", []),
])
def test_split_sentences(text, expected):
    assert tc.split_sentences(text) == expected


def test_split_sentences_keeps_every_character_of_the_text():
    text = ("Albedo is 0.3. Earth's is about 0.30! Dr. Who? Yes. The U.K. agreed. "
            "A. B. Smith wrote it.")
    assert " ".join(tc.split_sentences(text)) == text


def test_tidy_text_repairs_gaps_left_by_removed_markup():
    assert tc.tidy_text("Albedo ( ) or  reflection ,  here (; mainly ) .") == \
        "Albedo or reflection, here (mainly)."


# ---------------------------------------------------------------------------------------------
# clean_wikitext
# ---------------------------------------------------------------------------------------------

ALBEDO_WIKITEXT = """{{Other uses}}
{{Use dmy dates|date=June 2013}}
[[File:Albedo-e hg.svg|thumb|Percentage of [[diffuse reflection|diffusely reflected]] sunlight]]

'''Albedo''' ({{IPAc-en|æ|l|ˈ|b|iː|d|oʊ}}) or '''reflection coefficient''', derived from [[Latin]] ''albedo'' "whiteness", is the [[diffuse reflection|diffuse reflectivity]] of a surface.<ref>Environmental Encyclopedia, 3rd ed., 2003</ref> It is about 15&nbsp;°C.<!-- hidden
comment -->

==Terrestrial albedo==
{| class="wikitable" style="float:right"
|+ Sample albedos
|-
! Surface !! Typical albedo
|-
| Fresh asphalt || 0.04<ref name="heat island">{{cite web|url=http://x.org/a|title=Pavement}}</ref>
|}
Albedos range from up to 0.9 for [[snow|fresh snow]]s to about 0.04 for charcoal.<ref name="heat island"/> It is {{convert|100|km|mi}} wide.
* The [[Moon]] has a low albedo of 0.12.
* Short item

== See also ==
* [[Cool roof]]
* [[Daisyworld]]

== History ==
It was introduced by [[Johann Heinrich Lambert]] in his ''[[Photometria]]'' (see [http://example.org/p the text]).
[[Category:Physical quantities]]
[[de:Albedo]]
"""


def test_clean_wikitext_on_a_realistic_article():
    assert wt.clean_wikitext(ALBEDO_WIKITEXT) == [
        'Albedo or reflection coefficient, derived from Latin albedo "whiteness", is the '
        "diffuse reflectivity of a surface. It is about 15 °C.",
        "Albedos range from up to 0.9 for fresh snows to about 0.04 for charcoal. "
        "It is 100 km wide.",
        "The Moon has a low albedo of 0.12.",
        "It was introduced by Johann Heinrich Lambert in his Photometria (see the text).",
    ]


@pytest.mark.parametrize("wikitext, expected", [
    # Nested templates inside a template, a link inside a file caption.
    ("A {{outer|x={{inner|y}}|z}} B [[File:X.png|thumb|A [[cat]] [above]]] C is here.",
     ["A B C is here."]),
    # Inline templates that carry visible text.
    ("Paris ({{lang|fr|Paris}}) is {{nowrap|very big}} here today.",
     ["Paris (Paris) is very big here today."]),
    ("It rose {{convert|1|to|3|m|ft}} in {{as of|2010}} measures.",
     ["It rose 1 to 3 m in As of 2010 measures."]),
    # Pipe trick, section links and leading-colon links.
    ("See [[Paris (band)|]] and [[#History]] and [[:Category:Cats|cat pages]] now.",
     ["See Paris and History and cat pages now."]),
    # Tags: self-closing refs, named refs, <br>, <sub>, math dropped, HTML entities decoded.
    ("H<sub>2</sub>O is water<ref name=a/> and<br/>ice &amp; snow <math>x^2</math>melt.",
     ["H2O is water and ice & snow melt."]),
    # Preformatted lines and short fragments are dropped; bare URLs removed.
    (" code line here\nSee http://example.org/x for more on this.\n\nToo short.",
     ["See for more on this."]),
    # Unclosed comment swallows the rest.
    ("Kept sentence is here. <!-- never closed\nlost text", ["Kept sentence is here."]),
])
def test_clean_wikitext_constructs(wikitext, expected):
    assert wt.clean_wikitext(wikitext) == expected


def _mediawiki_xml(pages):
    page_xml = "".join(
        f"<page><title>{title}</title><ns>{ns}</ns><id>{i}</id>{extra}"
        f"<revision><id>{i}</id><text xml:space=\"preserve\">{text}</text></revision></page>"
        for i, (title, ns, extra, text) in enumerate(pages))
    return ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">'
            f"<siteinfo><sitename>Wikipedia</sitename></siteinfo>{page_xml}</mediawiki>")


def test_wiki_xml_documents_skips_redirects_and_other_namespaces():
    xml = _mediawiki_xml([
        ("AccessibleComputing", 0, '<redirect title="Computer accessibility" />',
         "#REDIRECT [[Computer accessibility]]"),
        ("Anarchism", 0, "", "'''Anarchism''' is a [[political philosophy]]. It has "
                             "many forms.\n\n== Notes ==\n&lt;references/&gt;"),
        ("Wikipedia:About", 4, "", "This is a project page about the site."),
        ("Empty", 0, "", "{{stub}}"),
    ])
    docs = list(wt.wiki_xml_documents(io.BytesIO(bz2.decompress(bz2.compress(xml.encode())))))
    assert docs == [["Anarchism is a political philosophy.", "It has many forms."]]


# ---------------------------------------------------------------------------------------------
# Lee stories, novels, FOLDOC
# ---------------------------------------------------------------------------------------------


def test_lee_documents_one_story_per_line():
    text = ("Fires burn near Sydney. About 500 residents left.\n\n"
            "The Prime Minister spoke at 4:00pm AEDT. He said 3.5 per cent.\n")
    assert list(tc.lee_documents(text)) == [
        ["Fires burn near Sydney.", "About 500 residents left."],
        ["The Prime Minister spoke at 4:00pm AEDT.", "He said 3.5 per cent."],
    ]


NOVEL_LINES = [
    "EMMA", "", "By Jane Austen", "", "", "VOLUME I", "", "CHAPTER I", "", "",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home",
    "and happy disposition. Between _them_ it was more the intimacy of",
    "sisters.", "", "Mr. Knightley came.", "", None, "VOLUME II", "",
    "CHAPTER I", "", "Chapter two text is here.", "", "FINIS", "", "A NOTE ON THE TEXT", "",
    "Editors wrote this.",
]


def test_novel_chapter_documents_splits_chapters_and_drops_headings():
    assert list(tc.novel_chapter_documents(NOVEL_LINES)) == [
        ["Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
         "disposition.", "Between them it was more the intimacy of sisters.",
         "Mr. Knightley came."],
        ["Chapter two text is here."],
    ]


def test_dictd_decode_number():
    assert tc.dictd_decode_number("A") == 0
    assert tc.dictd_decode_number("K5") == 10 * 64 + 57
    assert tc.dictd_decode_number("Gb9L") == ((6 * 64 + 27) * 64 + 61) * 64 + 11
    with pytest.raises(ValueError, match="invalid dictd base64 digit"):
        tc.dictd_decode_number("a-b")


FOLDOC_BROKET = """broket

   <character> /broh'k*t/ or /broh'ket/ (From broken bracket)
   Either of the characters "<" or ">" when used as paired
   enclosing {delimiters} ({angle brackets}).

   [{Jargon File}]

   (1997-07-21)

"""


@pytest.mark.parametrize("entry, expected", [
    (FOLDOC_BROKET, ['(From broken bracket) Either of the characters "<" or ">" when used as '
                     "paired enclosing delimiters (angle brackets)."]),
    # Alias entries (body is one cross reference) give no document.
    ("broker\n\n   {object request broker}\n\n", []),
    # Several headwords; numbered senses with mixed-case tags; a cross reference with a URL
    # that spans a blank line; code indented deeper than the body; a digits-only paragraph.
    ("Broken As Designed\nBAD\n\n   1. <web, Java> A __humourous__ {Specification\n   \n"
     "(http://x.org/s)} from <ibm@example.com> IBM.\n      int x = 1;\n\n   2. <humour> Fails by"
     " design.\n\n   3141 5926 5358 9793\n\n   (2020-05-17)\n",
     ["1. A humourous Specification from IBM.", "2. Fails by design."]),
])
def test_foldoc_entry_sentences(entry, expected):
    assert tc.foldoc_entry_sentences(entry) == expected


def test_foldoc_documents_uses_the_index_and_skips_metadata_and_duplicates():
    meta = "00-database-short\n     The dictionary\n\n"
    entry = "Brooks's Law\n\n   <programming> Adding people makes it later.\n\n   (1995-01-01)\n\n"
    alias = "broker\n\n   {object request broker}\n\n"
    dict_text = meta + entry + alias

    def b64(n):
        digits = ""
        while True:
            digits = tc._DICTD_B64[n % 64] + digits
            n //= 64
            if not n:
                return digits

    spans = [(0, len(meta)), (len(meta), len(entry)), (len(meta) + len(entry), len(alias))]
    index = "\n".join([f"00-database-short\t{b64(spans[0][0])}\t{b64(spans[0][1])}",
                       f"Brooks's Law\t{b64(spans[1][0])}\t{b64(spans[1][1])}",
                       f"Brooks law\t{b64(spans[1][0])}\t{b64(spans[1][1])}",
                       f"broker\t{b64(spans[2][0])}\t{b64(spans[2][1])}"])
    assert list(tc.foldoc_documents(index, dict_text)) == [["Adding people makes it later."]]


def test_foldoc_documents_decodes_utf8_inside_latin1_offsets():
    entry = "café\n\n   <food> A café serves coffee.\n\n"
    raw = entry.encode("utf-8")
    index = f"café\tA\t{tc._DICTD_B64[len(raw)]}"
    assert list(tc.foldoc_documents(index, raw.decode("latin-1"))) == [["A café serves coffee."]]
