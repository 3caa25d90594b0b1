"""Rows of GGUF blocks -> float32 values by block, vectorised, with ggml's arithmetic in ggml's order.

    >>> raw = torch.zeros(3, 2 * 34, dtype=torch.uint8)        # (R, nb*34): 3 rows of 2 Q8_0 blocks
    >>> dequantize_q8_0(raw).shape                             # (R, nb, 32) float32
    torch.Size([3, 2, 32])

One function per format (`dequantize_<format>`, ggml's `dequantize_row_*`), each the `dequantize`
of its record in registry.py, whose `dequantize_rows(raw, qtype)` calls them.

Each format's fields come from fields.py / kquants.py (`*_parts`: by block, views where the bytes
allow); here they are widened to float32 and combined exactly as `dequantize_row_*` in
ggml-quants.c writes it and gguf's `gguf.quants` computes it: one float32 product per term, then the
add or subtract (no fused multiply-add), so every value is bit-equal to gguf's `dequantize` (tested
for every format against it and against the per-block reference, naive.py). Codes are small
integers, so widening them (and q - 8, q - 16, sc - 32, the IQ4 codebook's int8 values) is exact; the
plain floats (F16, BF16) widen exactly, and F32 is copied (never a view of the file's bytes).
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.fields import q4_0_parts, q4_1_parts, q5_0_parts, q5_1_parts, q8_0_parts
from gatherlens.ops.quant.formats.floats import float_values
from gatherlens.ops.quant.formats.iquants import book_values, iq4_nl_parts, iq4_xs_parts
from gatherlens.ops.quant.formats.kquants import q2_k_parts, q3_k_parts, q4_k_parts, q5_k_parts, q6_k_parts

__all__ = ["dequantize_q8_0", "dequantize_q4_0", "dequantize_q4_1", "dequantize_q5_0", "dequantize_q5_1",
           "dequantize_q4_k", "dequantize_q6_k", "dequantize_f32", "dequantize_f16", "dequantize_bf16",
           "dequantize_q2_k", "dequantize_q3_k", "dequantize_q5_k", "dequantize_iq4_nl", "dequantize_iq4_xs"]


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    q, d = q8_0_parts(raw)  # (R, nb, 32) int8, (R, nb, 1) fp16
    return q.float() * d.float()  # (R, nb, 32)


def dequantize_q4_0(raw: torch.Tensor) -> torch.Tensor:
    q, d = q4_0_parts(raw)  # (R, nb, 32) codes 0..15, (R, nb, 1)
    return (q.float() - 8) * d.float()  # (R, nb, 32)


def dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    q, d, m = q4_1_parts(raw)  # (R, nb, 32), (R, nb, 1), (R, nb, 1)
    return q.float() * d.float() + m.float()  # (R, nb, 32)


def dequantize_q5_0(raw: torch.Tensor) -> torch.Tensor:
    q, d = q5_0_parts(raw)  # (R, nb, 32) codes 0..31, (R, nb, 1)
    return (q.float() - 16) * d.float()  # (R, nb, 32)


def dequantize_q5_1(raw: torch.Tensor) -> torch.Tensor:
    q, d, m = q5_1_parts(raw)  # (R, nb, 32), (R, nb, 1), (R, nb, 1)
    return q.float() * d.float() + m.float()  # (R, nb, 32)


def dequantize_q4_k(raw: torch.Tensor) -> torch.Tensor:
    return _k_affine(*q4_k_parts(raw))  # (R, nb, 8, 32)


def dequantize_q6_k(raw: torch.Tensor) -> torch.Tensor:
    q, scales, d = q6_k_parts(raw)  # (R, nb, 16, 16) int8, (R, nb, 16) int8, (R, nb, 1)
    step = (d.float() * scales.float()).unsqueeze(-1)  # (R, nb, 16, 1): d * sc
    return step * q.float()  # (R, nb, 16, 16)


def dequantize_f32(raw: torch.Tensor) -> torch.Tensor:
    return float_values(raw, "F32").unsqueeze(-1).clone()  # (R, n, 1): a copy, never the file's bytes


def dequantize_f16(raw: torch.Tensor) -> torch.Tensor:
    return float_values(raw, "F16").float().unsqueeze(-1)  # (R, n, 1): fp16 -> float32 is exact


def dequantize_bf16(raw: torch.Tensor) -> torch.Tensor:
    return float_values(raw, "BF16").float().unsqueeze(-1)  # (R, n, 1): the top 16 bits of a float32


def _k_affine(q, d, dmin, scales, mins) -> torch.Tensor:
    """w = (d * sc) * q - (dmin * m) per sub-block, as ggml rounds it: codes (R, nb, S, n) -> float32."""
    step = (d.float() * scales.float()).unsqueeze(-1)  # (R, nb, S, 1): d * sc, rounded once
    low = (dmin.float() * mins.float()).unsqueeze(-1)  # (R, nb, S, 1): dmin * m
    return step * q.float() - low  # (R, nb, S, n)


def dequantize_q2_k(raw: torch.Tensor) -> torch.Tensor:
    return _k_affine(*q2_k_parts(raw))  # (R, nb, 16, 16)


def dequantize_q3_k(raw: torch.Tensor) -> torch.Tensor:
    q, scales, d = q3_k_parts(raw)  # (R, nb, 16, 16) codes 0..7, (R, nb, 16) 0..63, (R, nb, 1)
    step = (d.float() * (scales.float() - 32)).unsqueeze(-1)  # (R, nb, 16, 1): d * (sc - 32)
    return step * (q.float() - 4)  # (R, nb, 16, 16)


def dequantize_q5_k(raw: torch.Tensor) -> torch.Tensor:
    return _k_affine(*q5_k_parts(raw))  # (R, nb, 8, 32)


def dequantize_iq4_nl(raw: torch.Tensor) -> torch.Tensor:
    q, d = iq4_nl_parts(raw)  # (R, nb, 32) codes 0..15, (R, nb, 1)
    return d.float() * book_values(q, "IQ4_NL")  # (R, nb, 32)


def dequantize_iq4_xs(raw: torch.Tensor) -> torch.Tensor:
    q, d, scales = iq4_xs_parts(raw)  # (R, nb, 8, 32), (R, nb, 1), (R, nb, 8) 0..63
    step = (d.float() * (scales.float() - 32)).unsqueeze(-1)  # (R, nb, 8, 1): d * (ls - 32)
    return step * book_values(q, "IQ4_XS")  # (R, nb, 8, 32)
