"""The super-block formats' integer terms, as an integer dot product meets them (a record's `integers`).

    >>> q, d, sc, dmin, mn = FORMATS["Q4_K"].integers(raw)     # raw (N, nb * 144) uint8
    >>> q.shape, sc.shape                                       # codes by sub-block; one scale each
    (torch.Size([N, nb, 8, 32]), torch.Size([N, nb, 8]))

A weight of sub-block s of a super-block is d sc_s q - dmin mn_s, with q the code less the format's
code offset (Q3_K q - 4, Q6_K q - 32; IQ4_XS: book[q]) and sc_s, mn_s integers (Q3_K's and IQ4_XS's
6-bit scales are stored with 32 added: ggml's sc - 32). Each function returns (codes (N, nb, S, n),
d, sc (N, nb, S), dmin, mn (N, nb, S)), dmin and mn None where the format has no min, read through the
formats' own unpackers (kquants.py, iquants.py: `*_parts`, by sub-block). products/q8k_naive.py, the
float64 reference of q8k.cpp, sums them; so it shares nothing with the kernel.
"""
from __future__ import annotations

import torch

from gatherlens.ops.quant.formats.iquants import iq4_xs_parts
from gatherlens.ops.quant.formats.kquants import q2_k_parts, q3_k_parts, q4_k_parts, q5_k_parts, q6_k_parts
from gatherlens.ops.quant.formats.layout import LAYOUTS

__all__ = ["q2_k_integers", "q3_k_integers", "q4_k_integers", "q5_k_integers", "q6_k_integers", "iq4_xs_integers"]


def _affine(q, d, dmin, scales, mins):
    """Q2_K, Q4_K, Q5_K: w = d sc q - dmin mn."""
    return q, d, scales, dmin, mins


def q2_k_integers(raw: torch.Tensor):
    return _affine(*q2_k_parts(raw))  # (N, nb, 16, 16), (N, nb, 1), (N, nb, 16), (N, nb, 1), (N, nb, 16)


def q4_k_integers(raw: torch.Tensor):
    return _affine(*q4_k_parts(raw))  # (N, nb, 8, 32), (N, nb, 1), (N, nb, 8), (N, nb, 1), (N, nb, 8)


def q5_k_integers(raw: torch.Tensor):
    return _affine(*q5_k_parts(raw))  # (N, nb, 8, 32), (N, nb, 1), (N, nb, 8), (N, nb, 1), (N, nb, 8)


def q3_k_integers(raw: torch.Tensor):
    q, scales, d = q3_k_parts(raw)  # (N, nb, 16, 16) codes 0..7, (N, nb, 16) 0..63, (N, nb, 1)
    return q.double() - LAYOUTS["Q3_K"].code_offset, d, scales.double() - 32, None, None


def q6_k_integers(raw: torch.Tensor):
    q, scales, d = q6_k_parts(raw)  # (N, nb, 16, 16) int8 already less 32, (N, nb, 16) int8, (N, nb, 1)
    return q, d, scales, None, None


def iq4_xs_integers(raw: torch.Tensor):
    q, d, scales = iq4_xs_parts(raw)  # (N, nb, 8, 32) codes 0..15, (N, nb, 1), (N, nb, 8) 0..63
    book = torch.tensor(LAYOUTS["IQ4_XS"].codebook, dtype=torch.float64)  # (16,)
    return book[q.long()], d, scales.double() - 32, None, None
