"""Tests for electra_tf.sources.markup_text: RST, HTML and POD pages to prose sentences."""

import pytest

from electra_tf.sources import markup_text
from electra_tf.sources.markup_text import (html_paragraphs, is_prose, page_documents,
                                            pod_paragraphs, prose_document, rst_inline_text,
                                            rst_paragraphs)

RST_PAGE = """\
.. _submitting:

Submitting patches: the essential guide
=======================================

For a person or company who wishes to submit a change to the Linux
kernel, the process can sometimes be daunting.  See :ref:`the format <patch_format>`
and ``git`` for details.

Obtain a source tree
--------------------

Use ``git`` to obtain one, which can be grabbed with::

  git clone git://git.kernel.org/pub/scm/linux.git
  cd linux

.. code-block:: c

   int main(void) { return 0; }

.. note::
   Most subsystem maintainers run their own trees and want patches against them.

.. toctree::
   :maxdepth: 2

   other-page

:Author: Someone <someone@example.org>
:Date: 2020

- The first item of the list is a full sentence of its own.
- The second item of the list is another sentence here.

+-------+-------+
| table | cells |
+-------+-------+

term
   The definition of the term is a sentence that should be kept.
"""


def test_rst_paragraphs_keep_prose_and_drop_code_titles_tables_fields():
    assert rst_paragraphs(RST_PAGE) == [
        "For a person or company who wishes to submit a change to the Linux kernel, the "
        "process can sometimes be daunting.  See the format and git for details.",
        "Use git to obtain one, which can be grabbed with:",
        "Most subsystem maintainers run their own trees and want patches against them.",
        "The first item of the list is a full sentence of its own.",
        "The second item of the list is another sentence here.",
        "The definition of the term is a sentence that should be kept.",
    ]


@pytest.mark.parametrize("rst, text", [
    (":ref:`the canonical format <patch_format>`", "the canonical format"),
    (":c:func:`~kmalloc`", "kmalloc"),
    ("`Python <https://python.org>`_ rocks", "Python rocks"),
    ("see `Section`_ or PEP__", "see Section or PEP"),
    ("**bold** and *emphasis* and ``literal``", "bold and emphasis and literal"),
    ("a note [#]_ and |version| here", "a note and version here"),
    ("2 * 3 * 4", "2 * 3 * 4"),
    ("``__init__`` and ``obj.attr_``", "__init__ and obj.attr_"),
])
def test_rst_inline_text(rst, text):
    assert rst_inline_text(rst) == text


HTML_PAGE = """<!DOCTYPE html><html><head><title>Page title</title>
<style>p { color: red }</style><script>var x = "<p>not text</p>";</script></head>
<body><div class="related"><a href="a.html">Previous topic in the navigation bar</a></div>
<h1>Chapter 1. Getting Started<a class="headerlink" href="#x">\u00b6</a></h1>
<p>The <code>psql</code> program is an interactive terminal that lets you type queries
&amp; see their results.</p>
<pre>SELECT * FROM weather WHERE city = 'San Francisco';</pre>
<div class="highlight"><span>print("code in a highlight block")</span></div>
<table><tr><td>A table cell that reads almost like a sentence here.</td></tr></table>
<ul><li>Each list item becomes a paragraph of its own, like this one.<li>An unclosed
item is still ended by the next block element in the page.</ul>
<p>Line one of a paragraph<br>continues after a break as a new paragraph here.</p>
<div class="footer">Copyright 2024, the project team and all its contributors.</div>
</body></html>"""


def test_html_paragraphs_drop_code_tables_navigation_and_headings():
    assert html_paragraphs(HTML_PAGE) == [
        "The psql program is an interactive terminal that lets you type queries\n& see "
        "their results.",
        "Each list item becomes a paragraph of its own, like this one.",
        "An unclosed\nitem is still ended by the next block element in the page.",
        "Line one of a paragraph",
        "continues after a break as a new paragraph here.",
    ]


POD_PAGE = """\
=head1 NAME

perlintro - a brief introduction and overview of Perl

=head1 DESCRIPTION

This document is intended to give you a quick overview of the B<Perl>
programming language, along with pointers to C<perldoc> and L<perlfunc/print>.

    my $animal = "camel";
    print "Hello, world\\n";

=begin html

<p>Only for the HTML renderer, never prose for us.</p>

=end html

Use E<lt>STDINE<gt> to read a line, see L<the manual|perlop>, and C<< $a <=> $b >> to sort
(C<$a E<gt> $b> is true when I<$a> is larger).

=cut

sub not_pod { "This text is code after the cut and is never read." }
"""


def test_pod_paragraphs_keep_ordinary_paragraphs_only():
    assert pod_paragraphs(POD_PAGE) == [
        "perlintro - a brief introduction and overview of Perl",
        "This document is intended to give you a quick overview of the Perl\nprogramming "
        "language, along with pointers to perldoc and print.",
        "Use <STDIN> to read a line, see the manual, and $a <=> $b to sort\n($a > $b is "
        "true when $a is larger).",
    ]


@pytest.mark.parametrize("paragraph, prose", [
    ("This is a plain sentence with enough words in it.", True),
    ("Too short to count.", False),
    ("int main(void) { return foo_bar->baz[0] * 2; } /* code */", False),
    ("0x0000 0x0001 0x0002 0x0003 0x0004 0x0005 0x0006", False),
    ("SEE ALSO THE MANUAL PAGES FOR EVERY COMMAND", False),
])
def test_is_prose(paragraph, prose):
    assert is_prose(paragraph) is prose


def test_prose_document_splits_sentences_of_prose_paragraphs():
    assert prose_document(["The first paragraph has words.  It has two sentences, too.",
                           "x = f(y)", "Short one."]) == [
        "The first paragraph has words.", "It has two sentences, too."]


def test_page_documents_one_per_page_in_path_order_and_skips_empty_pages():
    pages = {
        "b.html": b"<p>The second page in path order has one prose sentence.</p>",
        "a.html": b"<p>The first page in path order has one prose sentence.</p>",
        "c.html": b"<pre>only code here</pre>",
        "d.html": "<p>Caf\u00e9 text is decoded as UTF-8 and kept as it is.</p>".encode(),
    }
    assert list(page_documents(pages, "html")) == [
        ["The first page in path order has one prose sentence."],
        ["The second page in path order has one prose sentence."],
        ["Caf\u00e9 text is decoded as UTF-8 and kept as it is."],
    ]
    assert set(markup_text.PARAGRAPH_READERS) == {"rst", "html", "pod"}
