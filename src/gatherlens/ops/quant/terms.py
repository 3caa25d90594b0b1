"""One block of a quantized row written out: its codes, its scale and min, and the values they make.

    >>> raw = QuantizedTable.from_gguf(path, "token_embd.weight").raw     # Q8_0 rows of blocks
    >>> terms = block_terms(raw[42], "Q8_0", block=3)                     # weights 96..127 of row 42
    >>> terms.formula, terms.codes.shape, terms.values().shape
    ('q·d', torch.Size([32]), torch.Size([32]))

Every value of a block is `w = (q - offset) * scale + shift`, in float32, in that order:
legacy formats have one fp16 scale `d` per 32 weights (and Q4_1 / Q5_1 a min `m` as the shift);
K-quants have one per sub-block, `d * sc` (Q4_K: 8 sub-blocks of 32, shift `-(dmin * m)`; Q6_K: 16
of 16). `values()` is bit-equal to the same weights of `dequantize_rows` (tested), so a picture
drawn from these terms shows what the gather returned. `block_terms` (registry.py) checks `block`
and calls the format's own `*_terms(row, block)` here, the `terms` of its record.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.ops.quant.fields import q4_0_fields, q4_1_fields, q5_0_fields, q5_1_fields, q8_0_fields
from gatherlens.ops.quant.kquants import q4_k_fields, q6_k_fields
from gatherlens.ops.quant.layout import LAYOUTS

__all__ = ["BlockTerms", "groups", "GROUP", "BITS", "q8_0_terms", "q4_0_terms", "q4_1_terms", "q5_0_terms",
           "q5_1_terms", "q4_k_terms", "q6_k_terms"]

GROUP = {q: layout.group for q, layout in LAYOUTS.items()}  # weights per scale
BITS = {q: layout.bits for q, layout in LAYOUTS.items()}  # bits of one code


@dataclass(frozen=True)
class BlockTerms:
    """Block `block` of a row (weights start .. start + len(codes)): w = (q - offset) * scale + shift."""

    qtype: str
    block: int
    start: int
    codes: torch.Tensor     # (n,) int64: the codes as stored (Q6_K: 0..63; Q8_0: -128..127)
    offset: int             # subtracted from every code
    scale: float            # a float32 value: d, or d·sc for K-quants
    shift: float | None     # a float32 value: m (Q4_1, Q5_1), -(dmin·m) (Q4_K); else None
    halves: dict            # the fp16 fields behind scale and shift: name -> (value, "0xhhhh")
    subscales: dict         # K-quants: the sub-block's integer scale (and min): {"sc": 37, "m": 12}
    raw: torch.Tensor       # (block_bytes,) uint8: the bytes of the (super-)block holding these weights

    @property
    def formula(self) -> str:
        return LAYOUTS[self.qtype].formula

    @property
    def bits(self) -> int:
        return LAYOUTS[self.qtype].bits

    def values(self) -> torch.Tensor:
        """(n,) float32: the block's weights, computed as ggml does (product, then the shift)."""
        scaled = (self.codes.float() - self.offset) * torch.tensor(self.scale)  # (n,)
        return scaled if self.shift is None else scaled + torch.tensor(self.shift)  # (n,)


def groups(qtype: str, row_bytes: int) -> int:
    """How many scale groups (blocks, or K-quant sub-blocks) a row of `row_bytes` bytes holds."""
    layout = LAYOUTS[qtype]
    return row_bytes // layout.block_bytes * layout.weights // layout.group


def _half(x: torch.Tensor) -> tuple[float, str]:
    """A 0-dim fp16 -> (its value, its bits as '0xhhhh')."""
    return float(x), f"0x{int(x.view(torch.int16)) & 0xFFFF:04x}"


def _block_bytes(row: torch.Tensor, qtype: str, block: int) -> torch.Tensor:
    """(block_bytes,) uint8: the (super-)block of `row` that scale group `block` lies in."""
    layout = LAYOUTS[qtype]
    first = block * layout.group // layout.weights * layout.block_bytes
    return row.reshape(-1)[first:first + layout.block_bytes].clone()  # (block_bytes,)


def _legacy(qtype: str, fields: tuple, row: torch.Tensor, block: int) -> BlockTerms:
    """A 32-weight block's terms from its format's per-row fields (q, d) or (q, d, m)."""
    start = block * LAYOUTS[qtype].weights
    halves = {"d": _half(fields[1][0, block])}
    if len(fields) == 3:
        halves["m"] = _half(fields[2][0, block])
    shift = halves["m"][0] if "m" in halves else None
    codes = fields[0][0, start:start + LAYOUTS[qtype].weights].long()  # (32,)
    return BlockTerms(qtype, block, start, codes, LAYOUTS[qtype].code_offset, halves["d"][0], shift, halves, {},
                      _block_bytes(row, qtype, block))


# one function per format, (row (row_bytes,) uint8, block) -> BlockTerms: the `terms` of its record in
# registry.py, whose `block_terms(row, qtype, block)` checks `block` and calls it
def q8_0_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _legacy("Q8_0", q8_0_fields(row.reshape(1, -1)), row, block)


def q4_0_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _legacy("Q4_0", q4_0_fields(row.reshape(1, -1)), row, block)


def q4_1_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _legacy("Q4_1", q4_1_fields(row.reshape(1, -1)), row, block)


def q5_0_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _legacy("Q5_0", q5_0_fields(row.reshape(1, -1)), row, block)


def q5_1_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _legacy("Q5_1", q5_1_fields(row.reshape(1, -1)), row, block)


def q4_k_terms(row: torch.Tensor, block: int) -> BlockTerms:
    q, d, dmin, scales, mins = q4_k_fields(row.reshape(1, -1))  # (1, nb*256), (1, nb) x2, (1, nb, 8) x2
    layout = LAYOUTS["Q4_K"]
    n = layout.group
    sup, sub = divmod(block, layout.weights // n)
    sc, m = scales[0, sup, sub], mins[0, sup, sub]
    scale = float(d[0, sup].float() * sc.float())  # float32 d·sc, as formats.py rounds it
    shift = -float(dmin[0, sup].float() * m.float())  # -(dmin·m): negation is exact
    halves = {"d": _half(d[0, sup]), "dmin": _half(dmin[0, sup])}
    return BlockTerms("Q4_K", block, n * block, q[0, n * block:n * block + n].long(), layout.code_offset, scale, shift,
                      halves, {"sc": int(sc), "m": int(m)}, _block_bytes(row, "Q4_K", block))


def q6_k_terms(row: torch.Tensor, block: int) -> BlockTerms:
    q, scales, d = q6_k_fields(row.reshape(1, -1))  # (1, nb*256) in -32..31, (1, nb, 16), (1, nb)
    layout = LAYOUTS["Q6_K"]
    n = layout.group
    sup, sub = divmod(block, layout.weights // n)
    sc = scales[0, sup, sub]
    scale = float(d[0, sup].float() * sc.float())  # float32 d·sc
    codes = q[0, n * block:n * block + n].long() + layout.code_offset  # (16,): as stored, 0..63
    return BlockTerms("Q6_K", block, n * block, codes, layout.code_offset, scale, None, {"d": _half(d[0, sup])},
                      {"sc": int(sc)}, _block_bytes(row, "Q6_K", block))
