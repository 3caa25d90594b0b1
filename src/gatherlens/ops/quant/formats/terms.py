"""One block of a quantized row written out: its codes, its scale and min, and the values they make.

    >>> raw = QuantizedTable.from_gguf(path, "token_embd.weight").raw     # Q8_0 rows of blocks
    >>> terms = block_terms(raw[42], "Q8_0", block=3)                     # weights 96..127 of row 42
    >>> terms.formula, terms.codes.shape, terms.values().shape
    ('q·d', torch.Size([32]), torch.Size([32]))

Every value of a block is `w = (q - offset) * scale + shift`, in float32, in that order:
legacy formats have one fp16 scale `d` per 32 weights (and Q4_1 / Q5_1 a min `m` as the shift);
K-quants have one per sub-block, `d * sc` (Q4_K, Q5_K: 8 sub-blocks of 32, shift `-(dmin * m)`; Q6_K,
Q2_K: 16 of 16; Q3_K: `d * (sc - 32)`, 16 of 16). IQ4 codes stand for codebook values: `levels` holds
`book[q]` and w = book[q] * scale (IQ4_XS: `d * (ls - 32)` per sub-block of 32). A plain float (F32,
F16, BF16) is a block of one weight: its code is the stored bits, its level the value, its scale 1.
`values()` is bit-equal to the same weights of `dequantize_rows` (tested), so a picture
drawn from these terms shows what the gather returned. `block_terms` (registry.py) checks `block`
and calls the format's own `*_terms(row, block)` here, the `terms` of its record.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.ops.quant.formats.fields import q4_0_fields, q4_1_fields, q5_0_fields, q5_1_fields, q8_0_fields
from gatherlens.ops.quant.formats.floats import float_values
from gatherlens.ops.quant.formats.iquants import book_values, iq4_nl_fields, iq4_xs_fields
from gatherlens.ops.quant.formats.kquants import q2_k_fields, q3_k_fields, q4_k_fields, q5_k_fields, q6_k_fields
from gatherlens.ops.quant.formats.layout import LAYOUTS

__all__ = ["BlockTerms", "groups", "q8_0_terms", "q4_0_terms", "q4_1_terms", "q5_0_terms",
           "q5_1_terms", "q4_k_terms", "q6_k_terms", "f32_terms", "f16_terms", "bf16_terms", "q2_k_terms",
           "q3_k_terms", "q5_k_terms", "iq4_nl_terms", "iq4_xs_terms"]


@dataclass(frozen=True)
class BlockTerms:
    """Block `block` of a row (weights start .. start + len(codes)): w = (q - offset) * scale + shift."""

    qtype: str
    block: int
    start: int
    codes: torch.Tensor     # (n,) int64: the codes as stored (Q6_K: 0..63; Q8_0: -128..127; floats: the bits)
    offset: int             # subtracted from every code
    scale: float            # a float32 value: d, or d·sc for K-quants (scale_name says which); floats: 1.0
    shift: float | None     # a float32 value: m (Q4_1, Q5_1), -(dmin·m) (Q4_K, Q5_K, Q2_K); else None
    halves: dict            # the fp16 fields behind scale and shift: name -> (value, "0xhhhh")
    subscales: dict         # K-quants: the sub-block's integer scale (and min): {"sc": 37, "m": 12}; IQ4_XS {"ls"}
    raw: torch.Tensor       # (block_bytes,) uint8: the bytes of the (super-)block holding these weights
    levels: torch.Tensor | None = None  # (n,) float32 the codes stand for: IQ4 book[q], a float's value; else q - offset
    scale_name: str = "d"  # how `scale` is made from the fields, as the picture writes it

    @property
    def plain(self) -> bool:
        """A plain float (F32, F16, BF16): the code is the stored value's bits."""
        return LAYOUTS[self.qtype].fields[0].kind == "value"

    @property
    def formula(self) -> str:
        return LAYOUTS[self.qtype].formula

    @property
    def bits(self) -> int:
        return LAYOUTS[self.qtype].bits

    def values(self) -> torch.Tensor:
        """(n,) float32: the block's weights, computed as ggml does (product, then the shift)."""
        level = self.codes.float() - self.offset if self.levels is None else self.levels  # (n,)
        scaled = level * torch.tensor(self.scale)  # (n,)
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
    return _k_min_terms("Q4_K", q4_k_fields(row.reshape(1, -1)), row, block)


def q6_k_terms(row: torch.Tensor, block: int) -> BlockTerms:
    q, scales, d = q6_k_fields(row.reshape(1, -1))  # (1, nb*256) in -32..31, (1, nb, 16), (1, nb)
    layout = LAYOUTS["Q6_K"]
    n = layout.group
    sup, sub = divmod(block, layout.weights // n)
    sc = scales[0, sup, sub]
    scale = float(d[0, sup].float() * sc.float())  # float32 d·sc
    codes = q[0, n * block:n * block + n].long() + layout.code_offset  # (16,): as stored, 0..63
    return BlockTerms("Q6_K", block, n * block, codes, layout.code_offset, scale, None, {"d": _half(d[0, sup])},
                      {"sc": int(sc)}, _block_bytes(row, "Q6_K", block), scale_name="d·sc")


def _sub_block(qtype: str, block: int) -> tuple[int, int, int]:
    """(super-block, sub-block within it, weights of a sub-block) of K-quant / IQ4_XS scale group `block`."""
    layout = LAYOUTS[qtype]
    return (*divmod(block, layout.weights // layout.group), layout.group)


def _plain(qtype: str, row: torch.Tensor, block: int) -> BlockTerms:
    """Weight `block` of a row of F32 / F16 / BF16 values: code = its bits, level = its value, scale 1."""
    value = float_values(row.reshape(1, -1), qtype)[0, block:block + 1]  # (1,)
    bits = value.view(torch.int32 if value.element_size() == 4 else torch.int16).long()  # (1,)
    bits = bits & ((1 << 8 * value.element_size()) - 1)  # (1,): unsigned
    return BlockTerms(qtype, block, block, bits, 0, 1.0, None, {}, {}, _block_bytes(row, qtype, block),
                      levels=value.float(), scale_name="1")


def f32_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _plain("F32", row, block)


def f16_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _plain("F16", row, block)


def bf16_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _plain("BF16", row, block)


def _k_min_terms(qtype: str, fields: tuple, row: torch.Tensor, block: int) -> BlockTerms:
    """A Q2_K / Q5_K sub-block's terms from (q, d, dmin, scales, mins): w = (d·sc)·q − dmin·m."""
    q, d, dmin, scales, mins = fields  # (1, nb*256), (1, nb) x2, (1, nb, S) x2
    sup, sub, n = _sub_block(qtype, block)
    sc, m = scales[0, sup, sub], mins[0, sup, sub]
    scale = float(d[0, sup].float() * sc.float())  # float32 d·sc, as dequantize.py rounds it
    shift = -float(dmin[0, sup].float() * m.float())  # -(dmin·m): negation is exact
    halves = {"d": _half(d[0, sup]), "dmin": _half(dmin[0, sup])}
    return BlockTerms(qtype, block, n * block, q[0, n * block:n * block + n].long(), 0, scale, shift, halves,
                      {"sc": int(sc), "m": int(m)}, _block_bytes(row, qtype, block), scale_name="d·sc")


def q2_k_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _k_min_terms("Q2_K", q2_k_fields(row.reshape(1, -1)), row, block)


def q5_k_terms(row: torch.Tensor, block: int) -> BlockTerms:
    return _k_min_terms("Q5_K", q5_k_fields(row.reshape(1, -1)), row, block)


def q3_k_terms(row: torch.Tensor, block: int) -> BlockTerms:
    q, scales, d = q3_k_fields(row.reshape(1, -1))  # (1, nb*256) codes 0..7, (1, nb, 16) 0..63, (1, nb)
    sup, sub, n = _sub_block("Q3_K", block)
    sc = scales[0, sup, sub]
    scale = float(d[0, sup].float() * (sc.float() - 32))  # float32 d·(sc − 32)
    return BlockTerms("Q3_K", block, n * block, q[0, n * block:n * block + n].long(), LAYOUTS["Q3_K"].code_offset,
                      scale, None, {"d": _half(d[0, sup])}, {"sc": int(sc)}, _block_bytes(row, "Q3_K", block),
                      scale_name="d·(sc − 32)")


def iq4_nl_terms(row: torch.Tensor, block: int) -> BlockTerms:
    q, d = iq4_nl_fields(row.reshape(1, -1))  # (1, nb*32) codes 0..15, (1, nb)
    n = LAYOUTS["IQ4_NL"].group
    codes = q[0, n * block:n * block + n]  # (32,)
    half = _half(d[0, block])
    return BlockTerms("IQ4_NL", block, n * block, codes.long(), 0, half[0], None, {"d": half}, {},
                      _block_bytes(row, "IQ4_NL", block), levels=book_values(codes, "IQ4_NL"), scale_name="d")


def iq4_xs_terms(row: torch.Tensor, block: int) -> BlockTerms:
    q, d, scales = iq4_xs_fields(row.reshape(1, -1))  # (1, nb*256) codes 0..15, (1, nb), (1, nb, 8) 0..63
    sup, sub, n = _sub_block("IQ4_XS", block)
    ls = scales[0, sup, sub]
    scale = float(d[0, sup].float() * (ls.float() - 32))  # float32 d·(ls − 32)
    codes = q[0, n * block:n * block + n]  # (32,)
    return BlockTerms("IQ4_XS", block, n * block, codes.long(), 0, scale, None, {"d": _half(d[0, sup])},
                      {"ls": int(ls)}, _block_bytes(row, "IQ4_XS", block), levels=book_values(codes, "IQ4_XS"),
                      scale_name="d·(ls − 32)")
