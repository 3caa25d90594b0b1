"""Choose the pages a decode step reads: score page summaries, keep the best within a budget.

    >>> pages, bounds = select_pages(query, cache, budget=2048)   # query (B, Hq, 1, D)
    >>> pages.shape          # (B, Hkv, n) sorted page ids, shared by each KV group's query heads
    >>> bounds.shape         # (B, Hkv, num_pages) the score bound of every page

The bound (Quest): for a key k in a page whose keys lie in the box [min, max] element-wise,
    q . k = sum_d q_d k_d <= sum_d max(q_d * min_d, q_d * max_d)
          = relu(q) . max + (-relu(-q)) . min,
so the bounds of all pages are ONE matmul of [relu(q) | -relu(-q)] (2D) against the stored
[max | min] summaries (2D per page): scoring reads 2/page_size of the bytes of K.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherTypeError, GatherValueError

__all__ = ["page_bounds", "pages_for_budget", "select_pages", "choose_pages", "GROUP_SCORES"]

GROUP_SCORES = ("max", "sum")


def split_query(q: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (..., 2D) = [relu(q) | -relu(-q)], the query side of the bound."""
    return torch.cat([q.clamp(min=0), q.clamp(max=0)], dim=-1)  # (..., 2D)


def page_bounds(query: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Upper bound of q.k over each page, for every query head.

    query:     (B, Hkv, G, D)  the G query heads of each KV group
    summaries: (B, Hkv, N, 2D) [max | min] of each page's keys
    returns    (B, Hkv, G, N)  bound[b, h, g, p] >= q[b, h, g] . k for every key k of page p
    """
    qq = split_query(query).to(summaries.dtype)  # (B, Hkv, G, 2D)
    return torch.matmul(summaries, qq.transpose(-1, -2)).transpose(-1, -2)  # (B, Hkv, G, N)


def pages_for_budget(budget: int, length: int, page_size: int) -> int:
    """How many pages a token budget buys: the last (maybe partial) page plus whole pages.

    At least the first and last page are always read (2 pages, or 1 if the cache has one);
    budget >= length reads every page.

    >>> pages_for_budget(2048, 32768, 16), pages_for_budget(20, 20, 16), pages_for_budget(1, 100, 16)
    (128, 2, 2)
    """
    n_pages = -(-length // page_size)
    last = length - (n_pages - 1) * page_size  # tokens in the last page, 1..P
    k = 1 + max(0, budget - last) // page_size
    return max(min(2, n_pages), min(k, n_pages))


def check_budget(budget) -> int:
    """`budget` itself if it is an int >= 1 (tokens), else a clear error."""
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise GatherTypeError(f"budget must be an int number of tokens, got {type(budget).__name__} {budget!r}")
    if budget <= 0:
        raise GatherValueError(f"budget = {budget} tokens must be >= 1")
    return budget


def select_pages(
    query: torch.Tensor,
    cache,
    budget: int,
    share_selection: bool = True,
    group_score: str = "max",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pages each (batch, selection head) reads, sorted ascending, and all page bounds.

    query: (B, Hq, 1, D) with Hq a multiple of cache.kv_heads (G = Hq // Hkv per group).
    share_selection=True: one choice per KV group (Hsel = Hkv), from the group's bounds reduced
        by `group_score` ("max": the best bound of any head in the group; "sum": their sum).
    share_selection=False: one choice per query head (Hsel = Hq).
    Always keeps page 0 (attention sinks) and the last page (the most recent tokens).
    returns pages (B, Hsel, n) int64 ascending, bounds (B, Hsel, num_pages) float32.
    """
    B, Hq, _, D = query.shape
    Hkv, N = cache.kv_heads, cache.num_pages
    G = Hq // Hkv
    summaries = cache.summaries  # (B, Hkv, N, 2D)
    q = query.view(B, Hkv, G, D)  # (B, Hkv, G, D)
    # (N, 2D) @ (2D, G) reads the summaries row by row (faster on CPU than (G, 2D) @ (2D, N))
    qq = split_query(q).to(summaries.dtype)  # (B, Hkv, G, 2D)
    bounds = torch.matmul(summaries, qq.transpose(-1, -2))  # (B, Hkv, N, G)
    if share_selection:
        bounds = bounds.amax(dim=-1) if group_score == "max" else bounds.sum(dim=-1)  # (B, Hkv, N)
    else:
        bounds = bounds.transpose(-1, -2).reshape(B, Hq, N)  # (B, Hq, N)
    bounds = bounds.float()  # (B, Hsel, N)
    return choose_pages(bounds, pages_for_budget(budget, cache.length, cache.page_size)), bounds


def choose_pages(bounds: torch.Tensor, n: int) -> torch.Tensor:
    """Page 0, the last page and the n - 2 best others by bound: (B, Hsel, N) -> (B, Hsel, n) ascending."""
    B, Hsel, N = bounds.shape
    if n >= N:
        return torch.arange(N, device=bounds.device).expand(B, Hsel, N)  # (B, Hsel, N)
    ranked = bounds.clone()
    ranked[..., 0] = float("inf")  # sinks
    ranked[..., N - 1] = float("inf")  # the most recent tokens
    pages = ranked.topk(n, dim=-1, sorted=False).indices  # (B, Hsel, n)
    return pages.sort(dim=-1).values
