"""The fields of GGUF's 32-weight blocks, unpacked from raw bytes: codes, scales and mins.

    >>> raw = torch.zeros(3, 2 * 20, dtype=torch.uint8)        # (R, nb*20): 3 rows of 2 Q4_1 blocks
    >>> q, d, m = q4_1_fields(raw)
    >>> q.shape, q.dtype, d.shape, d.dtype                      # codes in element order, fp16 scales
    (torch.Size([3, 64]), torch.uint8, torch.Size([3, 2]), torch.float16)

Rows of blocks are (R, nb * block_bytes) uint8, as GGUFReader maps them. `*_fields` give every field
per row in element order, so `q[r, 32 * b + j]` is element j of block b of row r; `*_parts` give the
same fields per block, (R, nb, 32) codes and (R, nb, 1) scales, as views where the bytes allow (what
dequantize.py computes with). The layouts (ggml's `ggml-common.h`, little-endian, scales IEEE half):

- Q8_0, 34 bytes: `d` (fp16), `qs[32]` (int8).                              w = qs * d
- Q4_0, 18 bytes: `d`, `qs[16]`: low nibbles are elements 0-15, high 16-31.  w = (q - 8) * d
- Q4_1, 20 bytes: `d`, `m` (fp16 min), `qs[16]` as Q4_0.                    w = q * d + m
- Q5_0, 22 bytes: `d`, `qh[4]` (bit j of the little-endian uint32 is bit 4 of element j), `qs[16]`.
                                                                             w = (q - 16) * d
- Q5_1, 24 bytes: `d`, `m`, `qh[4]`, `qs[16]`.                              w = q * d + m

Nibble order: byte j holds element j (low nibble) and element j + 16 (high nibble), not j, j + 1.
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.layout import LAYOUTS

__all__ = ["as_blocks", "half_at", "field_bytes", "half_field", "nibbles", "high_bits", "q8_0_parts", "q4_0_parts",
           "q4_1_parts", "q5_0_parts", "q5_1_parts", "q4_0_fields", "q4_1_fields", "q5_0_fields", "q5_1_fields",
           "q8_0_fields"]


def as_blocks(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """(R, nb * block_bytes) uint8 rows of `qtype` -> (R, nb, block_bytes), a view."""
    rows, width = raw.shape
    nbytes = LAYOUTS[qtype].block_bytes
    return raw.view(rows, width // nbytes, nbytes)  # (R, nb, bytes)


def half_at(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 at bytes [offset, offset + 2) of every block: (R, nb, bytes) -> (R, nb, 1), a view
    (a copy only when the bytes start at an odd address, e.g. a table sliced by one byte)."""
    pair = blocks.narrow(-1, offset, 2)  # (R, nb, 2)
    if pair.storage_offset() % 2:
        pair = pair.contiguous()
    return pair.view(torch.float16)  # (R, nb, 1)


def field_bytes(blocks: torch.Tensor, qtype: str, name: str) -> torch.Tensor:
    """The bytes of field `name` of every `qtype` block: (R, nb, bytes) -> (R, nb, size), a view."""
    field = LAYOUTS[qtype].field(name)
    return blocks.narrow(-1, field.offset, field.size)  # (R, nb, size)


def half_field(blocks: torch.Tensor, qtype: str, name: str) -> torch.Tensor:
    """The fp16 field `name` (d, m, dmin) of every `qtype` block: (R, nb, bytes) -> (R, nb, 1)."""
    return half_at(blocks, LAYOUTS[qtype].field(name).offset)  # (R, nb, 1)


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(R, nb, n) bytes -> (R, nb, 2n) 4-bit codes: the n low nibbles, then the n high ones."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # (R, nb, 2n)


def high_bits(qh: torch.Tensor) -> torch.Tensor:
    """(R, nb, 4) bytes of a little-endian uint32 -> (R, nb, 32) bits 0/1, bit j for element j."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)  # (8,)
    bits = (qh.unsqueeze(-1) >> shifts) & 1  # (R, nb, 4, 8): byte k, bit i -> element 8k + i
    return bits.flatten(-2)  # (R, nb, 32)


def _five_bits(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    """A Q5 block's codes: the qs nibbles, bit 4 from qh: (R, nb, bytes) -> (R, nb, 32) in 0..31."""
    high = high_bits(field_bytes(blocks, qtype, "qh"))  # (R, nb, 32) bits 0/1
    return nibbles(field_bytes(blocks, qtype, "qs")) | (high << 4)  # (R, nb, 32)


def q8_0_parts(raw: torch.Tensor):
    """Q8_0 -> (q: int8 (R, nb, 32), d: float16 (R, nb, 1)), both views of `raw`."""
    blocks = as_blocks(raw, "Q8_0")  # (R, nb, 34)
    return field_bytes(blocks, "Q8_0", "qs").view(torch.int8), half_field(blocks, "Q8_0", "d")


def q4_0_parts(raw: torch.Tensor):
    """Q4_0 -> (q: uint8 (R, nb, 32) codes 0..15, d: float16 (R, nb, 1))."""
    blocks = as_blocks(raw, "Q4_0")  # (R, nb, 18)
    return nibbles(field_bytes(blocks, "Q4_0", "qs")), half_field(blocks, "Q4_0", "d")


def q4_1_parts(raw: torch.Tensor):
    """Q4_1 -> (q: uint8 (R, nb, 32) codes 0..15, d, m: float16 (R, nb, 1))."""
    blocks = as_blocks(raw, "Q4_1")  # (R, nb, 20)
    d, m = half_field(blocks, "Q4_1", "d"), half_field(blocks, "Q4_1", "m")  # (R, nb, 1) each
    return nibbles(field_bytes(blocks, "Q4_1", "qs")), d, m


def q5_0_parts(raw: torch.Tensor):
    """Q5_0 -> (q: uint8 (R, nb, 32) codes 0..31, d: float16 (R, nb, 1))."""
    blocks = as_blocks(raw, "Q5_0")  # (R, nb, 22)
    return _five_bits(blocks, "Q5_0"), half_field(blocks, "Q5_0", "d")


def q5_1_parts(raw: torch.Tensor):
    """Q5_1 -> (q: uint8 (R, nb, 32) codes 0..31, d, m: float16 (R, nb, 1))."""
    blocks = as_blocks(raw, "Q5_1")  # (R, nb, 24)
    return _five_bits(blocks, "Q5_1"), half_field(blocks, "Q5_1", "d"), half_field(blocks, "Q5_1", "m")


def _per_row(codes: torch.Tensor, *scales: torch.Tensor):
    """(R, nb, 32) codes and (R, nb, 1) scales -> (R, nb*32) and (R, nb) each, contiguous."""
    return (codes.flatten(1), *(s.squeeze(-1).contiguous() for s in scales))  # (R, nb*32), (R, nb)...


def q8_0_fields(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 rows (R, nb*34) uint8 -> (q: int8 (R, nb*32), d: float16 (R, nb)); w = q * d."""
    return _per_row(*q8_0_parts(raw))


def q4_0_fields(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0 rows (R, nb*18) uint8 -> (q: uint8 (R, nb*32) codes 0..15, d: float16 (R, nb)); w = (q-8)*d."""
    return _per_row(*q4_0_parts(raw))


def q4_1_fields(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1 rows (R, nb*20) uint8 -> (q: uint8 (R, nb*32) codes 0..15 in element order,
    d: float16 (R, nb), m: float16 (R, nb)); w = q * d + m."""
    return _per_row(*q4_1_parts(raw))


def q5_0_fields(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q5_0 rows (R, nb*22) uint8 -> (q: uint8 (R, nb*32) codes 0..31, d: float16 (R, nb)); w = (q-16)*d."""
    return _per_row(*q5_0_parts(raw))


def q5_1_fields(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q5_1 rows (R, nb*24) uint8 -> (q: uint8 (R, nb*32) codes 0..31, d, m: float16 (R, nb)); w = q*d + m."""
    return _per_row(*q5_1_parts(raw))
