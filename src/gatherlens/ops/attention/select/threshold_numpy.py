"""The threshold selection without the C++ kernel: numpy's introselect per row (same keys, slower).

    >>> vals, idx = numpy_topk_rows(torch.tensor([[1., 3., 3., -inf], [2., 0., 5., 5.]]), 2, None, None, False)
    >>> idx                     # each row's kept keys, in ascending key index
    tensor([[1, 2],
            [2, 3]])

`np.partition` per row for the k-th largest value, every key >= it, the rows with a tie across
the cut (or fewer than k allowed keys) redone by the tie rule (ties.py); row blocks on the worker
threads (workers.py; numpy releases the GIL).
"""
from __future__ import annotations

import numpy as np
import torch

from gatherlens.ops.attention.select.ties import keep_at_cut, tie_across_cut
from gatherlens.ops.attention.select.workers import map_row_ranges
from gatherlens.ops.dtypes import NEG_INF


def keep_block(a: np.ndarray, k: int) -> np.ndarray:
    """a (r, L) float -> bool (r, L): True at the keys each row keeps (the tie rule)."""
    r, L = a.shape
    if k >= L:
        return a > NEG_INF                                      # every allowed key
    kth = L - k
    part = np.partition(a, kth, axis=-1)                        # (r, L): [<= edge | edge | >= edge]
    edge = part[:, kth:kth + 1]                                 # (r, 1) the k-th largest
    keep = a >= edge                                            # (r, L)
    below = part[:, :kth].max(axis=-1, keepdims=True)           # (r, 1) largest value under the cut
    redo = (tie_across_cut(edge, below) | (edge == NEG_INF)).ravel()  # ties, or < k allowed keys
    if redo.any():
        rows = np.flatnonzero(redo)
        keep[rows] = keep_at_cut(a[rows], edge[rows], k)
    return keep


def numpy_topk_rows(a: torch.Tensor, k: int, lens, base, weights: bool):
    """threshold_select.topk_rows for a (R, W) without the kernel: numpy per row, then torch."""
    R, W = a.shape
    if lens is not None:                                        # keys past a row's length: forbidden
        a = a.masked_fill(torch.arange(W) >= lens.view(R, 1), NEG_INF)
    vals, idx = torch.empty(R, k, dtype=a.dtype), torch.empty(R, k, dtype=torch.long)
    if R and k:
        av, vv, iv = a.numpy(), vals.numpy(), idx.numpy()
        map_row_ranges(R, lambda r0, r1: _numpy_rows(av[r0:r1], k, vv[r0:r1], iv[r0:r1]))
    if base is not None:
        idx = torch.where(idx < 0, 0, idx) + base.view(R, 1)
    if not weights:
        return vals, idx
    m = vals.amax(-1, keepdim=True)                             # (R, 1)
    m = torch.where(m > NEG_INF, m, torch.zeros_like(m))
    w = torch.exp(vals - m)                                     # (R, k), 0 where padded
    l = w.sum(-1, dtype=torch.float64)                          # (R,)
    lse = torch.where(l > 0, m.squeeze(-1).double() + l.log(), NEG_INF).to(a.dtype)
    return vals, idx, (w / torch.where(l > 0, l, 1.0).unsqueeze(-1)).to(a.dtype), lse


def _numpy_rows(a: np.ndarray, k: int, vals: np.ndarray, idx: np.ndarray) -> None:
    """The same as the kernel with numpy: keep_block, then each row's kept keys packed to the left."""
    keep = keep_block(a, k)                                     # (r, L)
    row, col = np.nonzero(keep)                                 # row-major: ascending key per row
    counts = np.bincount(row, minlength=a.shape[0])             # (r,)
    slot = np.arange(row.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
    vals.fill(NEG_INF)
    idx.fill(-1)
    vals[row, slot], idx[row, slot] = a[row, col], col
