"""The fields of GGUF's K-quant super-blocks (256 weights), unpacked from raw bytes.

    >>> raw = torch.zeros(2, 144, dtype=torch.uint8)           # (R, nb*144): 2 rows of one Q4_K block
    >>> q, d, dmin, sc, mn = q4_k_fields(raw)
    >>> q.shape, sc.shape                                       # codes in element order; 8 sub-blocks
    (torch.Size([2, 256]), torch.Size([2, 1, 8]))

`*_parts` give the fields by sub-block (what dequantize.py computes with), `*_fields` per row; each
field is read by name at the offset its record in layout.py gives.

Layouts (ggml's `ggml-common.h`, `dequantize_row_q4_K` / `_q6_K` in `ggml-quants.c`):

- Q4_K, 144 bytes: `d`, `dmin` (fp16), `scales[12]` (eight 6-bit scales and eight 6-bit mins),
  `qs[128]`: four chunks of 32 bytes; chunk c holds sub-block 2c in its low nibbles and 2c + 1 in
  its high ones. Sub-block s (32 weights): w = (d * sc[s]) * q - (dmin * mn[s]).
- Q6_K, 210 bytes: `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (int8), `d` (fp16).
  In half h (128 weights), element l < 32 of quarter k takes its low 4 bits from byte
  ql[64h + 32(k % 2) + l] (the low nibble for k < 2, the high one for k >= 2) and its top 2 bits
  from bits 2k, 2k + 1 of qh[32h + l]. Sub-block s (16 weights): w = (d * scales[s]) * (q - 32).
- Q2_K, 84 bytes: `scales[16]` (low nibble the scale, high nibble the min of sub-block s), `qs[64]`,
  `d`, `dmin`. Element 128h + 32j + l (l < 32) is bits 2j, 2j + 1 of qs[32h + l]; sub-block s of 16
  weights: w = (d * sc[s]) * q - (dmin * m[s]).
- Q3_K, 110 bytes: `hmask[32]`, `qs[64]`, `scales[12]` (sixteen 6-bit scales), `d`. The low 2 bits
  of element 128h + 32j + l as Q2_K's, bit 2 from bit 4h + j of hmask[l]; sub-block s of 16:
  w = (d * (sc[s] - 32)) * (q - 4) (ggml: a clear hmask bit subtracts 4).
- Q5_K, 176 bytes: `d`, `dmin`, `scales[12]` (as Q4_K), `qh[32]`, `qs[128]` (as Q4_K's nibbles); bit 4
  of element 32s + l is bit s of qh[l]. Sub-block s of 32: w = (d * sc[s]) * q - (dmin * m[s]).
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.fields import as_blocks, field_bytes, half_field

__all__ = ["q4_k_parts", "q6_k_parts", "q2_k_parts", "q3_k_parts", "q5_k_parts", "q4_k_fields", "q6_k_fields",
           "q2_k_fields", "q3_k_fields", "q5_k_fields", "k_scale_min", "q3_k_scales"]


def _shifts(step: int, device) -> torch.Tensor:
    """(8 // step, 1) bit offsets 0, step, 2 step, ... of a byte's fields, on `device`."""
    return torch.arange(0, 8, step, dtype=torch.uint8, device=device).view(-1, 1)  # (fields, 1)


def k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 scale bytes (R, nb, 12) -> (scales, mins), each (R, nb, 8) uint8 in 0..63.

    ggml's get_scale_min_k4: sub-blocks 0-3 keep the low 6 bits of bytes 0-3 (scales) and 4-7
    (mins); sub-blocks 4-7 take their low 4 bits from bytes 8-11 and their top 2 bits from the
    spare top bits of bytes 0-3 (scales) or 4-7 (mins).
    """
    low, mid, top = packed.narrow(-1, 0, 4), packed.narrow(-1, 4, 4), packed.narrow(-1, 8, 4)  # (R, nb, 4)
    scales = torch.cat((low & 63, (top & 0x0F) | ((low >> 6) << 4)), dim=-1)  # (R, nb, 8)
    mins = torch.cat((mid & 63, (top >> 4) | ((mid >> 6) << 4)), dim=-1)  # (R, nb, 8)
    return scales, mins


def q4_k_parts(raw: torch.Tensor):
    """Q4_K -> (q: uint8 (R, nb, 8, 32) codes 0..15 by sub-block, d, dmin: float16 (R, nb, 1),
    scales, mins: uint8 (R, nb, 8))."""
    blocks = as_blocks(raw, "Q4_K")  # (R, nb, 144)
    rows, nb, _ = blocks.shape
    chunks = field_bytes(blocks, "Q4_K", "qs").unflatten(-1, (4, 1, 32))  # (R, nb, 4, 1, 32)
    q = (chunks >> _shifts(4, raw.device)) & 0x0F  # (R, nb, 4, 2, 32): sub-block 2c + h
    scales, mins = k_scale_min(field_bytes(blocks, "Q4_K", "scales"))  # (R, nb, 8) each
    d, dmin = half_field(blocks, "Q4_K", "d"), half_field(blocks, "Q4_K", "dmin")  # (R, nb, 1) each
    return q.view(rows, nb, 8, 32), d, dmin, scales, mins


def q6_k_parts(raw: torch.Tensor):
    """Q6_K -> (q: int8 (R, nb, 16, 16) in -32..31 by sub-block, scales: int8 (R, nb, 16),
    d: float16 (R, nb, 1))."""
    blocks = as_blocks(raw, "Q6_K")  # (R, nb, 210)
    rows, nb, _ = blocks.shape
    ql = field_bytes(blocks, "Q6_K", "ql").unflatten(-1, (2, 1, 64))  # (R, nb, half, 1, 64)
    low = ((ql >> _shifts(4, raw.device)) & 0x0F).view(rows, nb, 2, 4, 32)  # (R, nb, half, quarter, 32)
    qh = field_bytes(blocks, "Q6_K", "qh").unflatten(-1, (2, 1, 32))  # (R, nb, half, 1, 32)
    high = (qh >> _shifts(2, raw.device)) & 3  # (R, nb, half, quarter, 32)
    q = (low | (high << 4)).view(torch.int8) - 32  # (R, nb, 2, 4, 32): codes 0..63, less 32
    scales = field_bytes(blocks, "Q6_K", "scales").view(torch.int8)  # (R, nb, 16)
    return q.view(rows, nb, 16, 16), scales, half_field(blocks, "Q6_K", "d")


def q4_k_fields(raw: torch.Tensor):
    """Q4_K rows (R, nb*144) uint8 -> (q: uint8 (R, nb*256) codes 0..15 in element order,
    d: float16 (R, nb), dmin: float16 (R, nb), scales: uint8 (R, nb, 8), mins: uint8 (R, nb, 8))."""
    q, d, dmin, scales, mins = q4_k_parts(raw)
    return q.flatten(1), d.squeeze(-1).contiguous(), dmin.squeeze(-1).contiguous(), scales, mins


def q6_k_fields(raw: torch.Tensor):
    """Q6_K rows (R, nb*210) uint8 -> (q: int8 (R, nb*256) in -32..31 in element order,
    scales: int8 (R, nb, 16), d: float16 (R, nb))."""
    q, scales, d = q6_k_parts(raw)
    return q.flatten(1), scales.contiguous(), d.squeeze(-1).contiguous()


def _bit_planes(bits: torch.Tensor) -> torch.Tensor:
    """(R, nb, n) bytes -> (R, nb, 8, n) bits 0/1: plane i is bit i of every byte."""
    return (bits.unsqueeze(-2) >> _shifts(1, bits.device)) & 1  # (R, nb, 8, n)


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K / Q3_K's (R, nb, 64) code bytes -> (R, nb, 8, 32) 2-bit codes: group 4h + j is bits 2j, 2j + 1
    of bytes 32h .. 32h + 31 (elements 128h + 32j ..)."""
    rows, nb, _ = qs.shape
    halves = qs.unflatten(-1, (2, 1, 32))  # (R, nb, half, 1, 32)
    return ((halves >> _shifts(2, qs.device)) & 3).view(rows, nb, 8, 32)  # (R, nb, 8, 32)


def q3_k_scales(packed: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 scale bytes (R, nb, 12) -> (R, nb, 16) uint8 6-bit scales in 0..63 (less 32 when used).

    Scale s takes its low 4 bits from byte s % 8 (the low nibble for s < 8, the high one after) and
    its top 2 bits from bits 2(s // 4), 2(s // 4) + 1 of byte 8 + s % 4 (ggml's kmask1/kmask2 shuffle).
    """
    low, top = packed.narrow(-1, 0, 8), packed.narrow(-1, 8, 4)  # (R, nb, 8), (R, nb, 4)
    nibble = torch.cat((low & 0x0F, low >> 4), dim=-1)  # (R, nb, 16)
    high = ((top.unsqueeze(-2) >> _shifts(2, packed.device)) & 3).flatten(-2)  # (R, nb, 16): s = 4k + byte
    return nibble | (high << 4)  # (R, nb, 16)


def q2_k_parts(raw: torch.Tensor):
    """Q2_K -> (q: uint8 (R, nb, 16, 16) codes 0..3 by sub-block, d, dmin: float16 (R, nb, 1),
    scales, mins: uint8 (R, nb, 16) in 0..15)."""
    blocks = as_blocks(raw, "Q2_K")  # (R, nb, 84)
    rows, nb, _ = blocks.shape
    q = _crumbs(field_bytes(blocks, "Q2_K", "qs"))  # (R, nb, 8, 32)
    packed = field_bytes(blocks, "Q2_K", "scales")  # (R, nb, 16)
    d, dmin = half_field(blocks, "Q2_K", "d"), half_field(blocks, "Q2_K", "dmin")  # (R, nb, 1) each
    return q.view(rows, nb, 16, 16), d, dmin, packed & 0x0F, packed >> 4


def q3_k_parts(raw: torch.Tensor):
    """Q3_K -> (q: uint8 (R, nb, 16, 16) codes 0..7 by sub-block (w uses q - 4), scales: uint8 (R, nb, 16)
    in 0..63 (w uses sc - 32), d: float16 (R, nb, 1))."""
    blocks = as_blocks(raw, "Q3_K")  # (R, nb, 110)
    rows, nb, _ = blocks.shape
    low = _crumbs(field_bytes(blocks, "Q3_K", "qs"))  # (R, nb, 8, 32)
    high = _bit_planes(field_bytes(blocks, "Q3_K", "hmask"))  # (R, nb, 8, 32): plane 4h + j
    q = (low | (high << 2)).view(rows, nb, 16, 16)  # (R, nb, 16, 16)
    return q, q3_k_scales(field_bytes(blocks, "Q3_K", "scales")), half_field(blocks, "Q3_K", "d")


def q5_k_parts(raw: torch.Tensor):
    """Q5_K -> (q: uint8 (R, nb, 8, 32) codes 0..31 by sub-block, d, dmin: float16 (R, nb, 1),
    scales, mins: uint8 (R, nb, 8))."""
    blocks = as_blocks(raw, "Q5_K")  # (R, nb, 176)
    rows, nb, _ = blocks.shape
    chunks = field_bytes(blocks, "Q5_K", "qs").unflatten(-1, (4, 1, 32))  # (R, nb, 4, 1, 32)
    low = ((chunks >> _shifts(4, raw.device)) & 0x0F).view(rows, nb, 8, 32)  # (R, nb, 8, 32)
    high = _bit_planes(field_bytes(blocks, "Q5_K", "qh"))  # (R, nb, 8, 32): plane s for sub-block s
    scales, mins = k_scale_min(field_bytes(blocks, "Q5_K", "scales"))  # (R, nb, 8) each
    d, dmin = half_field(blocks, "Q5_K", "d"), half_field(blocks, "Q5_K", "dmin")  # (R, nb, 1) each
    return low | (high << 4), d, dmin, scales, mins


def _flat(q: torch.Tensor, *halves: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Codes by sub-block (R, nb, S, n) -> (R, nb*S*n); fp16 (R, nb, 1) -> (R, nb), contiguous."""
    return (q.flatten(1), *(h.squeeze(-1).contiguous() for h in halves))  # (R, nb*256), (R, nb)...


def q2_k_fields(raw: torch.Tensor):
    """Q2_K rows (R, nb*84) uint8 -> (q: uint8 (R, nb*256) codes 0..3 in element order, d, dmin: float16
    (R, nb), scales, mins: uint8 (R, nb, 16))."""
    q, d, dmin, scales, mins = q2_k_parts(raw)
    return (*_flat(q, d, dmin), scales.contiguous(), mins.contiguous())


def q3_k_fields(raw: torch.Tensor):
    """Q3_K rows (R, nb*110) uint8 -> (q: uint8 (R, nb*256) codes 0..7 in element order, scales: uint8
    (R, nb, 16) in 0..63, d: float16 (R, nb)); w = (d * (sc - 32)) * (q - 4)."""
    q, scales, d = q3_k_parts(raw)
    return q.flatten(1), scales, d.squeeze(-1).contiguous()


def q5_k_fields(raw: torch.Tensor):
    """Q5_K rows (R, nb*176) uint8 -> (q: uint8 (R, nb*256) codes 0..31 in element order, d, dmin: float16
    (R, nb), scales, mins: uint8 (R, nb, 8))."""
    q, d, dmin, scales, mins = q5_k_parts(raw)
    return (*_flat(q, d, dmin), scales, mins)
