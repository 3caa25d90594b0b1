"""Sparse decode over a KV cache split by sequence across ranks: the same answer as one process.

    >>> # rank r holds tokens [start_r, end_r) of the sequence in its own PagedKVCache
    >>> out, lse = sparse_decode_sharded(q, local_cache, budget=2048, return_lse=True)

One step, on every rank (W ranks, B batch, H selection heads, n pages chosen):
1. all_gather of 10 int64 per rank: lengths and settings, checked alike on every rank, so bad
   input raises everywhere instead of leaving a rank waiting in a collective;
2. each rank scores its own pages (Quest bounds) and all_gathers its best n as (bound, global
   page id): 8 bytes each, B * H * n * 8 bytes per rank (skipped when every page is read);
3. each rank attends over the chosen pages it holds and all_gathers its partial (out, lse):
   B * Hq * (D + 1) * 4 bytes per rank; every rank merges them with the stable log-sum-exp merge.
Nothing of the cache's size moves: keys and values stay where they are.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from gatherlens.errors import GatherLensError, GatherTypeError, GatherValueError
from gatherlens.ops.sparse import PagedKVCache, pages_for_budget, select_pages
from gatherlens.ops.sparse.config import GROUP_SCORES, OP, check_budget, check_choice
from gatherlens.ops.sparse.torch_decode import attend_gathered
from gatherlens.trace.sharded import ShardedPageSelection

from .comm import all_gather_stacked
from .layout import SequenceLayout
from .pages import local_candidates, merge_candidates

__all__ = ["sparse_decode_sharded", "local_bounds", "local_partial", "merge_partials"]

_SETTINGS = ("length", "batch", "kv_heads", "head_dim", "page_size", "query_heads", "budget",
             "share_selection", "group_score")


def _check_local(query, cache, budget, share_selection, group_score, scale) -> None:
    """This rank's own arguments; the same messages as sparse_decode."""
    if not isinstance(cache, PagedKVCache):
        raise GatherTypeError(f"local_cache must be a PagedKVCache, got {type(cache).__name__}")
    if not isinstance(query, torch.Tensor) or not query.dtype.is_floating_point:
        raise GatherTypeError(f"query must be a floating torch.Tensor, got {getattr(query, 'dtype', type(query).__name__)}")
    check_budget(budget)
    if query.ndim != 4 or query.shape[2] != 1 or query.shape[0] != cache.batch \
            or query.shape[3] != cache.head_dim or query.shape[1] % cache.kv_heads or query.shape[1] == 0:
        raise GatherValueError(
            f"query has shape {tuple(query.shape)}; expected (B, Hq, 1, D) with B = {cache.batch}, "
            f"D = {cache.head_dim} and Hq a multiple of kv_heads = {cache.kv_heads}")
    if query.device != cache.device:
        raise GatherValueError(f"query is on {query.device} but the local cache is on {cache.device}")
    if not isinstance(share_selection, bool):
        raise GatherTypeError(f"share_selection must be a bool, got {share_selection!r}")
    check_choice(OP.recent, OP.choose, group_score)  # the one rule of the choice settings
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        raise GatherValueError(f"scale must be a finite number > 0 (default 1/sqrt(D)), got {scale!r}")


def _agree(query, cache, budget, share_selection, group_score, scale, group) -> SequenceLayout:
    """Check locally, then exchange lengths and settings so every rank raises, or none does."""
    if not dist.is_available() or not dist.is_initialized():
        raise GatherValueError("sparse_decode_sharded needs a torch.distributed process group: call "
                               "dist.init_process_group first (torchrun does the rest), or use sparse_decode")
    error = None
    try:
        _check_local(query, cache, budget, share_selection, group_score, scale)
        mine = [1, cache.length, cache.batch, cache.kv_heads, cache.head_dim, cache.page_size,
                query.shape[1], budget, int(share_selection), GROUP_SCORES.index(group_score)]
    except GatherLensError as e:
        error, mine = e, [0] * (1 + len(_SETTINGS))
    device = cache.device if isinstance(cache, PagedKVCache) else torch.device("cpu")
    table = all_gather_stacked(torch.tensor(mine, dtype=torch.int64, device=device), group).tolist()
    if error is not None:
        raise error
    for r, row in enumerate(table):
        if not row[0]:
            raise GatherValueError(f"rank {r} rejected its arguments to sparse_decode_sharded (its own "
                                   f"error says why); no rank decodes this step")
        for name, want, got in zip(_SETTINGS[1:], table[0][2:], row[2:]):
            if want != got:
                raise GatherValueError(f"{name} differs between ranks: {want} on rank 0, {got} on rank {r}; "
                                       f"every rank must decode the same query with the same settings")
    return SequenceLayout(lengths=tuple(row[1] for row in table), page_size=cache.page_size)


def local_bounds(q: torch.Tensor, cache: PagedKVCache, share_selection: bool, group_score: str):
    """(B, Hsel, N_r) float32 page bounds of this rank's pages (as select_pages scores them).

        >>> local_bounds(q, local_cache, share_selection=True, group_score="max").shape   # (B, Hkv, N_r)"""
    B, Hq = q.shape[:2]
    Hsel = cache.kv_heads if share_selection else Hq
    if cache.length == 0:
        return torch.zeros(B, Hsel, 0, device=q.device)  # (B, Hsel, 0)
    return select_pages(q, cache, cache.length, share_selection, group_score)[1]  # every page: no top-k


def local_partial(q: torch.Tensor, cache: PagedKVCache, pages: torch.Tensor, offset: int, scale: float):
    """Attention of q (B, Hq, 1, D) over the chosen global `pages` (B, Hsel, n) this rank holds.

        >>> out, lse = local_partial(q, local_cache, pages, offset=32, scale=0.125)

    returns out (B, Hq, 1, D) and lse (B, Hq, 1); a head none of whose pages are here gets
    out 0 and lse -inf (no weight in the merge).
    """
    B, Hq, _, D = q.shape
    Hsel, P = pages.shape[1], cache.page_size
    local = pages - offset  # (B, Hsel, n)
    mine = (local >= 0) & (local < cache.num_pages)  # (B, Hsel, n)
    m = int(mine.sum(-1).max()) if mine.numel() else 0
    if m == 0:
        return q.new_zeros(B, Hq, 1, D, dtype=torch.float32), q.new_full((B, Hq, 1), float("-inf"), dtype=torch.float32)
    first = torch.sort((~mine).to(torch.int8), dim=-1, stable=True).indices[..., :m]  # (B, Hsel, m) mine first
    ok = mine.gather(-1, first)  # (B, Hsel, m)
    lp = torch.where(ok, local.gather(-1, first), 0)  # (B, Hsel, m) local page ids; padding reads page 0
    k, v = cache.gather_pages(lp)  # (B, Hsel, m*P, D) each
    valid, keep = m * P, None
    tail = cache.num_pages * P - cache.length  # unused rows of this rank's last page
    if bool(ok.all()) and (tail == 0 or bool((lp[..., -1] == cache.num_pages - 1).all())):
        valid -= tail  # every head reads m pages here: no mask, the fused kernel (as sparse_decode)
    else:
        keep = ok.repeat_interleave(P, dim=-1) & (cache.page_positions(lp) < cache.length)  # (B, Hsel, m*P)
    out, lse = attend_gathered(q.view(B, Hsel, Hq // Hsel, D), k, v, valid, scale, keep)  # (B, Hsel, R, D)
    return out.reshape(B, Hq, 1, D), lse.reshape(B, Hq, 1)


def dense_partial(q: torch.Tensor, cache: PagedKVCache, scale: float):
    """Attention of q (B, Hq, 1, D) over every token this rank holds (budget >= length)."""
    B, Hq, _, D = q.shape
    if cache.length == 0:
        return local_partial(q, cache, q.new_zeros(B, cache.kv_heads, 0, dtype=torch.long), 0, scale)
    qs = q.view(B, cache.kv_heads, Hq // cache.kv_heads, D)  # (B, Hkv, G, D)
    out, lse = attend_gathered(qs, cache.keys, cache.values, cache.length, scale)  # (B, Hkv, G, D), (B, Hkv, G)
    return out.reshape(B, Hq, 1, D), lse.reshape(B, Hq, 1)


def merge_partials(outs: torch.Tensor, lses: torch.Tensor):
    """Softmax over the union of the ranks' keys from their partial results.

        >>> out, lse = merge_partials(torch.stack(outs), torch.stack(lses))   # stacked by rank

    outs (W, B, Hq, 1, D), lses (W, B, Hq, 1) -> out (B, Hq, 1, D), lse (B, Hq, 1) float32:
    lse = m + log(sum_r exp(lse_r - m)) with m = max_r lse_r; out = sum_r exp(lse_r - lse) out_r.
    """
    lses = lses.double()  # (W, B, Hq, 1)
    top = lses.amax(dim=0)  # (B, Hq, 1)
    weights = torch.exp(lses - top)  # (W, B, Hq, 1); a rank with lse -inf weighs 0
    total = weights.sum(dim=0)  # (B, Hq, 1)
    out = (weights.unsqueeze(-1) * outs.double()).sum(dim=0) / total.unsqueeze(-1)  # (B, Hq, 1, D)
    return out, (top + torch.log(total)).float()


def _exchange_candidates(bounds, offset: int, n: int, total: int, group) -> torch.Tensor:
    """all_gather every rank's best n (bound, global page id) and merge them: (B, Hsel, n) pages."""
    cb, ci = local_candidates(bounds, offset, n, total)  # (B, Hsel, n) each
    packed = torch.stack([cb, ci.to(torch.int32).view(torch.float32)], dim=-1)  # (B, Hsel, n, 2): 8 bytes each
    every = all_gather_stacked(packed, group)  # (W, B, Hsel, n, 2)
    ids = every[..., 1].contiguous().view(torch.int32).long()  # (W, B, Hsel, n)
    return merge_candidates(every[..., 0], ids, n)  # (B, Hsel, n)


def _exchange_partials(out: torch.Tensor, lse: torch.Tensor, group):
    """all_gather every rank's (out, lse) in one tensor and merge them on every rank."""
    D = out.shape[-1]
    dtype = torch.float64 if out.dtype == torch.float64 else torch.float32
    packed = torch.cat([out.to(dtype), lse.to(dtype).unsqueeze(-1)], dim=-1)  # (B, Hq, 1, D + 1)
    every = all_gather_stacked(packed, group)  # (W, B, Hq, 1, D + 1)
    return merge_partials(every[..., :D], every[..., D])  # (B, Hq, 1, D), (B, Hq, 1)


def sparse_decode_sharded(query: torch.Tensor, local_cache: PagedKVCache, budget: int = OP.budget, *,
                          group=None, return_lse: bool = False, return_selection: bool = False,
                          share_selection: bool = OP.share_selection, scale: float | None = None,
                          group_score: str = OP.group_score):
    r"""``sparse_decode`` over a KV cache split by sequence across the ranks of ``group``.

    Every rank gets what ``sparse_decode(query, whole_cache, budget)`` gives on one process: the
    same pages (global ranking of page bounds; page 0 and the newest page always; ties towards
    the lower page id), the same out and lse up to float rounding. ``budget >= length`` is
    dense attention over the whole sequence.

    Args:
        query (Tensor): the decode query, the same on every rank.
        local_cache (PagedKVCache): this rank's contiguous part of the sequence; rank order is
            sequence order and every part but the last non-empty one is whole pages. A rank
            may hold nothing (length 0).
        budget (int): tokens read per selection head over the whole sequence. Default: 2048.
        group (ProcessGroup, optional): the ranks sharing the sequence. Default: the world.
        return_lse (bool): also return the log-sum-exp of each head's logits.
        return_selection (bool): also return a ShardedPageSelection (global pages, this rank's bounds).
        share_selection, scale, group_score: as in ``sparse_decode``.

    Shape:
        - query: :math:`(B, H_q, 1, D)`; output: :math:`(B, H_q, 1, D)`; lse: :math:`(B, H_q, 1)`

    Returns:
        ``out`` in ``query.dtype``; then ``lse`` (float32) if ``return_lse``; then the
        selection if ``return_selection``. Collectives: three all_gathers of at most
        ``B * Hq * (D + 1)`` floats each (see the module docstring); none of the cache moves.
        Inference only: no gradient flows through the collectives.

    Example::

        >>> # 2 ranks, 1000 tokens: rank 0 holds tokens 0..511 (32 pages of 16), rank 1 the rest
        >>> out, lse = sparse_decode_sharded(q, local_cache, budget=256, return_lse=True)
    """
    layout = _agree(query, local_cache, budget, share_selection, group_score, scale, group)
    rank = dist.get_rank(group)
    B, Hq, _, D = query.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    q = query.to(local_cache.dtype)  # (B, Hq, 1, D)
    n = pages_for_budget(budget, layout.length, layout.page_size)
    N, offset = layout.num_pages, layout.page_offsets[rank]
    bounds = None
    if n >= N:  # every page: dense attention, no choice to agree on
        out, lse = dense_partial(q, local_cache, scale)  # (B, Hq, 1, D), (B, Hq, 1)
        Hsel = local_cache.kv_heads if share_selection else Hq
        pages = torch.arange(N, device=q.device).expand(B, Hsel, N)  # (B, Hsel, N)
    else:
        bounds = local_bounds(q, local_cache, share_selection, group_score)  # (B, Hsel, N_r)
        pages = _exchange_candidates(bounds, offset, n, N, group)  # (B, Hsel, n)
        out, lse = local_partial(q, local_cache, pages, offset, scale)  # (B, Hq, 1, D), (B, Hq, 1)
    out, lse = _exchange_partials(out, lse, group)  # (B, Hq, 1, D), (B, Hq, 1)
    result = [out.to(query.dtype)] + ([lse] if return_lse else [])
    if return_selection:
        if bounds is None:
            bounds = local_bounds(q, local_cache, share_selection, group_score)  # (B, Hsel, N_r)
        result.append(_selection(pages, bounds, lse, layout, rank, budget, Hq, local_cache.kv_heads,
                                 share_selection, group_score))
    return result[0] if len(result) == 1 else tuple(result)


def _selection(pages, bounds, lse, layout: SequenceLayout, rank: int, budget: int, Hq: int, Hkv: int,
               share_selection: bool, group_score: str) -> ShardedPageSelection:
    """The step's selection as this rank knows it: the global pages, its own bounds only."""
    return ShardedPageSelection(
        pages=pages, bounds=[bounds if r == rank else None for r in range(layout.world_size)], lse=lse,
        lengths=layout.lengths, rank=rank, page_size=layout.page_size, budget=budget, query_heads=Hq,
        kv_heads=Hkv, share_selection=share_selection, group_score=group_score)
