"""Read an R package's lazy-load data (data/Rdata.rdx + Rdata.rdb) without R.

    >>> books = read_lazyload("/usr/lib/R/site-library/janeaustenr/data")
    >>> sorted(books)[:2], books["emma"][:2]
    (['austen_books', 'emma'], ['EMMA', ''])

Format (R Internals, "Serialization Formats" and "Lazy loading"): the .rdx file is a gzip'd
serialized list(variables = list(name = c(offset, length)), compressed = ...); each object sits
in the .rdb file at `offset`, `length` bytes: a 4-byte big-endian uncompressed size then zlib
data (compression type 1; types 2/3 start with one byte "2" (bzip2) or "Z" (xz)). Objects are in
XDR serialization (format "X"). Only what data sets use is decoded: NULL, logical, integer, double,
character vectors, lists, pairlists (attributes), symbols, references, compact ALTREP integer
sequences. Attributes are read and dropped, except `names` on a list, which makes it a dict.
Written here (about 100 lines) instead of adding a dependency: the `rdata` package on PyPI reads
.rda/.rds files but not the lazy-load database R packages install.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import math
import struct
import zlib
from pathlib import Path

from gatherlens.errors import GatherValueError

__all__ = ["read_lazyload", "unserialize"]

_NIL, _REF, _GLOBAL, _EMPTY, _BASE, _MISSING, _BASENS, _UNBOUND = 254, 255, 253, 242, 241, 251, 247, 252
_SPECIAL = {_NIL, _GLOBAL, _EMPTY, _BASE, _MISSING, _BASENS, _UNBOUND, 250, 249, 248, 246, 245, 244, 243}


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def length(self) -> int:
        n = self.int()
        if n == -1:  # long vector: two more ints
            hi, lo = self.int(), self.int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n

    def bytes(self, n: int) -> bytes:
        b = self.data[self.pos:self.pos + n]
        if len(b) != n:
            raise GatherValueError(f"R data: truncated at byte {self.pos} (wanted {n} more bytes)")
        self.pos += n
        return b

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in _SPECIAL:
            return None
        if kind == _REF:
            i = flags >> 8 or self.int()
            return self.refs[i - 1]
        if kind == 1:  # SYMSXP: a CHARSXP, remembered for later references
            name = self.item()
            self.refs.append(name)
            return name
        if kind == 2:  # LISTSXP (pairlist): attr?, tag?, car, cdr
            out = {}
            while kind == 2:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out[tag if tag is not None else len(out)] = self.item()
                flags = self.int()
                kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
            if kind != _NIL:
                raise GatherValueError(f"R data: unexpected pairlist end of type {kind} at byte {self.pos}")
            return out
        if kind == 9:  # CHARSXP
            n = self.int()
            return None if n == -1 else self.bytes(n).decode("utf-8", errors="replace")
        if kind == 238:  # ALTREP: class info, state, attributes
            info, state = self.item(), self.item()
            self.item()
            if isinstance(info, dict) and info and list(info.values())[0] == "compact_intseq":
                n, start, step = (int(x) for x in state)
                return list(range(start, start + n * step, step))
            return state
        n = self.length()
        if kind in (10, 13):  # logical, integer (NA = INT_MIN)
            vals = struct.unpack_from(f">{n}i", self.data, self.pos)
            self.pos += 4 * n
            value = [None if v == -(2 ** 31) else v for v in vals]
        elif kind == 14:  # double
            vals = struct.unpack_from(f">{n}d", self.data, self.pos)
            self.pos += 8 * n
            value = [None if math.isnan(v) else v for v in vals]
        elif kind in (16, 19, 20):  # character vector, list, expression
            value = [self.item() for _ in range(n)]
        else:
            raise GatherValueError(f"R data: object type {kind} at byte {self.pos} is not supported")
        if has_attr:
            attrs = self.item()
            names = attrs.get("names") if isinstance(attrs, dict) else None
            if kind == 19 and isinstance(names, list) and len(names) == len(value):
                value = dict(zip(names, value))
        return value


def unserialize(data: bytes):
    """An R object from its XDR serialization (the bytes of saveRDS without compression)."""
    if data[:2] != b"X\n":
        raise GatherValueError(f"R data: format {data[:2]!r} is not XDR ('X\\n'); only XDR is supported")
    r = _Reader(data)
    r.pos = 2
    version = r.int()
    r.int(), r.int()  # writer and minimal reader versions
    if version == 3:
        r.bytes(r.int())  # native encoding
    return r.item()


def _inflate(block: bytes) -> bytes:
    size = struct.unpack(">I", block[:4])[0]
    body = block[4:]
    if body[:1] == b"2":
        out = bz2.decompress(body[1:])
    elif body[:1] == b"Z":
        out = lzma.decompress(body[1:])
    elif body[:1] == b"0":
        out = body[1:]
    else:
        out = zlib.decompress(body)
    if len(out) != size:
        raise GatherValueError(f"R data: block inflated to {len(out)} bytes, its header says {size}")
    return out


def read_lazyload(folder: str | Path, names: list[str] | None = None) -> dict:
    """name -> Python value for the objects of an R lazy-load database (Rdata.rdx/.rdb)."""
    folder = Path(folder)
    rdx, rdb = folder / "Rdata.rdx", folder / "Rdata.rdb"
    if not rdx.is_file() or not rdb.is_file():
        raise GatherValueError(f"R data folder {str(folder)!r} has no Rdata.rdx / Rdata.rdb")
    raw = rdx.read_bytes()
    index = unserialize(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:]))
    variables = index["variables"]
    blob = rdb.read_bytes()
    out = {}
    for name, (offset, length) in variables.items():
        if names is None or name in names:
            out[name] = unserialize(_inflate(blob[int(offset):int(offset) + int(length)]))
    return out
