"""The reference of the q8act matmul: the same 8-bit rounding of x, every sum in float64.

    >>> y = q8act_reference(x, raw, "Q4_1")         # x (M, K) -> (M, N) float32

    x block (32 values):  dx = max|x| / 127,  qx = round(x / dx)       (ties to even; dx = 0: qx = 0)
    weight block:          w = q d + m  (Q4_1, Q5_1),  (q - 8) d  (Q4_0),  (q - 16) d  (Q5_0),  q d  (Q8_0),
                           book[q] d  (IQ4_NL: the record's codebook)
    y = sum over blocks of  d dx sum(q qx) + m dx sum(qx)       (m = -code_offset d without a min field)

written out from the fields (the records' `unpack`: fields.py, iquants.py; q8act.py's table names
this reference for the 32-weight blocks), so it shares nothing with q8act.cpp.
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.registry import FORMATS

__all__ = ["quantize_activations", "q8act_reference"]


def quantize_activations(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (qx (M, K/block, block) float64 integers in -127..127, dx (M, K/block) float64):
    the one rule of x's 8-bit rounding (llama.cpp's Q8_0 / Q8_1 with block 32, Q8_K with 256; the
    C++ twin is `gatherlens::round_block` in common.h)."""
    blocks = x.float().reshape(x.shape[0], x.shape[1] // block, block)  # (M, nb, block)
    dx = blocks.abs().amax(dim=-1) / 127  # (M, nb) float32, as the kernel computes it
    inv = torch.where(dx > 0, 1 / dx, torch.zeros_like(dx))  # (M, nb)
    qx = torch.round(blocks * inv.unsqueeze(-1))  # (M, nb, block)
    return qx.double(), dx.double()


def q8act_reference(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """y = x W^T with x rounded to 8 bits per block, in float64, returned as float32 (M, N)."""
    qx, dx = quantize_activations(x)  # (M, nb, 32), (M, nb)
    fmt = FORMATS[qtype]
    q, d, *shift = fmt.unpack(raw)  # (N, K), (N, nb), [(N, nb)]
    m = shift[0] if shift else -fmt.code_offset * d.double()  # (N, nb): w = q d + m, or (q - offset) d
    N, nb = d.shape
    if fmt.codebook:  # IQ4_NL: a code stands for book[code]
        q = torch.tensor(fmt.codebook, dtype=torch.float64)[q.long()]  # (N, K)
    qw = q.double().view(N, nb, fmt.weights)  # (N, nb, 32)
    dots = torch.einsum("nbi,mbi->mnb", qw, qx)  # (M, N, nb): integer sums
    scaled = dots * d.double().unsqueeze(0) * dx.unsqueeze(1)  # (M, N, nb)
    mins = m.double().unsqueeze(0) * (dx * qx.sum(-1)).unsqueeze(1)  # (M, N, nb)
    return (scaled + mins).sum(-1).float()  # (M, N)
