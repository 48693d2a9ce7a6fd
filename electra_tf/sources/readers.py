"""Per-source corpus readers: the members of one source -> documents (lists of sentences).

sources.json names a reader per source (`READERS`); each takes the source's members ({role:
bytes}, or {role: {path: bytes}} for a selection by pattern) and its "options", and yields
documents. `drop_repeated_sentences` filters a corpus set with "dedupe": true.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
from typing import Callable, Dict, Iterable, Iterator, List

from electra_tf.sources import markup_text
from electra_tf.sources import rlazyload
from electra_tf.sources import text_cleaning
from electra_tf.sources import wikitext
from electra_tf.sources.downloads import FetchError


def _wiki_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    with bz2.open(io.BytesIO(members["dump"])) as xml_file:
        yield from wikitext.wiki_xml_documents(xml_file)


def _lee_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    yield from text_cleaning.lee_documents(members["stories"].decode("utf-8", "replace"))


def _janeaustenr_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    try:
        objects = rlazyload.read_lazyload_db(members["index"], members["database"], "Rdata")
    except rlazyload.RDataError as e:
        raise FetchError(f"janeaustenr data: {e}") from e
    for novel in options["novels"]:
        value = objects.get(novel)
        if not (isinstance(value, rlazyload.RObject) and value.type == "character"):
            raise FetchError(f"janeaustenr data: no character vector named {novel!r}")
        yield from text_cleaning.novel_chapter_documents(value.value)


def _foldoc_reader(members: Dict[str, bytes], options: dict) -> Iterator[List[str]]:
    # dict.dz is dictzip, a gzip file with an index in its header; gzip reads it whole. Decode
    # as latin-1 so the index's byte offsets are character offsets.
    dict_text = gzip.decompress(members["dictionary"]).decode("latin-1")
    index_text = members["index"].decode("utf-8", "replace")
    yield from text_cleaning.foldoc_documents(index_text, dict_text)


def _pages_reader(markup: str):
    def read(members: Dict[str, dict], options: dict) -> Iterator[List[str]]:
        yield from markup_text.page_documents(members["pages"], markup)
    return read


READERS: Dict[str, Callable[[Dict[str, bytes], dict], Iterator[List[str]]]] = {
    "mediawiki_xml_bz2": _wiki_reader,
    "lines_one_story_each": _lee_reader,
    "janeaustenr_rdata": _janeaustenr_reader,
    "dictd_foldoc": _foldoc_reader,
    # Documentation pages (member role "pages", a selection): one document per page.
    "rst_pages": _pages_reader("rst"),
    "html_pages": _pages_reader("html"),
    "pod_pages": _pages_reader("pod"),
}


def drop_repeated_sentences(documents: Iterable[List[str]], seen: set,
                            counter: List[int]) -> Iterator[List[str]]:
    """Drops each sentence that an earlier document (of any source sharing `seen`) had.

    Documentation repeats itself: licence notes, "See also" lines, the same page in two
    packages. A page whose every sentence was seen before disappears.

    Args:
        documents: iterable of documents (lists of sentences).
        seen: set. Digests of the sentences seen so far; updated in place.
        counter: list of one int; the number of dropped sentences is added to counter[0].

    Yields:
        The documents without their repeated sentences (empty ones are skipped).
    """
    for document in documents:
        kept = []
        for sentence in document:
            digest = hashlib.blake2b(sentence.encode("utf-8"), digest_size=12).digest()
            if digest in seen:
                counter[0] += 1
            else:
                seen.add(digest)
                kept.append(sentence)
        if kept:
            yield kept
