"""GGUF blocks on PyTorch's own CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, group 32), codes as stored.

    >>> packed, scales, planes = pack_int4(raw, "Q4_1")         # raw (N, nb*20) uint8, one plane
    >>> int4_matmul(x, packed, scales, planes, n=raw.shape[0])  # x (M, K) -> (M, N), x's dtype

The kernel (aten/src/ATen/native/cpu/int4mm_kernel.cpp, checked numerically in the tests): codes c in
0..15; per group of 32 along K and per output row a scale s and a zero z, stored as (K/32, N, 2) in the
activation dtype; w = (c - 8) * s + z, an FMA in float32, products summed in float32, the result
rounded to the activation dtype. Only bfloat16 is vectorised on x86 (AVX2/AVX512): float32 and
float16 take a scalar loop ~10x slower. It needs N % 16 == 0 (rows are padded here with zero-weight
rows, so any N works) and K % 32 == 0 (every 32-weight block format gives that). The packed layout
depends on the CPU's vector width: pack at load time, never cache it to disk.

Every 32-weight format is w = s * (16 h + l) + z per group, with codes l in 0..15 and h in -8..7:

| qtype | l      | h       | s        | z          |
|-------|--------|---------|----------|------------|
| Q4_0  | q      | 0       | d        | -8 d       |
| Q4_1  | q      | 0       | d        | m          |
| Q5_0  | q & 15 | q >> 4  | d        | -16 d      |
| Q5_1  | q & 15 | q >> 4  | d        | m          |
| Q8_0  | q & 15 | q >> 4  | d        | 0          |
| Q4_K  | q      | 0       | d * sc   | -dmin * mn |

The low plane goes to the kernel as codes l, scale s, zero z + 8 s (Q4_1: (q - 8) d + (m + 8 d) is
q d + m); formats of more than 4 bits add a high plane, codes h + 8, scale 16 s, zero 0, appended
along K (x is fed twice). No code is re-quantized; only s and the zero are rounded to the activation
dtype (bf16: 8 significant bits, against fp16's 11). Q6_K (16-weight sub-blocks) does not fit group 32.
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.layout import formats_taking
from gatherlens.ops.quant.formats.registry import FORMATS

__all__ = ["INT4_QTYPES", "GROUP", "affine_groups", "pack_codes", "pack_int4", "int4_matmul"]

GROUP = 32  # weights per scale along K: the kernel's qGroupSize
_N_MULTIPLE = 16  # the kernel's rule for N (output features)
INT4_QTYPES = formats_taking("int4")  # the formats whose records name this kernel


def _split(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes of up to 8 bits -> (l uint8 in 0..15, h int8 in -8..7) with q = 16 h + l."""
    wide = q.to(torch.int16)  # (R, K): int8 or uint8 codes, widened so >> is arithmetic
    return (wide & 15).to(torch.uint8), (wide >> 4).to(torch.int8)  # (R, K), (R, K)


def _k_groups(raw: torch.Tensor, qtype: str):
    q, d, dmin, sc, mn = FORMATS[qtype].unpack(raw)  # (R, nb*256), (R, nb) x2, (R, nb, 8) x2
    s = (d.float().unsqueeze(-1) * sc.float()).flatten(1)  # (R, nb*8): d * sc, one float32 rounding
    z = -(dmin.float().unsqueeze(-1) * mn.float()).flatten(1)  # (R, nb*8): -dmin * mn
    return q, None, s, z


def affine_groups(raw: torch.Tensor, qtype: str):
    """Blocks (R, nb * block_bytes) -> (l uint8 (R, K), h int8 (R, K) or None, s, z float32 (R, K/32)).

    w = s * (16 h + l) + z for every weight, group by group (the table in the module docstring),
    read off the format's record: a min `m` is z, else z = -code_offset * d; codes over 4 bits split.
    """
    fmt = FORMATS[qtype]
    if fmt.has("dmin"):  # a K-quant: a scale and a min per 32-weight sub-block
        return _k_groups(raw, qtype)
    q, d, *m = fmt.unpack(raw)  # (R, K), (R, nb), [(R, nb)]
    z = m[0].float() if m else d.float() * float(-fmt.code_offset)  # (R, nb): exact (a power of 2, or 0)
    if fmt.bits <= 4:
        return q, None, d.float(), z
    low, high = _split(q)  # (R, K) each
    return low, high, d.float(), z


def pack_codes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype):
    """Kernel codes (N, K) in 0..15, scale and zero (N, K/32) float32 -> (packed, scales_zeros).

    w = (codes - 8) * scale + zero. Rows are padded to a multiple of 16 with code 8, scale 0, zero 0
    (weights 0): the padded outputs are dropped by `int4_matmul`.
    """
    pad = -codes.shape[0] % _N_MULTIPLE
    if pad:
        codes = torch.cat([codes, codes.new_full((pad, codes.shape[1]), 8)])  # (N', K)
        scale = torch.cat([scale, scale.new_zeros(pad, scale.shape[1])])  # (N', K/32)
        zero = torch.cat([zero, zero.new_zeros(pad, zero.shape[1])])  # (N', K/32)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()  # (K/32, N', 2)
    return packed, scales_zeros  # (N', K/2) uint8, (K/32, N', 2)


def pack_int4(raw: torch.Tensor, qtype: str, dtype: torch.dtype = torch.bfloat16):
    """Blocks (N, nb * block_bytes) of a 32-weight format -> (packed, scales_zeros, planes). Unchecked."""
    low, high, s, z = affine_groups(raw, qtype)  # (N, K), (N, K) | None, (N, K/32) x2
    zero = z + 8 * s  # (N, K/32): the kernel's zero for codes l
    if high is None:
        return (*pack_codes(low, s, zero, dtype), 1)
    codes = torch.cat([low, (high + 8).to(torch.uint8)], dim=1)  # (N, 2K): [l | h + 8]
    scale = torch.cat([s, 16 * s], dim=1)  # (N, 2K/32)
    zero = torch.cat([zero, torch.zeros_like(s)], dim=1)  # (N, 2K/32)
    return (*pack_codes(codes, scale, zero, dtype), 2)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, planes: int,
                n: int) -> torch.Tensor:
    """x (M, K) -> (M, n) in x's dtype, computed in scales_zeros' dtype. Unchecked."""
    a = x.to(scales_zeros.dtype)  # (M, K): the kernel's activation dtype
    if planes == 2:
        a = torch.cat([a, a], dim=1)  # (M, 2K): the low plane's columns, then the high plane's
    elif not a.is_contiguous():
        a = a.contiguous()  # (M, K)
    if a.shape[0] == 0:
        return x.new_zeros(0, n)  # (0, n)
    y = torch._weight_int4pack_mm_for_cpu(a, packed, GROUP, scales_zeros)  # (M, N')
    if y.shape[1] != n:
        y = y[:, :n].contiguous()  # (M, n): drop the padded rows
    return y.to(x.dtype)  # (M, n)
