"""The fields of GGUF's IQ4 blocks, unpacked from raw bytes: 4-bit codes that index a codebook.

    >>> raw = torch.zeros(2, 2 * 18, dtype=torch.uint8)       # (R, nb*18): 2 rows of 2 IQ4_NL blocks
    >>> q, d = iq4_nl_fields(raw)
    >>> q.shape, d.shape                                       # codes 0..15 in element order, fp16 d
    (torch.Size([2, 64]), torch.Size([2, 2]))

A code q stands for the int8 `book[q]` (ggml's `kvalues_iq4nl`, layout.py's `IQ4_BOOK`, each record's
`codebook`), not for q itself. Layouts (ggml's `ggml-common.h`, `dequantize_row_iq4_nl` / `_iq4_xs`):

- IQ4_NL, 18 bytes: `d` (fp16), `qs[16]`, nibbles as Q4_0's (byte j: element j low, j + 16 high).
                                                                            w = d * book[q]
- IQ4_XS, 136 bytes (256 weights): `d`, `scales_h` (uint16: bits 2s, 2s + 1 are the top 2 bits of
  sub-block s's scale), `scales_l[4]` (nibble s % 2 of byte s // 2: its low 4 bits), `qs[128]`: sub-block
  s (32 weights) in bytes 16s .. 16s + 15, nibbles as IQ4_NL's.        w = (d * (ls - 32)) * book[q]
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.fields import as_blocks, field_bytes, half_field, nibbles
from gatherlens.ops.quant.formats.layout import LAYOUTS

__all__ = ["iq4_nl_parts", "iq4_xs_parts", "iq4_nl_fields", "iq4_xs_fields", "book_values"]


def book_values(q: torch.Tensor, qtype: str) -> torch.Tensor:
    """Codes (any shape) uint8 0..15 -> the float32 codebook values of `qtype`'s record (same shape)."""
    book = torch.tensor(LAYOUTS[qtype].codebook, dtype=torch.float32, device=q.device)  # (16,)
    return book.index_select(0, q.reshape(-1).int()).view(q.shape)  # (*q.shape,)


def iq4_nl_parts(raw: torch.Tensor):
    """IQ4_NL -> (q: uint8 (R, nb, 32) codes 0..15, d: float16 (R, nb, 1))."""
    blocks = as_blocks(raw, "IQ4_NL")  # (R, nb, 18)
    return nibbles(field_bytes(blocks, "IQ4_NL", "qs")), half_field(blocks, "IQ4_NL", "d")


def _xs_scales(blocks: torch.Tensor) -> torch.Tensor:
    """IQ4_XS's 8 sub-block scales (R, nb, 8) uint8 in 0..63 (w uses ls - 32)."""
    low = field_bytes(blocks, "IQ4_XS", "scales_l")  # (R, nb, 4): two 4-bit scales a byte
    low = torch.stack((low & 0x0F, low >> 4), dim=-1).flatten(-2)  # (R, nb, 8): s = 2 byte + nibble
    high = field_bytes(blocks, "IQ4_XS", "scales_h").unsqueeze(-1)  # (R, nb, 2, 1): the uint16, little-endian
    shifts = torch.arange(0, 8, 2, dtype=torch.uint8, device=blocks.device)  # (4,)
    high = ((high >> shifts) & 3).flatten(-2)  # (R, nb, 8): s = 4 byte + pair
    return low | (high << 4)  # (R, nb, 8)


def iq4_xs_parts(raw: torch.Tensor):
    """IQ4_XS -> (q: uint8 (R, nb, 8, 32) codes 0..15 by sub-block, d: float16 (R, nb, 1), scales: uint8
    (R, nb, 8) in 0..63)."""
    blocks = as_blocks(raw, "IQ4_XS")  # (R, nb, 136)
    q = nibbles(field_bytes(blocks, "IQ4_XS", "qs").unflatten(-1, (8, 16)))  # (R, nb, 8, 32)
    return q, half_field(blocks, "IQ4_XS", "d"), _xs_scales(blocks)


def iq4_nl_fields(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """IQ4_NL rows (R, nb*18) uint8 -> (q: uint8 (R, nb*32) codes 0..15, d: float16 (R, nb)); w = d * book[q]."""
    q, d = iq4_nl_parts(raw)
    return q.flatten(1), d.squeeze(-1).contiguous()


def iq4_xs_fields(raw: torch.Tensor):
    """IQ4_XS rows (R, nb*136) uint8 -> (q: uint8 (R, nb*256) codes 0..15 in element order, d: float16
    (R, nb), scales: uint8 (R, nb, 8) in 0..63); w = (d * (ls - 32)) * book[q]."""
    q, d, scales = iq4_xs_parts(raw)
    return q.flatten(1), d.squeeze(-1).contiguous(), scales
