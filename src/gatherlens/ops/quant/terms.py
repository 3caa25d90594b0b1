"""One block of a quantized row written out: its codes, its scale and min, and the values they make.

    >>> raw = QuantizedTable.from_gguf(path, "token_embd.weight").raw     # Q8_0 rows of blocks
    >>> terms = block_terms(raw[42], "Q8_0", block=3)                     # weights 96..127 of row 42
    >>> terms.formula, terms.codes.shape, terms.values().shape
    ('q·d', torch.Size([32]), torch.Size([32]))

Every value of a block is `w = (q - offset) * scale + shift`, in float32, in that order:
legacy formats have one fp16 scale `d` per 32 weights (and Q4_1 / Q5_1 a min `m` as the shift);
K-quants have one per sub-block, `d * sc` (Q4_K: 8 sub-blocks of 32, shift `-(dmin * m)`; Q6_K: 16
of 16). `values()` is bit-equal to the same weights of `dequantize_rows` (tested), so a picture
drawn from these terms shows what the gather returned.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.errors import GatherIndexError
from gatherlens.ops.quant.fields import q4_0_fields, q4_1_fields, q5_0_fields, q5_1_fields, q8_0_fields
from gatherlens.ops.quant.kquants import q4_k_fields, q6_k_fields
from gatherlens.ops.quant.sizes import SIZES

__all__ = ["BlockTerms", "block_terms", "groups", "GROUP", "BITS"]

GROUP = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q4_K": 32, "Q6_K": 16}  # weights per scale
BITS = {"Q8_0": 8, "Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q4_K": 4, "Q6_K": 6}  # bits of one code
_OFFSET = {"Q4_0": 8, "Q5_0": 16, "Q6_K": 32}
_FORMULA = {"Q8_0": "q·d", "Q4_0": "(q − 8)·d", "Q4_1": "q·d + m", "Q5_0": "(q − 16)·d", "Q5_1": "q·d + m",
            "Q4_K": "q·(d·sc) − dmin·m", "Q6_K": "(q − 32)·(d·sc)"}


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
        return _FORMULA[self.qtype]

    @property
    def bits(self) -> int:
        return BITS[self.qtype]

    def values(self) -> torch.Tensor:
        """(n,) float32: the block's weights, computed as ggml does (product, then the shift)."""
        scaled = (self.codes.float() - self.offset) * torch.tensor(self.scale)  # (n,)
        return scaled if self.shift is None else scaled + torch.tensor(self.shift)  # (n,)


def groups(qtype: str, row_bytes: int) -> int:
    """How many scale groups (blocks, or K-quant sub-blocks) a row of `row_bytes` bytes holds."""
    elems, nbytes = SIZES[qtype]
    return row_bytes // nbytes * elems // GROUP[qtype]


def _half(x: torch.Tensor) -> tuple[float, str]:
    """A 0-dim fp16 -> (its value, its bits as '0xhhhh')."""
    return float(x), f"0x{int(x.view(torch.int16)) & 0xFFFF:04x}"


def block_terms(row: torch.Tensor, qtype: str, block: int) -> BlockTerms:
    """The terms of block `block` (of GROUP[qtype] weights) of one row of blocks (row_bytes,) uint8."""
    count = groups(qtype, row.numel())
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < count:
        raise GatherIndexError(f"block {block!r} is outside the row's {count} blocks of {GROUP[qtype]} "
                               f"weights [0, {count})")
    raw = row.reshape(1, -1)  # (1, row_bytes)
    if qtype in _K_TERMS:
        return _K_TERMS[qtype](raw, block, _block_bytes(row, qtype, block))
    fields = _LEGACY[qtype](raw)  # (q, d) or (q, d, m), per row
    start = block * 32
    halves = {"d": _half(fields[1][0, block])}
    if len(fields) == 3:
        halves["m"] = _half(fields[2][0, block])
    shift = halves["m"][0] if "m" in halves else None
    return BlockTerms(qtype, block, start, fields[0][0, start:start + 32].long(), _OFFSET.get(qtype, 0),
                      halves["d"][0], shift, halves, {}, _block_bytes(row, qtype, block))


def _block_bytes(row: torch.Tensor, qtype: str, block: int) -> torch.Tensor:
    """(block_bytes,) uint8: the (super-)block of `row` that scale group `block` lies in."""
    elems, nbytes = SIZES[qtype]
    first = block * GROUP[qtype] // elems * nbytes
    return row.reshape(-1)[first:first + nbytes].clone()  # (block_bytes,)


def _q4_k_terms(raw: torch.Tensor, block: int, stored: torch.Tensor) -> BlockTerms:
    q, d, dmin, scales, mins = q4_k_fields(raw)  # (1, nb*256), (1, nb) x2, (1, nb, 8) x2
    sup, sub = divmod(block, 8)
    sc, m = scales[0, sup, sub], mins[0, sup, sub]
    scale = float(d[0, sup].float() * sc.float())  # float32 d·sc, as formats.py rounds it
    shift = -float(dmin[0, sup].float() * m.float())  # -(dmin·m): negation is exact
    halves = {"d": _half(d[0, sup]), "dmin": _half(dmin[0, sup])}
    return BlockTerms("Q4_K", block, 32 * block, q[0, 32 * block:32 * block + 32].long(), 0, scale, shift,
                      halves, {"sc": int(sc), "m": int(m)}, stored)


def _q6_k_terms(raw: torch.Tensor, block: int, stored: torch.Tensor) -> BlockTerms:
    q, scales, d = q6_k_fields(raw)  # (1, nb*256) in -32..31, (1, nb, 16), (1, nb)
    sup, sub = divmod(block, 16)
    sc = scales[0, sup, sub]
    scale = float(d[0, sup].float() * sc.float())  # float32 d·sc
    codes = q[0, 16 * block:16 * block + 16].long() + 32  # (16,): as stored, 0..63
    return BlockTerms("Q6_K", block, 16 * block, codes, 32, scale, None, {"d": _half(d[0, sup])},
                      {"sc": int(sc)}, stored)


_LEGACY = {"Q8_0": q8_0_fields, "Q4_0": q4_0_fields, "Q4_1": q4_1_fields, "Q5_0": q5_0_fields,
           "Q5_1": q5_1_fields}
_K_TERMS = {"Q4_K": _q4_k_terms, "Q6_K": _q6_k_terms}
