"""An unordered top-k set per row: the k largest entries of each row, in no particular order.

    >>> vals, idx, tie = largest_k(torch.tensor([[1., 5., 3., 5.]]), 2)
    >>> sorted(idx[0].tolist()), tie        # tie: a value equal to the k-th lies outside the set
    ([1, 3], tensor([False]))

On CPU, numpy's introselect (`np.partition` / `np.argpartition`, which release the GIL) split over
torch's thread count (workers.py) beats `torch.topk` (docs/benchmarks.md), which copies every row
into (value, index) pairs first; elsewhere, or for small inputs, `torch.topk` does the work.
Both return the same *set* whenever no value ties the k-th across the cut; `tie` marks the rows
where one does (ties.tie_across_cut), so the caller can redo them by the tie rule (exact_topk.py).
"""
from __future__ import annotations

import numpy as np
import torch

from gatherlens.ops.attention.select.ties import tie_across_cut
from gatherlens.ops.attention.select.workers import map_row_ranges
from gatherlens.ops.dtypes import NEG_INF

NUMPY_MIN_ELEMENTS = 1 << 15      # below this, torch.topk's lower overhead wins


def _use_numpy(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) \
        and x.numel() >= NUMPY_MIN_ELEMENTS and not x.requires_grad


def _row_parts(x2: np.ndarray, fn) -> np.ndarray:
    """fn over blocks of rows of x2 on the worker threads, concatenated."""
    return np.concatenate(map_row_ranges(x2.shape[0], lambda r0, r1: fn(x2[r0:r1])), axis=0)


def kth_largest(x: torch.Tensor, k: int):
    """x (..., L), 1 <= k < L -> edge (..., 1), the k-th largest value of each row, and
    tie (...,): a value equal to it lies among the L - k smaller ones (and it is finite)."""
    L = x.shape[-1]
    if not _use_numpy(x):
        low = x.topk(k + 1, dim=-1, sorted=False).values.topk(2, dim=-1, largest=False).values
        after, edge = low[..., :1], low[..., 1:]                # (..., 1) (k+1)-th and k-th
        return edge, tie_across_cut(edge, after).squeeze(-1)
    kth = L - k

    def work(a):
        part = np.partition(a, kth, axis=-1)                    # (r, L): [.. <= edge | edge | >= edge ..]
        edge = part[:, kth]                                     # (r,)
        below = part[:, :kth].max(axis=-1)                      # (r,) kth >= 1
        return np.stack([edge, tie_across_cut(edge, below)], axis=-1)  # (r, 2)

    res = torch.from_numpy(_row_parts(x.reshape(-1, L).numpy(), work))  # (R, 2)
    shape = x.shape[:-1]
    return res[:, :1].reshape(shape + (1,)), res[:, 1].bool().reshape(shape)


def largest_k(x: torch.Tensor, k: int):
    """x (..., L), 1 <= k < L -> vals (..., k), idx (..., k), tie (...,).

    tie: the k-th largest value also occurs outside the returned set (and is finite).
    """
    L = x.shape[-1]
    if not _use_numpy(x):
        vals, idx = x.topk(k + 1, dim=-1, sorted=False)          # (..., k + 1)
        low = vals.topk(2, dim=-1, largest=False)               # (k+1)-th and k-th largest
        after, edge = low.values[..., 0], low.values[..., 1]    # (...,)
        drop = low.indices[..., :1]                             # (..., 1) where the (k+1)-th sits
        vals = vals.scatter(-1, drop, vals[..., -1:])[..., :k]  # (..., k) move the last into its slot
        idx = idx.scatter(-1, drop, idx[..., -1:])[..., :k]     # (..., k)
        return vals, idx, tie_across_cut(edge, after)
    x2 = x.reshape(-1, L)                                       # (R, L)
    kth = L - k
    top = _row_parts(x2.numpy(), lambda a: np.argpartition(a, kth, axis=-1)[:, kth:])  # (R, k)
    idx = torch.from_numpy(np.ascontiguousarray(top))           # (R, k)
    vals = x2.gather(-1, idx)                                   # (R, k)
    edge = vals.amin(-1, keepdim=True)                          # (R, 1) the k-th largest
    count = (x2 >= edge).sum(-1)                                # (R,) keys at or above it
    tie = (count > k) & (edge.squeeze(-1) > NEG_INF)            # (R,) one of them lies outside the set
    shape = x.shape[:-1]
    return vals.view(shape + (k,)), idx.view(shape + (k,)), tie.view(shape)
