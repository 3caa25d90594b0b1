"""The size of one block of each GGUF format this package reads: (weights, bytes).

    >>> SIZES["Q4_1"]                 # 32 weights in 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles
    (32, 20)
    >>> row_bytes("Q8_0", 576)        # one 576-wide row of SmolLM2's tied table
    612

Derived from the records of layout.py (the one home of these numbers; gguf's `GGML_QUANT_SIZES`
agrees, tested).
K-quants are super-blocks of 256 weights, so their rows must be a multiple of 256 wide.
"""
from __future__ import annotations

from gatherlens.errors import GatherValueError
from gatherlens.ops.quant.formats.layout import LAYOUTS, QK_K, SCALE_KINDS

__all__ = ["SIZES", "SCALE_FIELDS", "QTYPES", "QK_K", "row_bytes"]

QTYPES = tuple(LAYOUTS)
SIZES = {q: (layout.weights, layout.block_bytes) for q, layout in LAYOUTS.items()}
# the fields that scale and shift codes (d, m, dmin, scales); the rest are codes
SCALE_FIELDS = tuple(dict.fromkeys(f.name for layout in LAYOUTS.values() for f in layout.fields
                                   if f.kind in SCALE_KINDS))


def row_bytes(qtype: str, dim: int) -> int:
    """Bytes of one `dim`-wide row in `qtype`; `dim` must be a whole number of blocks."""
    if qtype not in SIZES:
        raise GatherValueError(f"qtype must be one of {', '.join(map(repr, QTYPES))}, got {qtype!r}")
    elems, nbytes = SIZES[qtype]
    if dim % elems:
        raise GatherValueError(f"a {qtype} row is a whole number of {elems}-weight blocks; "
                               f"dim {dim} is not a multiple of {elems}")
    return dim // elems * nbytes
