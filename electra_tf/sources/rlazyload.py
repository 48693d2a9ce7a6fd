"""A minimal reader for R lazy-load databases (`data/Rdata.rdx` + `data/Rdata.rdb`).

Debian's `r-cran-janeaustenr` ships Jane Austen's novels not as text but as R data objects
(one character vector of lines per novel) stored the way R stores a package's `data/`: an index
file (`.rdx`, a gzip-compressed R serialization of `list(variables=, references=, compressed=)`)
and a database file (`.rdb`) of separately compressed R serializations, addressed by the
index's `(offset, length)` pairs.

Only what such data needs is implemented: R's binary XDR serialization (format versions 2 and 3)
of NULL, logical/integer/double/complex/raw/character vectors, lists, pairlists, symbols and
attributes. Anything else (closures, environments, byte code, ALTREP objects) raises
`RDataError` naming the type, rather than being misread. Reading the format this narrowly keeps
the default-data fetch free of a heavy dependency (PyPI `rdata` pulls in numpy, pandas and
xarray) for six character vectors.

Format references (read to learn, nothing copied): R's `src/main/serialize.c` (item flags, type
codes, string encodings) and `src/library/base/R/lazyload.R` (`makeLazyLoadDB` index layout).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from typing import NamedTuple

from electra_tf.errors import ElectraError

# SEXP type codes (R's Rinternals.h) of the objects this reader understands.
_NILSXP = 0
_SYMSXP = 1
_LISTSXP = 2
_CHARSXP = 9
_LGLSXP = 10
_INTSXP = 13
_REALSXP = 14
_CPLXSXP = 15
_STRSXP = 16
_VECSXP = 19
_EXPRSXP = 20
_RAWSXP = 24
# Pseudo-types used only in the serialization stream (serialize.c).
_REFSXP = 255
_NILVALUE_SXP = 254
_GLOBALENV_SXP = 253
_EMPTYENV_SXP = 242
_BASEENV_SXP = 241
_ATTRLISTSXP = 239

# Bit layout of an item's flags word (serialize.c: PackFlags).
_TYPE_MASK = 0xFF
_HAS_ATTR = 1 << 9
_HAS_TAG = 1 << 10
_LEVELS_SHIFT = 12
# CHARSXP encoding bits in the levels field (Defn.h).
_LATIN1_MASK = 1 << 2
_BYTES_MASK = 1 << 1
# R's NA_integer_ (INT_MIN) and the length marker of a NA_character_ CHARSXP.
_NA_INTEGER = -(2**31)
_NA_STRING_LENGTH = -1
# A length of -1 announces a "long vector" whose length follows as two 32-bit words.
_LONG_LENGTH_MARKER = -1
# The .rdb compression codes R writes (makeLazyLoadDB's `compress` argument):
# TRUE/1 = zlib with no type byte; 2 = bzip2 and 3 = xz, each with a type byte that may also be
# "0" (stored uncompressed because compression did not help).
_RDB_TYPED_CODES = {2, 3}
# R compresses with xz preset 9 (extreme), whose LZMA2 dictionary is 64 MiB; a raw stream
# carries no header, so the decoder must be told.
_R_XZ_DICT_SIZE = 64 << 20
_RDB_TYPE_BYTES = {b"Z": "zlib", b"2": "bzip2", b"X": "xz", b"0": "none"}


class RDataError(ElectraError, ValueError):
    """An R data file is malformed or uses a feature this reader does not support."""


class RNull:
    """R's NULL (a singleton: `R_NULL`)."""

    def __repr__(self) -> str:
        return "R_NULL"


R_NULL = RNull()


class RObject(NamedTuple):
    """A decoded R value with its attributes.

    Attributes:
        type: str. R's type name: "character", "integer", "double", "logical", "complex",
            "raw", "list", "pairlist", "symbol", "expression".
        value: list | str | bytes. Vector elements in order (NA as None); the name for a
            symbol; the bytes of a raw vector; `(tag, value)` pairs for a pairlist.
        attributes: dict. Attribute name to decoded value (e.g. "names", "class").
    """

    type: str
    value: object
    attributes: dict


_VECTOR_TYPE_NAMES = {
    _LGLSXP: "logical",
    _INTSXP: "integer",
    _REALSXP: "double",
    _CPLXSXP: "complex",
    _STRSXP: "character",
    _VECSXP: "list",
    _EXPRSXP: "expression",
    _RAWSXP: "raw",
}


class _XdrReader:
    """Decodes one R XDR serialization stream (`serialize(x, NULL, xdr=TRUE)`)."""

    def __init__(self, data: bytes, source: str):
        self._data = data
        self._pos = 0
        self._source = source
        self._refs: list = []

    def _fail(self, message: str) -> RDataError:
        return RDataError(f"{self._source}: {message} (at byte {self._pos})")

    def _take(self, n: int) -> bytes:
        if n < 0 or self._pos + n > len(self._data):
            raise self._fail(f"truncated stream: wanted {n} bytes")
        chunk = self._data[self._pos:self._pos + n]
        self._pos += n
        return chunk

    def _int(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def _length(self) -> int:
        n = self._int()
        if n == _LONG_LENGTH_MARKER:
            upper, lower = struct.unpack(">II", self._take(8))
            n = (upper << 32) | lower
        if n < 0:
            raise self._fail(f"negative vector length {n}")
        return n

    def read(self):
        """Reads the header and the single top-level object."""
        magic = self._take(2)
        if magic != b"X\n":
            raise self._fail(f"not an R XDR serialization (magic {magic!r})")
        version = self._int()
        self._int()  # R version that wrote it
        self._int()  # minimal R version that can read it
        if version == 3:
            self._take(self._int())  # native encoding name, e.g. "UTF-8"
        elif version != 2:
            raise self._fail(f"unsupported serialization format version {version}")
        return self._item()

    def _item(self):
        flags = self._int()
        sexp_type = flags & _TYPE_MASK
        has_attr = bool(flags & _HAS_ATTR)
        levels = flags >> _LEVELS_SHIFT

        if sexp_type == _NILVALUE_SXP:
            return R_NULL
        if sexp_type in (_GLOBALENV_SXP, _EMPTYENV_SXP, _BASEENV_SXP):
            return RObject("environment", None, {})
        if sexp_type == _REFSXP:
            index = flags >> 8
            if index == 0:
                index = self._int()
            if not 1 <= index <= len(self._refs):
                raise self._fail(f"reference {index} out of range")
            return self._refs[index - 1]
        if sexp_type == _SYMSXP:
            name = self._item()
            symbol = RObject("symbol", name, {})
            self._refs.append(symbol)
            return symbol
        if sexp_type in (_LISTSXP, _ATTRLISTSXP):
            return self._pairlist(flags)
        if sexp_type == _CHARSXP:
            return self._charsxp(levels)
        if sexp_type in _VECTOR_TYPE_NAMES:
            value = self._vector(sexp_type)
            attributes = self._attributes() if has_attr else {}
            return RObject(_VECTOR_TYPE_NAMES[sexp_type], value, attributes)
        raise self._fail(f"unsupported R object type code {sexp_type}")

    def _pairlist(self, flags: int) -> RObject:
        # A pairlist is a chain of (attributes?, tag?, car, cdr) cells; read iteratively so a
        # long attribute list cannot exhaust Python's recursion limit.
        pairs = []
        attributes: dict = {}
        while True:
            if flags & _HAS_ATTR:
                attributes.update(self._attributes())
            tag = self._item() if flags & _HAS_TAG else None
            tag_name = tag.value if isinstance(tag, RObject) and tag.type == "symbol" else None
            pairs.append((tag_name, self._item()))
            flags = self._int()
            if (flags & _TYPE_MASK) not in (_LISTSXP, _ATTRLISTSXP):
                self._pos -= 4  # not a pairlist cell: let _item() decode the cdr
                tail = self._item()
                if tail is not R_NULL:
                    raise self._fail("improper pairlist (cdr is not NULL)")
                return RObject("pairlist", pairs, attributes)

    def _attributes(self) -> dict:
        attrs = self._item()
        if not (isinstance(attrs, RObject) and attrs.type == "pairlist"):
            raise self._fail("attributes are not a pairlist")
        return {tag: value for tag, value in attrs.value}

    def _charsxp(self, levels: int):
        n = self._int()
        if n == _NA_STRING_LENGTH:
            return None
        raw = self._take(n)
        if levels & _LATIN1_MASK:
            return raw.decode("latin-1")
        if levels & _BYTES_MASK:
            return raw.decode("utf-8", errors="replace")
        # UTF-8, ASCII and "native" (UTF-8 on the Debian builders) strings.
        return raw.decode("utf-8", errors="replace")

    def _vector(self, sexp_type: int):
        n = self._length()
        if sexp_type == _STRSXP:
            out = []
            for _ in range(n):
                element = self._item()
                if element is not None and not isinstance(element, str):
                    raise self._fail("character vector element is not a string")
                out.append(element)
            return out
        if sexp_type in (_VECSXP, _EXPRSXP):
            return [self._item() for _ in range(n)]
        if sexp_type == _RAWSXP:
            return self._take(n)
        if sexp_type in (_LGLSXP, _INTSXP):
            values = struct.unpack(f">{n}i", self._take(4 * n))
            return [None if v == _NA_INTEGER else (bool(v) if sexp_type == _LGLSXP else v)
                    for v in values]
        if sexp_type == _REALSXP:
            return list(struct.unpack(f">{n}d", self._take(8 * n)))
        values = struct.unpack(f">{2 * n}d", self._take(16 * n))
        return [complex(values[2 * i], values[2 * i + 1]) for i in range(n)]


def unserialize(data: bytes, source: str = "<bytes>"):
    """Decodes an uncompressed R XDR serialization.

    Args:
        data: bytes. The stream, starting with b"X\\n".
        source: str. Name used in error messages.

    Returns:
        The decoded object: `R_NULL`, a `str`/None (a lone CHARSXP) or an `RObject`.

    Raises:
        RDataError: malformed or unsupported content.
    """
    return _XdrReader(data, source).read()


def read_rds(data: bytes, source: str = "<rds>"):
    """Decodes an `.rds` file's bytes (gzip-, bzip2-, xz-compressed or plain)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:3] == b"BZh":
        data = bz2.decompress(data)
    elif data[:6] == b"\xfd7zXZ\x00":
        data = lzma.decompress(data)
    return unserialize(data, source)


def _decompress_rdb_record(record: bytes, compress_code: int, source: str) -> bytes:
    """Inflates one `.rdb` record: a 4-byte big-endian inflated length, then the payload."""
    if len(record) < 4:
        raise RDataError(f"{source}: record shorter than its length header")
    (expected,) = struct.unpack(">I", record[:4])
    body = record[4:]
    if compress_code in _RDB_TYPED_CODES:
        kind = _RDB_TYPE_BYTES.get(body[:1])
        if kind is None:
            raise RDataError(f"{source}: unknown record compression byte {body[:1]!r}")
        body = body[1:]
    else:
        kind = "zlib"
    try:
        if kind == "zlib":
            out = zlib.decompress(body)
        elif kind == "bzip2":
            out = bz2.decompress(body)
        elif kind == "xz":
            # R writes a raw LZMA2 stream (lzma_raw_encoder), not an .xz container.
            out = lzma.decompress(body, format=lzma.FORMAT_RAW, filters=[
                {"id": lzma.FILTER_LZMA2, "dict_size": _R_XZ_DICT_SIZE}])
        else:
            out = body
    except (zlib.error, OSError, lzma.LZMAError) as e:
        raise RDataError(f"{source}: cannot decompress record ({kind}): {e}") from e
    if len(out) != expected:
        raise RDataError(f"{source}: record inflated to {len(out)} bytes, header says {expected}")
    return out


def read_lazyload_db(rdx: bytes, rdb: bytes, source: str = "Rdata") -> dict:
    """Decodes every variable of an R lazy-load database.

    Args:
        rdx: bytes. The index file (`NAME.rdx`).
        rdb: bytes. The database file (`NAME.rdb`).
        source: str. Name used in error messages.

    Returns:
        dict from variable name to its decoded value, in the index's order.

    Raises:
        RDataError: malformed files or unsupported objects; the message names `source`.
    """
    index = read_rds(rdx, f"{source}.rdx")
    if not (isinstance(index, RObject) and index.type == "list"):
        raise RDataError(f"{source}.rdx: index is not a list")
    fields = dict(zip(_names(index), index.value))
    variables = fields.get("variables")
    if not isinstance(variables, RObject) or variables.type != "list":
        raise RDataError(f"{source}.rdx: index has no 'variables' list")
    compressed = fields.get("compressed")
    compress_code = 1
    if isinstance(compressed, RObject) and compressed.value:
        compress_code = int(compressed.value[0])
    out = {}
    for name, position in zip(_names(variables), variables.value):
        if not (isinstance(position, RObject) and len(position.value) == 2):
            raise RDataError(f"{source}.rdx: bad (offset, length) for variable {name!r}")
        offset, length = (int(v) for v in position.value)
        record = rdb[offset:offset + length]
        if len(record) != length:
            raise RDataError(f"{source}.rdb: variable {name!r} lies past the end of the file")
        payload = _decompress_rdb_record(record, compress_code, f"{source}.rdb[{name}]")
        out[name] = unserialize(payload, f"{source}.rdb[{name}]")
    return out


def _names(obj: RObject) -> list:
    names = obj.attributes.get("names")
    if not (isinstance(names, RObject) and names.type == "character"):
        raise RDataError("list has no names attribute")
    return names.value
