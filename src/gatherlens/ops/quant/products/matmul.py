"""The routes of a quantized linear: how each packs a weight's blocks once, and how it multiplies.

    >>> tensors, planes = ROUTES["bf16"].pack(raw, "Q8_0")      # (w bf16 (N, K),), 1
    >>> ROUTES["bf16"].matmul(x, weight)                        # x (M, K) -> (M, N), x's dtype

| route        | formats        | resident weight             | exact?                                  |
|--------------|----------------|-----------------------------|-----------------------------------------|
| int4         | routes "int4"  | codes as stored, bf16 s / z | codes exact; s, z, x and y rounded to bf16 |
| int4_f32     | routes "int4"  | same, float32 s / z         | weights exact; float32 sums (slow)      |
| bf16         | any            | dequantized once, bf16      | weights rounded to bf16                 |
| float32      | any            | dequantized once, float32   | bit-equal to the reference (today's way) |
| dequant      | any            | none beyond the blocks      | bit-equal: dequantizes on every call    |
| q8act        | routes "q8act" | the blocks; 4- and 8-bit 32-weight formats their bytes in panels of 8 rows (x8.py), the file's pages let go | weights exact; x rounded to 8 bits per block (llama.cpp's way: per 32, or per 256 for super-blocks); F16 / BF16 / F32 read as stored, float32 sums |
| int8_row     | any            | int8, one scale per row     | lossy: re-quantized (`_weight_int8pack_mm`) |
| int4_requant | any            | int4 g32, re-quantized      | lossy: min/max per 32 weights           |

routes "int4": the formats whose record (layout.py) names that kernel in its `routes`
(`formats_taking("int4")`, likewise "q8act"; the record's `kernel` says which kernel runs each).
`pick_route(qtype, route)` is the one choice of a weight's route, made once at load (models/gguf):

    >>> pick_route("Q4_K", "auto")      # "q8act" where q8k.cpp built here, else "int4"
    'q8act'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from gatherlens.ops.quant.products.int4 import GROUP, int4_matmul, pack_codes, pack_int4
from gatherlens.ops.quant.formats.layout import formats_taking
from gatherlens.ops.quant.products.q8act import q8act_matmul, ready as q8act_ready
from gatherlens.ops.quant.products.x8 import pack_x8, x8_fits, x8_matmul
from gatherlens.ops.quant.formats.registry import dequantize_rows, format_of
from gatherlens.ops.quant.formats.sizes import QTYPES

__all__ = ["Route", "ROUTES", "pick_route", "makes_panels"]


@dataclass(frozen=True)
class Route:
    """How one route packs blocks (raw, qtype) -> (tensors, planes) and multiplies (x, weight) -> y."""

    pack: Callable
    matmul: Callable
    qtypes: tuple[str, ...] = QTYPES
    cpu_only: bool = False


def _int4_pack(dtype):
    def pack(raw, qtype):
        packed, scales_zeros, planes = pack_int4(raw, qtype, dtype)  # (N', K'/2), (K'/32, N', 2)
        return (packed, scales_zeros), planes
    return pack


def _int4_mm(x, weight):
    packed, scales_zeros = weight.tensors
    return int4_matmul(x, packed, scales_zeros, weight.planes, weight.shape[0])  # (M, N)


def _dense_pack(dtype):
    def pack(raw, qtype):
        return (dequantize_rows(raw, qtype).to(dtype),), 1  # (N, K)
    return pack


def _dense_mm(x, weight):
    (w,) = weight.tensors  # (N, K)
    return F.linear(x.to(w.dtype), w).to(x.dtype)  # (M, N)


def _dequant_mm(x, weight):
    w = dequantize_rows(weight.blocks(), weight.qtype)  # (N, K) float32, this call only
    return F.linear(x.to(w.dtype), w).to(x.dtype)  # (M, N)


def makes_panels(raw, qtype: str) -> bool:
    """True where the q8act route repacks raw (N, row_bytes) of `qtype` in panels of 8 rows: the format has a
    panel layout, N is a multiple of 8 and the format's kernel built here."""
    return x8_fits(raw, qtype) and q8act_ready(qtype) is None


def _q8act_pack(raw, qtype):
    """The blocks repacked in panels of 8 rows (x8.py) where `makes_panels`, else nothing beyond the blocks:
    ((panels,) or (), 1)."""
    return ((pack_x8(raw, qtype),) if makes_panels(raw, qtype) else ()), 1


def _q8act_mm(x, weight):
    # where it runs (its operator built, else dequant) is linear.LINEAR_PRODUCT's q8act row
    if weight.tensors:  # the panels: the same sums, a third of the instructions a block at one row of x
        y = x8_matmul(x, weight.tensors[0], weight.qtype)  # (M, N) float32
    else:
        y = q8act_matmul(x, weight.raw, weight.qtype)  # (M, N) float32
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def _int8_row_pack(raw, qtype):
    w = dequantize_rows(raw, qtype)  # (N, K)
    scale = w.abs().amax(dim=1) / 127  # (N,): one scale per row, as the kernel takes
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # (N,): an all-zero row keeps scale 1
    q = torch.round(w / scale.unsqueeze(1)).clamp(-127, 127).to(torch.int8)  # (N, K)
    return (q, scale.to(torch.bfloat16)), 1


def _int8_row_mm(x, weight):
    q, scale = weight.tensors  # (N, K) int8, (N,) bf16
    if x.shape[0] == 0:
        return x.new_zeros(0, q.shape[0])  # (0, N)
    a = x.to(scale.dtype).contiguous()  # (M, K)
    return torch._weight_int8pack_mm(a, q, scale).to(x.dtype)  # (M, N)


def _int4_requant_pack(raw, qtype):
    w = dequantize_rows(raw, qtype)  # (N, K)
    groups = w.view(w.shape[0], -1, GROUP)  # (N, K/32, 32)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # (N, K/32) each
    scale = (high - low) / 15  # (N, K/32): Q4_1's rule (ggml's quantize_row_q4_1_ref)
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))  # (N, K/32)
    codes = torch.round((groups - low.unsqueeze(-1)) * inverse.unsqueeze(-1)).clamp(0, 15)  # (N, K/32, 32)
    packed = pack_codes(codes.flatten(1).to(torch.uint8), scale, low + 8 * scale, torch.bfloat16)
    return packed, 1  # (N', K/2), (K/32, N', 2)


ROUTES = {
    "int4": Route(_int4_pack(torch.bfloat16), _int4_mm, formats_taking("int4"), cpu_only=True),
    "int4_f32": Route(_int4_pack(torch.float32), _int4_mm, formats_taking("int4"), cpu_only=True),
    "bf16": Route(_dense_pack(torch.bfloat16), _dense_mm),
    "float32": Route(_dense_pack(torch.float32), _dense_mm),
    "dequant": Route(lambda raw, qtype: ((), 1), _dequant_mm),
    "q8act": Route(_q8act_pack, _q8act_mm, formats_taking("q8act"), cpu_only=True),
    "int8_row": Route(_int8_row_pack, _int8_row_mm, cpu_only=True),
    "int4_requant": Route(_int4_requant_pack, _int4_mm, cpu_only=True),
}


def pick_route(qtype: str, route: str, head: bool = False) -> str:
    """"auto": q8act for every format whose record names it when that format's kernel can run here
    (`q8act_ready(qtype)`), else int4 (bf16 for a head); a named route where it takes `qtype`; bf16
    for any format no faster route takes. A format no record names is a GatherValueError naming it."""
    format_of(qtype)
    if route == "auto":
        if q8act_ready(qtype) is None:  # a reason for any format the route does not take
            return "q8act"
        route = "bf16" if head else "int4"
    takes = ROUTES[route].qtypes if route in ROUTES else None  # from the format records (formats/layout.py)
    return route if takes is None or qtype in takes else "bf16"
