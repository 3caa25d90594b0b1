"""Exact top-k of any tensor of logits (any device, autograd's forward too): per row, the top k
allowed keys by the tie rule (ties.py), deterministically.

    >>> vals, idx = select_topk(torch.tensor([[1., 3., 3., -inf]]), 2)
    >>> idx            # ties: the lower key index wins; best first
    tensor([[1, 2]])

A row with fewer than k allowed keys keeps those and is padded with index -1 / logit -inf. A
partial selection per row (partial.py: numpy's introselect on CPU, torch.topk elsewhere) finds a
top-k set; neither promises which of several equal values it keeps, so rows where a value equal
to the k-th lies outside the set are redone by the tie rule (rare with float32 data, and free when
absent). The order (best first, ties by index) is made only when asked for (a selection record).
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.select.partial import kth_largest, largest_k
from gatherlens.ops.attention.select.ties import keep_at_cut
from gatherlens.ops.dtypes import NEG_INF


def select_topk(logits: torch.Tensor, k: int, ordered: bool = True):
    """logits (..., L) -> (vals, idx), each (..., min(k, L)); idx -1 / vals -inf where padded.

    ordered=False returns the same set in no particular order (cheaper: no sort of the k).
    """
    L = logits.shape[-1]
    k = min(k, L)
    if k == 0:
        shape = logits.shape[:-1] + (0,)
        return logits.new_empty(shape), torch.empty(shape, dtype=torch.long, device=logits.device)
    if k == L:                                                  # every key: nothing to choose
        vals = logits.clone()                                   # (..., L)
        idx = torch.arange(L, device=logits.device).expand(logits.shape).clone()
    else:
        vals, idx, tie = largest_k(logits, k)                   # (..., k) in no order, (...,)
        if bool(tie.any()):                                     # ties across the cut: the tie rule
            rows = tie.nonzero(as_tuple=True)
            edge = vals[rows].amin(-1, keepdim=True)            # (R, 1) the tied k-th value
            vals[rows], idx[rows] = _rows_by_rule(logits[rows], edge, k)  # (R, k)
    if ordered:
        vals, idx = _order_by_index(vals.flatten(0, -2), idx.flatten(0, -2))
        vals, idx = vals.view(logits.shape[:-1] + (k,)), idx.view(logits.shape[:-1] + (k,))
    idx = idx.masked_fill(vals == NEG_INF, -1)                  # (..., k)
    return vals, idx


def _rows_by_rule(rows: torch.Tensor, edge: torch.Tensor, k: int):
    """rows (R, L) whose finite k-th value edge (R, 1) is tied -> vals, idx (R, k), best first."""
    chosen = keep_at_cut(rows, edge, k)                         # (R, L), exactly k True per row
    idx = chosen.nonzero()[:, 1].view(rows.shape[0], k)         # (R, k) ascending key index
    vals = rows.gather(-1, idx)                                 # (R, k)
    return _order_by_index(vals, idx)


def _order_by_index(vals: torch.Tensor, idx: torch.Tensor):
    """Sort (R, k) by value descending, ties by index ascending."""
    by_idx = idx.argsort(dim=-1)                                   # (R, k)
    vals, idx = vals.gather(-1, by_idx), idx.gather(-1, by_idx)
    by_val = vals.argsort(dim=-1, descending=True, stable=True)     # (R, k)
    return vals.gather(-1, by_val), idx.gather(-1, by_val)


def keep_mask(logits: torch.Tensor, k: int) -> torch.Tensor | None:
    """The same set as `select_topk`, as a bool mask (..., L) of keys to DROP; None: drop nothing.

    Padding (-inf) keys are not dropped: their weight exp(-inf) is 0 anyway.
    """
    L = logits.shape[-1]
    if k >= L:
        return None
    edge, tie = kth_largest(logits, k)                          # (..., 1) the k-th largest, (...,)
    drop = logits < edge                                        # (..., L)
    if bool(tie.any()):
        rows = tie.nonzero(as_tuple=True)
        drop[rows] = ~keep_at_cut(logits[rows], edge[rows], k)  # (R, L) the tie rule
    return drop


def indices_to_mask(idx: torch.Tensor, length: int) -> torch.Tensor:
    """idx (..., k) with -1 padding -> bool (..., length), True at the selected keys."""
    pad = torch.where(idx < 0, torch.full_like(idx, length), idx)  # (..., k)
    m = torch.zeros(idx.shape[:-1] + (length + 1,), dtype=torch.bool, device=idx.device)
    m.scatter_(-1, pad, True)                                   # (..., length + 1)
    return m[..., :length]
