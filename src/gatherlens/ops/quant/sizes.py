"""The size of one block of each GGUF format this package reads: (weights, bytes).

    >>> SIZES["Q4_1"]                 # 32 weights in 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles
    (32, 20)
    >>> row_bytes("Q8_0", 576)        # one 576-wide row of SmolLM2's tied table
    612

The one home of these numbers (ggml's `ggml-common.h`; gguf's `GGML_QUANT_SIZES` agrees, tested);
LAYOUT names the bytes of a block in order (fields.py / kquants.py read them at these offsets, tested).
K-quants are super-blocks of 256 weights, so their rows must be a multiple of 256 wide.
"""
from __future__ import annotations

from gatherlens.errors import GatherValueError

__all__ = ["SIZES", "LAYOUT", "SCALE_FIELDS", "QTYPES", "QK_K", "row_bytes"]

QK_K = 256  # weights in one K-quant super-block

# the bytes of one block, in order: (field, bytes). d, m, dmin: fp16; scales: K-quant sub-block
# scales (and mins); qs, ql: low code bits; qh: high code bits
LAYOUT = {
    "Q8_0": (("d", 2), ("qs", 32)),
    "Q4_0": (("d", 2), ("qs", 16)),
    "Q4_1": (("d", 2), ("m", 2), ("qs", 16)),
    "Q5_0": (("d", 2), ("qh", 4), ("qs", 16)),
    "Q5_1": (("d", 2), ("m", 2), ("qh", 4), ("qs", 16)),
    "Q4_K": (("d", 2), ("dmin", 2), ("scales", 12), ("qs", QK_K // 2)),
    "Q6_K": (("ql", QK_K // 2), ("qh", QK_K // 4), ("scales", QK_K // 16), ("d", 2)),
}
SCALE_FIELDS = ("d", "m", "dmin", "scales")  # the fields that scale and shift codes; the rest are codes
SIZES = {q: (QK_K if q.endswith("_K") else 32, sum(n for _, n in fields)) for q, fields in LAYOUT.items()}
QTYPES = tuple(SIZES)


def row_bytes(qtype: str, dim: int) -> int:
    """Bytes of one `dim`-wide row in `qtype`; `dim` must be a whole number of blocks."""
    if qtype not in SIZES:
        raise GatherValueError(f"qtype must be one of {', '.join(map(repr, QTYPES))}, got {qtype!r}")
    elems, nbytes = SIZES[qtype]
    if dim % elems:
        raise GatherValueError(f"a {qtype} row is a whole number of {elems}-weight blocks; "
                               f"dim {dim} is not a multiple of {elems}")
    return dim // elems * nbytes
