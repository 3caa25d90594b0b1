"""A sharded decode step's per-rank pieces, run for every rank in one process (no transport).

    >>> caches = shard_cache(keys, values, lengths=[48, 48, 4], page_size=16)   # one cache per rank
    >>> out, lse, sel = simulate_sharded_decode(q, caches, budget=32)          # sel: every rank's bounds

`sparse_decode_sharded` runs these same functions (local_bounds, local_candidates,
merge_candidates, local_partial, merge_partials) on each rank, with an all_gather where this file
stacks. Pictures and the docs use this to show every rank at once; the multi-process tests check
that both give the same pages, out and lse.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from gatherlens.ops.sparse import PagedKVCache, pages_for_budget
from gatherlens.ops.sparse.config import OP
from gatherlens.trace.sharded import ShardedPageSelection

from .comm import all_gather_stacked
from .decode import dense_partial, local_bounds, local_partial, merge_partials
from .layout import SequenceLayout
from .pages import local_candidates, merge_candidates

__all__ = ["shard_cache", "simulate_sharded_decode", "gather_selection"]


def shard_cache(keys: torch.Tensor, values: torch.Tensor, lengths, page_size: int = OP.page_size) -> list[PagedKVCache]:
    """Split (B, Hkv, L, D) keys and values by sequence into one PagedKVCache per rank (pages: the OP preset's).

        >>> [c.length for c in shard_cache(k, v, [32, 5], page_size=16)]     # k, v: (B, Hkv, 37, D)
        [32, 5]
    """
    SequenceLayout(tuple(lengths), page_size)  # checks the split
    B, Hkv, L, D = keys.shape
    caches, start = [], 0
    for n in lengths:
        c = PagedKVCache(B, Hkv, D, page_size, dtype=keys.dtype, device=keys.device, capacity=max(n, 1))
        c.append(keys[:, :, start:start + n], values[:, :, start:start + n])  # (B, Hkv, n, D)
        caches.append(c)
        start += n
    return caches


def simulate_sharded_decode(query: torch.Tensor, caches: list[PagedKVCache], budget: int = OP.budget, *,
                            share_selection: bool = OP.share_selection, scale: float | None = None,
                            group_score: str = OP.group_score):
    """What `sparse_decode_sharded` returns with len(caches) ranks: (out, lse, ShardedPageSelection);
    its defaults are sparse_decode_sharded's (the OP preset).

        >>> out, lse, sel = simulate_sharded_decode(q, shard_cache(k, v, [16, 12, 9], 4), budget=17)
        >>> sel.to_svg()                  # every rank's pages, the chosen ones coloured by their rank

    The selection holds every rank's bounds (what `gather_selection` collects on real ranks).
    """
    layout = SequenceLayout(tuple(c.length for c in caches), caches[0].page_size)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    q = query.to(caches[0].dtype)  # (B, Hq, 1, D)
    n = pages_for_budget(budget, layout.length, layout.page_size)
    N, offsets = layout.num_pages, layout.page_offsets
    bounds = [local_bounds(q, c, share_selection, group_score) for c in caches]  # (B, Hsel, N_r) each
    B, Hsel = bounds[0].shape[:2]
    if n >= N:
        pages = torch.arange(N, device=q.device).expand(B, Hsel, N)  # (B, Hsel, N)
        parts = [dense_partial(q, c, scale) for c in caches]
    else:
        cands = [local_candidates(b, o, n, N) for b, o in zip(bounds, offsets)]
        pages = merge_candidates(torch.stack([c[0] for c in cands]), torch.stack([c[1] for c in cands]), n)
        parts = [local_partial(q, c, pages, o, scale) for c, o in zip(caches, offsets)]
    out, lse = merge_partials(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    sel = ShardedPageSelection(pages=pages, bounds=bounds, lse=lse, lengths=layout.lengths, rank=0,
                               page_size=layout.page_size, budget=budget, query_heads=query.shape[1],
                               kv_heads=caches[0].kv_heads, share_selection=share_selection,
                               group_score=group_score)
    return out.to(query.dtype), lse, sel


def gather_selection(selection: ShardedPageSelection, group=None) -> ShardedPageSelection:
    """The selection with every rank's page bounds (one all_gather of B * Hsel * max N_r floats).

        >>> out, sel = sparse_decode_sharded(q, local_cache, 2048, return_selection=True)
        >>> gather_selection(sel).to_svg()                       # on every rank of the group

    For pictures and inspection, off the decode path: call it on every rank of the group.
    """
    mine = selection.bounds[selection.rank]  # (B, Hsel, N_r)
    widest = max(selection.pages_per_rank)
    every = all_gather_stacked(F.pad(mine, (0, widest - mine.shape[-1])), group)  # (W, B, Hsel, widest)
    bounds = [every[r][..., :k] for r, k in enumerate(selection.pages_per_rank)]
    return dataclasses.replace(selection, bounds=bounds)
