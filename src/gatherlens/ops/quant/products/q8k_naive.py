"""The reference of the q8k matmul: the same Q8_K rounding of x, every sum in float64.

    >>> y = q8k_reference(x, raw, "Q4_K")           # x (M, K), K % 256 == 0 -> (M, N) float32

    x block (256 values):  dx = max|x| / 127,  qx = round(x / dx)      (ties to even; dx = 0: qx = 0)
    weight super-block:     d, dmin (fp16), per sub-block s an integer scale sc_s (and min mn_s), codes q
                            (less the code offset: Q3_K q - 4, Q6_K q - 32; IQ4_XS: book[q])
    y = sum over blocks of  d dx sum_s sc_s sum_{i in s} q_i qx_i  -  dmin dx sum_s mn_s sum_{i in s} qx_i

The integer fields are each format's record's `integers` (formats/integers.py, through the formats'
own unpackers), so this shares nothing with q8k.cpp.
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.layout import QK_K
from gatherlens.ops.quant.formats.registry import format_of
from gatherlens.ops.quant.products.q8act_naive import quantize_activations

__all__ = ["quantize_q8_k", "integer_terms", "q8k_reference"]


def quantize_q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (qx (M, K/256, 256) float64 integers in -127..127, dx (M, K/256) float64)."""
    return quantize_activations(x, QK_K)  # (M, nb, 256), (M, nb): the one rounding rule


def integer_terms(raw: torch.Tensor, qtype: str):
    """Rows of super-blocks (N, nb * block_bytes) -> float64 (codes (N, nb, S, n) as the dot uses them,
    d (N, nb), sc (N, nb, S), dmin (N, nb), mn (N, nb, S)); dmin and mn are zeros where the format has none."""
    q, d, sc, dmin, mn = format_of(qtype, needs="integers").integers(raw)
    d = d.double().reshape(q.shape[0], q.shape[1])  # (N, nb)
    dmin = torch.zeros_like(d) if dmin is None else dmin.double().reshape(d.shape)  # (N, nb)
    mn = torch.zeros_like(sc, dtype=torch.float64) if mn is None else mn  # (N, nb, S)
    return q.double(), d, sc.double(), dmin, mn.double()


def q8k_reference(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """y = x W^T with x rounded to Q8_K, in float64, returned as float32 (M, N)."""
    q, d, sc, dmin, mn = integer_terms(raw, qtype)  # (N, nb, S, n), (N, nb), (N, nb, S), (N, nb), (N, nb, S)
    N, nb, S, n = q.shape
    qx, dx = quantize_q8_k(x)  # (M, nb, 256), (M, nb)
    qx = qx.view(-1, nb, S, n)  # (M, nb, S, n): x's values by the weight's sub-blocks
    dots = torch.einsum("nbsi,mbsi->mnbs", q, qx)  # (M, N, nb, S): integer sums
    sums = qx.sum(-1)  # (M, nb, S): llama.cpp's bsums, gathered by sub-block
    scaled = (dots * sc).sum(-1) * d * dx.unsqueeze(1)  # (M, N, nb)
    mins = torch.einsum("nbs,mbs->mnb", mn, sums) * dmin * dx.unsqueeze(1)  # (M, N, nb)
    return (scaled - mins).sum(-1).float()  # (M, N)
