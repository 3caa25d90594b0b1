"""share_selection's ranking: one key set per KV group, by the sum of its query heads' logits.

    >>> rank, idx = topk_summed_rows(s, 64)     # s (B, Hkv, G, C, Lc) -> (B*Hkv*C, 64) each

The sum is added in head order (head 0, then + head 1, ...), as chunked.py adds it, so every path
ranks by the same bits; the C++ operator reads the G rows and adds them in that order itself.
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.select.threshold_select import kernel_rows, topk_rows, use_kernel


def topk_summed_rows(s: torch.Tensor, k: int, *, lens=None, native=None):
    """Rows of the sum over dim 2 of s (B, Hkv, G, C, Lc) (any strides), added in head order ->
    vals, idx (B*Hkv*C, k') as topk_rows, vals being those sums."""
    B, Hkv, G, C, Lc = s.shape
    if s.stride(0) != Hkv * s.stride(1) or not use_kernel(native):
        rank = s[:, :, 0].clone()                               # (B, Hkv, C, Lc), added as chunked.py does
        for g in range(1, G):
            rank += s[:, :, g]
        return topk_rows(rank.reshape(-1, Lc), k, lens=lens, native=native)
    return kernel_rows(s.flatten(0, 1), k, lens, None, False)  # (B*Hkv, G, C, Lc): n = G rows summed
