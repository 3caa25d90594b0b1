"""The global page choice of a sharded decode step, from each rank's best candidates.

    >>> cb, ci = local_candidates(bounds, offset=12, n=8, total=40)   # this rank's 8 best (bound, id)
    >>> pages = merge_candidates(all_cb, all_ci, n=8)                 # (W, B, H, 8) each -> (B, H, 8)

The whole-cache rule (`sparse_decode` on one process): page 0 and the newest page always, then the
best others by page bound, n pages in all. The global best n pages are among the union of every
rank's own best n, so each rank sends only n (bound, global page id) pairs and every rank merges
the same W * n candidates into the same n pages. Ties are broken towards the lower page id, on the
ranks and in the merge alike, so the choice does not depend on how the pages were split.
Pure tensor functions: the collectives are in decode.py.
"""
from __future__ import annotations

import torch

from gatherlens.ops.sparse.page_choice import rankable

__all__ = ["rank_pages", "best_set", "local_candidates", "merge_candidates"]


def rank_pages(bounds: torch.Tensor, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The n best (bound, id) pairs of each row, best first; ties go to the lower id.

        >>> rank_pages(torch.tensor([1., 3., 3., 2.]), torch.tensor([4, 5, 6, 7]), 2)
        (tensor([3., 3.]), tensor([5, 6]))

    bounds, ids: (..., M) with ids ascending along the last axis. Returns (..., min(n, M)) each.
    """
    order = torch.sort(bounds, dim=-1, descending=True, stable=True).indices[..., :n]  # (..., n')
    return bounds.gather(-1, order), ids.gather(-1, order)


def best_set(ranked: torch.Tensor, n: int) -> torch.Tensor:
    """The positions of the n best of each row, ascending; at the cut, ties go to the lower position.

        >>> best_set(torch.tensor([[2., 5., 2., 2., 1.]]), 3)
        tensor([[0, 1, 2]])

    The same set as the first n of rank_pages, in O(N): one top-k for the n-th best value t,
    then every value > t and the first (n - count(> t)) values == t. ranked: (..., N), n <= N.
    """
    lead = ranked.shape[:-1]
    t = ranked.topk(n, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)  # (..., 1) the n-th best
    above = ranked > t  # (..., N)
    ties = ranked == t  # (..., N)
    room = n - above.sum(dim=-1, keepdim=True)  # (..., 1) places left for the ties
    keep = above | (ties & (ties.cumsum(dim=-1) <= room))  # (..., N) exactly n per row
    return keep.nonzero()[:, -1].view(*lead, n)


def local_candidates(bounds: torch.Tensor, offset: int, n: int, total: int):
    """This rank's best n pages as (bound, global page id), padded to n with (-inf, -1).

        >>> local_candidates(torch.tensor([[[5., 1., 7.]]]), offset=3, n=4, total=6)
        (tensor([[[inf, 5., 1., -inf]]]), tensor([[[ 5,  3,  4, -1]]]))   # page 5 is the newest: kept

    bounds: (B, H, N_r) the bounds of this rank's pages, global ids offset .. offset + N_r - 1.
    total:  pages of the whole cache; global page 0 and page total - 1 are kept (bound +inf).
    returns cand_bounds (B, H, n) float32, cand_ids (B, H, n) int64.
    """
    B, H, N_r = bounds.shape
    ids = torch.arange(offset, offset + N_r, device=bounds.device).expand(B, H, N_r)  # (B, H, N_r)
    ranked = rankable(bounds.float())  # (B, H, N_r) a copy; non-finite bounds below the forced pages
    for forced in (0, total - 1):  # the attention sinks and the newest tokens
        if offset <= forced < offset + N_r:
            ranked[..., forced - offset] = float("inf")
    if n < N_r:  # only the set matters here (the merge orders it): O(N_r), not a sort
        chosen = best_set(ranked, n)  # (B, H, n)
        cb, ci = ranked.gather(-1, chosen), chosen + offset  # (B, H, n) each
    else:
        cb, ci = ranked, ids  # (B, H, N_r): every page of this rank is a candidate
    pad = n - cb.shape[-1]
    if pad:
        cb = torch.cat([cb, cb.new_full((B, H, pad), float("-inf"))], dim=-1)  # (B, H, n)
        ci = torch.cat([ci, ci.new_full((B, H, pad), -1)], dim=-1)  # (B, H, n)
    return cb, ci


def merge_candidates(cand_bounds: torch.Tensor, cand_ids: torch.Tensor, n: int) -> torch.Tensor:
    """The n chosen global pages, ascending, from every rank's candidates.

        >>> merge_candidates(torch.stack([cb0, cb1]), torch.stack([ci0, ci1]), n=4)   # (B, H, 4)

    cand_bounds, cand_ids: (W, B, H, n) as local_candidates returned them, stacked by rank.
    returns (B, H, n) int64.
    """
    W, B, H, m = cand_ids.shape
    bounds = cand_bounds.permute(1, 2, 0, 3).reshape(B, H, W * m)  # (B, H, W*m)
    ids = cand_ids.permute(1, 2, 0, 3).reshape(B, H, W * m)  # (B, H, W*m)
    by_id = torch.sort(ids, dim=-1, stable=True).indices  # padding (-1) first, -inf bounds rank it last
    _, best = rank_pages(bounds.gather(-1, by_id), ids.gather(-1, by_id), n)  # (B, H, n)
    return best.sort(dim=-1).values
