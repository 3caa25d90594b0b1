"""Choose the pages a decode step reads: score page summaries, keep the best within a budget.

    >>> pages, bounds = select_pages(query, cache, budget=2048)   # query (B, Hq, 1, D)
    >>> pages.shape          # (B, Hkv, n) sorted page ids, shared by each KV group's query heads
    >>> bounds.shape         # (B, Hkv, num_pages) the score bound of every page

The bound (Quest): for a key k in a page whose keys lie in the box [min, max] element-wise,
    q . k = sum_d q_d k_d <= sum_d max(q_d * min_d, q_d * max_d)
          = relu(q) . max + (-relu(-q)) . min,
so the bounds of all pages are ONE matmul of [relu(q) | -relu(-q)] (2D) against the stored
[max | min] summaries (2D per page): scoring reads 2/page_size of the bytes of K.

Always read: page 0 (attention sinks) and the pages of the `recent` newest tokens (at least the
last page). A fixed budget reads n pages (`pages_to_read`); the auto budget (`mass`) reads, per
selection head, pages in the same order until their estimated share of the attention mass reaches
`mass` (`mass_counts`: the softmax of the scaled bounds, each page weighted by its token count, as
Twilight's top-p), at least `min_pages` and at most n; its pages come back padded with -1 after
each head's own count (`sorted_pages`). `choose="oracle"` ranks pages by their true share of the softmax instead (it reads
every key: an evaluation tool that shows how good a choice could be, not a fast path).
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.select.ties import keep_ties

from .config import CHOOSERS, GROUP_SCORES, OP, check_budget  # noqa: F401 (check_budget: its one home is config.py)
from .geometry import last_page_tokens, page_count

__all__ = ["page_bounds", "pages_for_budget", "pages_to_read", "select_pages", "choose_pages", "rankable", "page_mass",
           "first_recent_page", "mass_counts", "choose_by_mass", "sorted_pages", "page_counts", "estimated_mass",
           "GROUP_SCORES", "CHOOSERS"]


def split_query(q: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (..., 2D) = [relu(q) | -relu(-q)], the query side of the bound."""
    return torch.cat([q.clamp(min=0), q.clamp(max=0)], dim=-1)  # (..., 2D)


def page_bounds(query: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """Upper bound of q.k over each page, for every query head.

    query:     (B, Hkv, G, D)  the G query heads of each KV group
    summaries: (B, Hkv, N, 2D) [max | min] of each page's keys
    returns    (B, Hkv, G, N)  bound[b, h, g, p] >= q[b, h, g] . k for every key k of page p
    """
    dt = torch.promote_types(query.dtype, summaries.dtype)  # 16-bit summaries of wider keys: scored wider
    qq = split_query(query).to(dt)  # (B, Hkv, G, 2D)
    return torch.matmul(summaries.to(dt), qq.transpose(-1, -2)).transpose(-1, -2)  # (B, Hkv, G, N)


def pages_for_budget(budget: int, length: int, page_size: int) -> int:
    """How many pages a token budget buys: the last (maybe partial) page plus whole pages.

    At least the first and last page are always read (2 pages, or 1 if the cache has one);
    budget >= length reads every page.

    >>> pages_for_budget(2048, 32768, 16), pages_for_budget(20, 20, 16), pages_for_budget(1, 100, 16)
    (128, 2, 2)
    """
    n_pages = page_count(length, page_size)
    last = last_page_tokens(length, page_size)  # tokens in the last page, 1..P
    k = 1 + max(0, budget - last) // page_size
    return max(min(2, n_pages), min(k, n_pages))


def first_recent_page(length: int, page_size: int, recent: int) -> int:
    """The first page that holds one of the `recent` newest tokens (the last page when recent <= 1).

    >>> first_recent_page(100, 16, 0), first_recent_page(100, 16, 40), first_recent_page(100, 16, 500)
    (6, 3, 0)
    """
    n_pages = page_count(length, page_size)
    return max(0, min(n_pages - 1, (length - max(recent, 1)) // page_size))


def select_pages(
    query: torch.Tensor,
    cache,
    budget: int,
    share_selection: bool = OP.share_selection,
    group_score: str = OP.group_score,
    *,
    recent: int = OP.recent,
    choose: str = OP.choose,
    scale: float | None = None,
    mass: float | None = None,
    min_pages: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pages each (batch, selection head) reads, sorted ascending, and the score of every page.

    query: (B, Hq, 1, D) with Hq a multiple of cache.kv_heads (G = Hq // Hkv per group).
    share_selection=True: one choice per KV group (Hsel = Hkv), from the group's scores reduced
        by `group_score` ("max": the best score of any head in the group; "sum": their sum).
    share_selection=False: one choice per query head (Hsel = Hq).
    recent: the newest `recent` tokens' pages are always read (they count against the budget).
    choose: "bound" (Quest's upper bound of q.k, from the summaries) or "oracle" (each page's
        true softmax mass under `scale`, from every key).
    mass, min_pages: the auto budget (`choose_by_mass`): `budget` is its ceiling; None: a fixed budget.
    Always keeps page 0 (attention sinks) and the last page (the most recent tokens).
    returns pages (B, Hsel, n) int64 ascending (with mass: each head's pages ascending, then -1),
    scores (B, Hsel, num_pages) float32.
    """
    B, Hq, _, D = query.shape
    Hkv, N = cache.kv_heads, cache.num_pages
    q = query.view(B, Hkv, Hq // Hkv, D)  # (B, Hkv, G, D)
    if choose == "oracle":
        scores = page_mass(q, cache, 1.0 / D ** 0.5 if scale is None else scale)  # (B, Hkv, G, N)
    else:
        scores = _bounds(split_query(q), cache.summaries)  # (B, Hkv, G, N)
    if share_selection:
        scores = scores.amax(dim=-2) if group_score == "max" else scores.sum(dim=-2)  # (B, Hkv, N)
    else:
        scores = scores.reshape(B, Hq, N)  # (B, Hq, N)
    scores = scores.float()  # (B, Hsel, N)
    n, first = pages_to_read(cache.length, cache.page_size, budget, recent)
    if mass is None or n >= N:
        return choose_pages(scores, n, first), scores
    sc = 1.0 / D ** 0.5 if scale is None else scale
    return choose_by_mass(scores, n, first, mass, min_pages, sc, cache.length, cache.page_size,
                          probabilities=choose == "oracle"), scores


def pages_to_read(length: int, page_size: int, budget: int, recent: int) -> tuple[int, int]:
    """(n, first_recent): how many pages a step reads (the budget's, or more to hold page 0 and
    the recent window) and the first page of the recent window. The one rule of every path.

    >>> pages_to_read(1000, 8, 512, 128)
    (64, 109)
    """
    N = page_count(length, page_size)
    first = first_recent_page(length, page_size, recent)
    return max(pages_for_budget(budget, length, page_size), min(N, N - first + 1)), first


def _bounds(qq: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """qq (B, Hkv, G, 2D) against summaries (B, Hkv, N, 2D): (B, Hkv, G, N), in the faster orientation.

    Large summaries (past ~4 MiB) stream better read row by row, (N, 2D) @ (2D, G); small ones
    are faster as (G, 2D) @ (2D, N) (docs/bench/notes.md).
    """
    dt = torch.promote_types(qq.dtype, summaries.dtype)  # 16-bit summaries of wider keys: scored in the keys' dtype
    qq, summaries = qq.to(dt), summaries.to(dt)  # (B, Hkv, G, 2D), (B, Hkv, N, 2D)
    if summaries.numel() > 1 << 20:
        return torch.matmul(summaries, qq.transpose(-1, -2)).transpose(-1, -2)  # (B, Hkv, G, N)
    return torch.matmul(qq, summaries.transpose(-1, -2))  # (B, Hkv, G, N)


def page_mass(q: torch.Tensor, cache, scale: float) -> torch.Tensor:
    """Each page's share of the softmax of q (B, Hkv, G, D) over every cached key: (B, Hkv, G, N).

    Reads all of K: the oracle a page choice is measured against.
    """
    B, Hkv, G, _ = q.shape
    N, P, L = cache.num_pages, cache.page_size, cache.length
    logits = torch.matmul(q.to(cache.dtype).float(), cache.keys.float().transpose(-1, -2)) * scale  # (B, Hkv, G, L)
    probs = torch.nn.functional.pad(torch.softmax(logits, dim=-1), (0, N * P - L))  # (B, Hkv, G, N*P)
    return probs.view(B, Hkv, G, N, P).sum(-1)  # (B, Hkv, G, N)


def rankable(bounds: torch.Tensor) -> torch.Tensor:
    """A copy of page bounds safe to rank, forced pages aside: a non-finite key's bound never
    outranks the pages that are always read (+inf): nan ranks last, -inf just above it (the lowest
    finite value), +inf just below the forced pages (the highest).

        >>> rankable(torch.tensor([1., float("nan"), float("inf"), float("-inf")]))
        tensor([ 1.0000e+00,        -inf,  3.4028e+38, -3.4028e+38])
    """
    big = torch.finfo(bounds.dtype).max
    return bounds.nan_to_num(nan=float("-inf"), posinf=big, neginf=-big)


def forced_ranking(bounds: torch.Tensor, first_recent: int | None = None) -> torch.Tensor:
    """(B, Hsel, N) bounds -> the copy the pages are ranked by: `rankable`, with the forced pages
    (page 0, pages first_recent.., default the last page) at +inf above every other.

        >>> forced_ranking(torch.tensor([[[2., float("inf"), 1., 3.]]]))
        tensor([[[       inf, 3.4028e+38, 1.0000e+00,        inf]]])
    """
    N = bounds.shape[-1]
    ranked = rankable(bounds)  # (B, Hsel, N)
    ranked[..., 0] = float("inf")  # sinks
    ranked[..., N - 1 if first_recent is None else first_recent:] = float("inf")  # the most recent tokens
    return ranked


def choose_pages(bounds: torch.Tensor, n: int, first_recent: int | None = None) -> torch.Tensor:
    """Page 0, pages first_recent.. (default: the last page) and the best others by score.

        >>> choose_pages(torch.tensor([[[1., 5., 5., 5., 0.]]]), 3)  # page 0, the last, the lower 5
        tensor([[[0, 1, 4]]])

    (B, Hsel, N) -> (B, Hsel, n) ascending; n counts the forced pages too. The one page-choice rule
    (the Triton path calls it; fused_decode.cpp's `choose` follows it, tests/test_page_choice_rule.py
    holds them equal): the forced pages, then the others by `forced_ranking`, a tie going to the
    lower page (select/ties.py's rule: the lower index wins).
    """
    B, Hsel, N = bounds.shape
    if n >= N:
        return torch.arange(N, device=bounds.device).expand(B, Hsel, N)  # (B, Hsel, N)
    ranked = forced_ranking(bounds, first_recent)  # (B, Hsel, N)
    top = ranked.topk(n, dim=-1, sorted=False)  # (B, Hsel, n) the n best, any of several equal ones
    edge = top.values.amin(dim=-1, keepdim=True)  # (B, Hsel, 1) the n-th best
    if ranked.is_cpu and int(torch.count_nonzero(ranked >= edge)) == B * Hsel * n:  # no tie across the cut
        return top.indices.sort(dim=-1).values  # (B, Hsel, n): the n best are unique
    keep = keep_ties(ranked > edge, ranked == edge, n)  # (B, Hsel, N) the lower pages of a tie
    return keep.to(torch.uint8).sort(dim=-1, descending=True, stable=True).indices[..., :n]  # (B, Hsel, n) ascending


def estimated_mass(bounds: torch.Tensor, scale: float, length: int, page_size: int) -> torch.Tensor:
    """(B, Hsel, N) bounds -> (B, Hsel, N) float32 weights w_p = tokens_p * exp(scale * (r_p - max r)),
    r = `rankable(bounds)` (a nan bound weighs 0); all zero where every bound is nan. The auto budget's
    estimate of each page's attention mass (up to the row's sum): every key of a page scores at most its
    bound, so tokens_p * exp(scale * bound_p) bounds the page's unnormalised softmax mass.

        >>> estimated_mass(torch.tensor([[[0., 0., float("nan")]]]), 1.0, 10, 4)
        tensor([[[4., 4., 0.]]])
    """
    N = bounds.shape[-1]
    r = rankable(bounds)  # (B, Hsel, N) nan -> -inf
    top = r.amax(dim=-1, keepdim=True)  # (B, Hsel, 1)
    tokens = torch.full((N,), float(page_size), device=bounds.device)  # (N,)
    tokens[-1] = float(last_page_tokens(length, page_size))
    w = torch.exp((r - top) * scale) * tokens  # (B, Hsel, N); -inf - -inf: nan
    return torch.where(top > float("-inf"), w, 0.0)  # (B, Hsel, N)


def mass_counts(bounds: torch.Tensor, n: int, first_recent: int, mass: float, min_pages: int, scale: float,
                length: int, page_size: int, *, probabilities: bool = False) -> torch.Tensor:
    """(B, Hsel) pages each selection head reads under the auto budget: the one rule of every path.

        >>> b = torch.tensor([[[9., 0., 8., 0., 0., 0.]]])      # page 0 forced; page 2 holds most of the rest
        >>> mass_counts(b, 6, 5, 0.9, 1, 1.0, 24, 4), mass_counts(b, 6, 5, 0.9, 4, 1.0, 24, 4)
        (tensor([[3]]), tensor([[4]]))

    The pages in the order `choose_pages` ranks them (the forced pages, then by `forced_ranking`, a
    tie to the lower page) are taken until their weights (`estimated_mass`; with probabilities=True the
    scores themselves, e.g. the oracle's true masses) summed in that order, in float64, reach `mass`
    times the row's float64 sum; then at least max(min_pages, forced pages) and at most n pages. A row
    whose weights are all 0 reads the floor.
    """
    N = bounds.shape[-1]
    forced = min(n, 1 + N - max(1, min(first_recent, N - 1)))  # page 0 and pages first_recent..
    w = bounds.float().clamp(min=0).nan_to_num(0.0) if probabilities else \
        estimated_mass(bounds, scale, length, page_size)  # (B, Hsel, N)
    w = w.double()
    order = forced_ranking(bounds, first_recent).sort(dim=-1, descending=True, stable=True).indices  # (B, Hsel, N)
    walked = w.gather(-1, order).cumsum(-1)  # (B, Hsel, N) mass of the first i + 1 pages in rank order
    need = (walked < mass * w.sum(-1, keepdim=True)).sum(-1) + 1  # (B, Hsel) pages that reach the share
    return need.clamp(min=max(min_pages, forced), max=n).clamp(max=N)  # (B, Hsel)


def choose_by_mass(bounds: torch.Tensor, n: int, first_recent: int, mass: float, min_pages: int, scale: float,
                   length: int, page_size: int, *, probabilities: bool = False) -> torch.Tensor:
    """(B, Hsel, N) bounds -> pages (B, Hsel, n): each head's `mass_counts` pages (the same as
    `choose_pages(bounds, count, first_recent)` for that head) ascending, then -1 up to n.

        >>> choose_by_mass(torch.tensor([[[9., 0., 8., 0., 0., 0.]]]), 6, 5, 0.9, 1, 1.0, 24, 4)
        tensor([[[ 0,  2,  5, -1, -1, -1]]])
    """
    counts = mass_counts(bounds, n, first_recent, mass, min_pages, scale, length, page_size,
                         probabilities=probabilities)  # (B, Hsel)
    order = forced_ranking(bounds, first_recent).sort(dim=-1, descending=True, stable=True).indices[..., :n]
    keep = torch.arange(n, device=bounds.device) < counts[..., None]  # (B, Hsel, n)
    return sorted_pages(torch.where(keep, order, -1))  # (B, Hsel, n)


def sorted_pages(pages: torch.Tensor) -> torch.Tensor:
    """Page ids (B, Hsel, n) with -1 for none -> each row's pages ascending, then its -1s.

        >>> sorted_pages(torch.tensor([[[5, -1, 0, 2]]]))
        tensor([[[ 0,  2,  5, -1]]])
    """
    big = torch.iinfo(pages.dtype).max
    out = torch.where(pages < 0, big, pages).sort(dim=-1).values  # (B, Hsel, n)
    return torch.where(out == big, -1, out)


def page_counts(pages: torch.Tensor) -> torch.Tensor:
    """(B, Hsel, n) pages (-1: none) -> (B, Hsel) int64: how many each selection head read."""
    return (pages >= 0).sum(-1)
