"""A small palette PNG from rows of colour indices, with nothing but zlib (for maps drawn tiny).

    >>> data = palette_png([[0, 1], [1, 0]], ["#ffffff", "#2154a0"])
    >>> data[:8]
    b'\\x89PNG\\r\\n\\x1a\\n'
    >>> data_uri(data)[:22]
    'data:image/png;base64,'

The head gallery (render/gallery.py) keeps every head's map in one such image: a 30 x 9 grid of
16 x 16 maps is one 480 x 144 picture of a few kilobytes, where SVG rectangles would take a
megabyte. The same pixels always give the same bytes (zlib level 9, no timestamps).
"""
from __future__ import annotations

import base64
import struct
import zlib

from gatherlens.errors import GatherValueError

__all__ = ["palette_png", "data_uri"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def palette_png(rows: list[list[int]], palette: list[str]) -> bytes:
    """An 8-bit palette PNG: rows[y][x] is an index into `palette` ("#rrggbb" colours, at most 256)."""
    if not rows or not rows[0]:
        raise GatherValueError(f"rows must hold at least one pixel, got {len(rows)} rows")
    if not 1 <= len(palette) <= 256:
        raise GatherValueError(f"palette has {len(palette)} colours; the valid range is [1, 256]")
    width = len(rows[0])
    for y, row in enumerate(rows):
        if len(row) != width or min(row) < 0 or max(row) >= len(palette):
            raise GatherValueError(f"rows[{y}] must hold {width} indices in [0, {len(palette) - 1}], got "
                                   f"{len(row)} in [{min(row)}, {max(row)}]")
    raw = b"".join(b"\x00" + bytes(row) for row in rows)           # filter 0 (none) per row
    header = struct.pack(">IIBBBBB", width, len(rows), 8, 3, 0, 0, 0)
    colours = b"".join(bytes.fromhex(c.lstrip("#")) for c in palette)
    return (_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"PLTE", colours)
            + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b""))


def data_uri(png: bytes) -> str:
    """The PNG as a data: address (the page's policy allows images only from data:)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
