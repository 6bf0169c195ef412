"""A minimal reader for R's lazy-load databases (``data/Rdata.rdx`` + ``Rdata.rdb``), enough to read character
vectors such as the novels of Debian's ``r-cran-janeaustenr`` without R installed.

Format (R Internals, "Serialization formats" and "Lazy loading"):

* ``Rdata.rdx`` is a gzip-compressed serialized list ``(variables, references, compressed)``; ``variables`` is a
  named list mapping each object's name to an integer pair ``(offset, length)`` into ``Rdata.rdb``.
* each ``.rdb`` entry is a 4-byte big-endian uncompressed length followed by the zlib stream (``compressed``
  TRUE/1); types 2 and 3 (bzip2, xz) carry one more type byte ``'2'``/``'X'`` (``'0'`` = stored).
* the payload is R's XDR serialization (``X\\n``, format version 2 or 3): a flags word per object, with
  ``type = flags & 0xFF``, "has attributes" bit 9 and "has tag" bit 10.

Only the object types such data needs are read: NULL, symbols, pairlists (attributes), character, integer,
logical, double and generic vectors, and references to earlier symbols. Anything else raises
:class:`RDataError` naming the type.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NILSXP, SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 0, 1, 2, 9, 10, 13, 14, 16, 19
REFSXP, NILVALUE_SXP = 255, 254
NA_INTEGER = -(2**31)


class RDataError(ValueError):
    """Bytes that are not (the supported subset of) R's XDR serialization."""


@dataclass
class RObject:
    """A deserialized R vector: its ``value`` (a Python list, ``None`` for NULL) and its ``attributes``."""

    value: Any
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str] | None:
        names = self.attributes.get("names")
        return None if names is None else list(names.value)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise RDataError(f"truncated R serialization: wanted {n} bytes at offset {self.pos} of {len(self.data)}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def length(self) -> int:
        n = self.int()
        if n == -1:  # long vector: two more words
            hi, lo = self.int(), self.int()
            return (hi << 32) + lo
        return n

    def header(self) -> None:
        if self.take(2) != b"X\n":
            raise RDataError("not an XDR R serialization (expected the 'X\\n' header; ASCII/native forms unsupported)")
        version = self.int()
        self.int(), self.int()  # writer's R version, minimal reader version
        if version == 3:
            self.take(self.int())  # native encoding name
        elif version != 2:
            raise RDataError(f"unsupported R serialization format version {version} (2 or 3 are read)")

    def item(self) -> Any:
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in (NILVALUE_SXP, NILSXP):
            return None
        if kind == REFSXP:
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == SYMSXP:
            name = self.item()  # a CHARSXP
            self.refs.append(name)
            return name
        if kind == LISTSXP:  # a pairlist: read it as an ordered dict of tag -> value
            out: dict[str, Any] = {}
            while kind == LISTSXP:
                if has_attr:
                    self.item()  # a pairlist cell's own attributes: not needed here
                tag = self.item() if has_tag else f"[[{len(out) + 1}]]"
                out[str(tag)] = self.item()
                flags = self.int()
                kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
            if kind != NILVALUE_SXP:
                raise RDataError(f"pairlist ends with type {kind}, expected NULL")
            return out
        if kind == CHARSXP:
            n = self.int()
            return None if n == -1 else self.take(n).decode("utf-8", errors="replace")  # -1: NA_character_
        if kind in (STRSXP, VECSXP):  # a character vector's elements are CHARSXP items
            values = [self.item() for _ in range(self.length())]
        elif kind in (INTSXP, LGLSXP):
            n = self.length()
            values = [None if v == NA_INTEGER else v for v in struct.unpack(f">{n}i", self.take(4 * n))]
        elif kind == REALSXP:
            n = self.length()
            values = list(struct.unpack(f">{n}d", self.take(8 * n)))
        else:
            raise RDataError(f"R object type {kind} is not supported by this reader (only NULL, symbols, pairlists, "
                             "character, logical, integer, double and list vectors)")
        attributes = self.item() if has_attr else {}
        return RObject(values, attributes or {})


def unserialize(data: bytes) -> Any:
    """The R object serialized (XDR, version 2 or 3) in ``data``."""
    reader = _Reader(data)
    reader.header()
    return reader.item()


_TYPED = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}


def _decompress_entry(blob: bytes) -> bytes:
    if len(blob) < 5:
        raise RDataError(f"lazy-load entry of {len(blob)} bytes is too short")
    size = struct.unpack(">I", blob[:4])[0]
    body = blob[4:]
    if body[:1] == b"\x78":  # compress = 1: a bare zlib stream
        out = zlib.decompress(body)
    elif body[:1] in _TYPED:  # compress = 2 or 3: a type byte, then the stream
        out = _TYPED[body[:1]](body[1:])
    else:
        raise RDataError(f"unknown lazy-load compression byte {body[:1]!r} (expected zlib, 'Z', '2', 'X' or '0')")
    if len(out) != size:
        raise RDataError(f"lazy-load entry decompressed to {len(out)} bytes, its header says {size}")
    return out


def read_lazyload(base: str | Path) -> dict[str, Any]:
    """Every object of the lazy-load database ``base.rdx`` / ``base.rdb`` (e.g. ``.../data/Rdata``), by name."""
    base = Path(base)
    rdx, rdb = base.with_suffix(".rdx"), base.with_suffix(".rdb")
    for path in (rdx, rdb):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (an R package's lazy-load database is a .rdx/.rdb pair)")
    raw = rdx.read_bytes()
    index = unserialize(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else _decompress_entry(raw))
    variables = index.value[0]
    blob = rdb.read_bytes()
    out = {}
    for name, pair in zip(variables.names, variables.value):
        offset, length = pair.value
        out[name] = unserialize(_decompress_entry(blob[offset : offset + length]))
    return out
