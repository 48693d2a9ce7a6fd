"""Tests for electra_tf.sources.rlazyload: R XDR serializations and lazy-load databases.

The bytes are written here by a tiny encoder that follows R's format (flags word = type |
levels << 12 | has-attr bit 9 | has-tag bit 10), so each test states the exact stream.
"""

import bz2
import gzip
import lzma
import struct
import zlib

import pytest

from electra_tf.sources import rlazyload
from electra_tf.sources.downloads import FetchError
from electra_tf.sources.readers import READERS
from electra_tf.sources.rlazyload import R_NULL, RDataError

UTF8_LEVEL = 1 << 3
LATIN1_LEVEL = 1 << 2
HAS_ATTR = 1 << 9
HAS_TAG = 1 << 10


def i32(*values):
    return struct.pack(f">{len(values)}i", *values)


def charsxp(text, level=UTF8_LEVEL, encoding="utf-8"):
    if text is None:
        return i32(9, -1)
    raw = text.encode(encoding)
    return i32(9 | (level << 12), len(raw)) + raw


def symbol(name):
    return i32(1) + charsxp(name)


def pairlist(items):
    """Tagged pairlist cells, then R's NULL terminator."""
    out = b""
    for tag, value in items:
        out += i32(2 | HAS_TAG) + tag + value
    return out + i32(254)


def strsxp(values, attrs=None):
    out = i32(16 | (HAS_ATTR if attrs else 0), len(values))
    out += b"".join(charsxp(v) for v in values)
    return out + (pairlist(attrs) if attrs else b"")


def intsxp(values):
    return i32(13, len(values), *values)


def vecsxp(items, names):
    return i32(19 | HAS_ATTR, len(items)) + b"".join(items) + pairlist(
        [(symbol("names"), strsxp(names))])


def serialized(body, version=3):
    header = b"X\n" + i32(version, 0x040201, 0x030500)
    if version == 3:
        header += i32(5) + b"UTF-8"
    return header + body


def lazyload_db(variables, compress=1):
    """Builds (rdx, rdb) bytes for {name: serialized body} the way R's makeLazyLoadDB does."""
    rdb = b""
    positions = []
    for body in variables.values():
        payload = serialized(body)
        if compress == 3:
            packed = b"X" + lzma.compress(payload, format=lzma.FORMAT_RAW,
                                          filters=[{"id": lzma.FILTER_LZMA2}])
        elif compress == 2:
            packed = b"2" + bz2.compress(payload)
        else:
            packed = zlib.compress(payload)
        record = struct.pack(">I", len(payload)) + packed
        positions.append(intsxp([len(rdb), len(record)]))
        rdb += record
    compressed = i32(10, 1, 1) if compress == 1 else intsxp([compress])
    index = vecsxp([vecsxp(positions, list(variables)), i32(254), compressed],
                   ["variables", "references", "compressed"])
    return gzip.compress(serialized(index)), rdb


def test_unserialize_character_vector_with_na_encodings_and_attributes():
    body = (i32(16 | HAS_ATTR, 4) + charsxp("Emma") + charsxp(None)
            + charsxp("caf\u00e9", LATIN1_LEVEL, "latin-1") + charsxp("na\u00efve")
            + pairlist([(symbol("class"), strsxp(["novel"]))]))
    obj = rlazyload.unserialize(serialized(body))
    assert obj.type == "character"
    assert obj.value == ["Emma", None, "caf\u00e9", "na\u00efve"]
    assert obj.attributes["class"].value == ["novel"]


def test_unserialize_numbers_logicals_raw_and_references():
    na_int = -(2**31)
    body = vecsxp(
        [intsxp([1, na_int, -7]), i32(10, 3, 1, 0, na_int),
         i32(14, 2) + struct.pack(">2d", 0.5, -2.0), i32(24, 3) + b"abc"],
        ["ints", "lgls", "reals", "raw"])
    obj = rlazyload.unserialize(serialized(body, version=2))
    assert [v.value for v in obj.value] == [[1, None, -7], [True, False, None], [0.5, -2.0],
                                            b"abc"]
    # The second use of a symbol is written as a back-reference (REFSXP index 1).
    body = strsxp(["a"], attrs=[(symbol("names"), strsxp(["x"])),
                                (i32(255 | (1 << 8)), strsxp(["y"]))])
    obj = rlazyload.unserialize(serialized(body))
    assert obj.attributes == {"names": obj.attributes["names"]}
    assert obj.attributes["names"].value == ["y"]  # both cells are tagged "names"


@pytest.mark.parametrize("stream, message", [
    (b"A\n" + i32(3), "not an R XDR serialization"),
    (serialized(i32(3)), "unsupported R object type code 3"),  # a closure
    (serialized(i32(16, 5) + charsxp("x")), "truncated stream"),
    (serialized(i32(16, 1) + charsxp("x"), version=4), "unsupported serialization format"),
])
def test_unserialize_rejects_bad_or_unsupported_streams(stream, message):
    with pytest.raises(RDataError, match=message):
        rlazyload.unserialize(stream, "test.rds")


@pytest.mark.parametrize("compress", [1, 2, 3])
def test_read_lazyload_db_all_compressions(compress):
    rdx, rdb = lazyload_db({"emma": strsxp(["EMMA", "", "CHAPTER I"]),
                            "persuasion": strsxp(["Chapter 1"])}, compress)
    db = rlazyload.read_lazyload_db(rdx, rdb)
    assert list(db) == ["emma", "persuasion"]
    assert db["emma"].value == ["EMMA", "", "CHAPTER I"]
    assert db["persuasion"].value == ["Chapter 1"]


def test_read_lazyload_db_detects_truncated_database():
    rdx, rdb = lazyload_db({"emma": strsxp(["EMMA"])})
    with pytest.raises(RDataError, match="past the end"):
        rlazyload.read_lazyload_db(rdx, rdb[:-3])


def test_janeaustenr_reader_yields_chapters_of_the_pinned_novels_in_order():
    emma = ["EMMA", "", "CHAPTER I", "", "Emma was rich. She was clever.", "", "CHAPTER II",
            "", "Mr. Weston came."]
    persuasion = ["Chapter 1", "", "Sir Walter read."]
    rdx, rdb = lazyload_db({"emma": strsxp(emma), "persuasion": strsxp(persuasion),
                            "other": strsxp(["Chapter 1", "", "Not wanted."])})
    reader = READERS["janeaustenr_rdata"]
    docs = list(reader({"index": rdx, "database": rdb}, {"novels": ["persuasion", "emma"]}))
    assert docs == [["Sir Walter read."], ["Emma was rich.", "She was clever."],
                    ["Mr. Weston came."]]
    with pytest.raises(FetchError, match="no character vector named 'mansfieldpark'"):
        list(reader({"index": rdx, "database": rdb}, {"novels": ["mansfieldpark"]}))


def test_r_null_is_returned_for_nil():
    assert rlazyload.unserialize(serialized(i32(254))) is R_NULL
