"""A layer that needs nearly every page reads them all for a while: sparse decode's one dense-run rule.

    >>> budget = step_budget(config, cache, length, layer)   # the step's budget: `length` (dense) during a run
    >>> note_step(config, cache, budget, pages)               # after the step: its pages (B, Hsel, n) or None

Where attention is flat (the random-weight models of the bench; some layers of real ones), the heads of
the auto budget need nearly every page. Scoring every page, choosing and masking then cost more than
reading every page, and dense attention is exact. So after a sparse step whose KV groups needed at least
`dense_cover` of the layer's pages (each group the union of its heads' choices), the layer decodes
densely for `dense_steps` steps, then chooses again (`SparseConfig.dense_run` is the rule; the state is
the layer's `PagedKVCache.dense_left`). Every decode path applies it the same way: the C++ stack
(models/runtime/step.py, decode_stack.cpp's covered_pages counts the same union) and the per-layer path
(models/attention/sparse.py). A dense step counts every page as read.
"""
from __future__ import annotations

import torch

from gatherlens.ops.sparse.config import SparseConfig
from gatherlens.ops.sparse.decode import reads_every_page

__all__ = ["step_budget", "covered_pages", "note_cover", "note_step"]


def step_budget(config: SparseConfig, cache, length: int, layer: int | None = None) -> int:
    """The budget a step of `layer` over `length` tokens runs with: config.budget_for's, or `length` (dense)
    while the layer's cache has dense steps left (one is used).

        >>> cache.dense_left = 2; step_budget(SparseConfig(512), cache, 9000, layer=5), cache.dense_left
        (9000, 1)
    """
    budget = config.budget_for(length, layer)
    if budget >= length or getattr(cache, "dense_left", 0) <= 0:
        return budget
    cache.dense_left -= 1
    return length


def covered_pages(pages: torch.Tensor, kv_heads: int, num_pages: int) -> int:
    """The pages a step's KV groups needed, summed over batch rows and groups: each group the union of its
    selection heads' pages. pages (B, Hsel, n), Hsel a multiple of kv_heads, -1 padding not counted.

        >>> covered_pages(torch.tensor([[[0, 1, -1], [1, 2, 3]]]), 1, 4), covered_pages(torch.tensor([[[0, 1], [1, 2]]]), 2, 4)
        (4, 4)
    """
    B, Hsel, n = pages.shape  # (B, Hsel, n)
    rows = pages.reshape(B * kv_heads, (Hsel // kv_heads) * n)  # (B*Hkv, G*n): a group's pages in one row
    marks = torch.zeros(B * kv_heads, num_pages + 1, dtype=torch.bool, device=pages.device)  # the last: none
    marks.scatter_(1, torch.where((rows >= 0) & (rows < num_pages), rows, num_pages), True)
    return int(marks[:, :num_pages].sum())


def note_cover(config: SparseConfig, cache, covered: int) -> None:
    """After a sparse step of cache's layer that needed `covered` pages (covered_pages): the steps it reads
    densely next (config.dense_run over the cache's batch x KV heads x pages)."""
    cache.dense_left = config.dense_run(covered, cache.batch * cache.kv_heads * cache.num_pages)


def note_step(config: SparseConfig, cache, budget: int, pages: torch.Tensor | None) -> None:
    """After a step of cache's layer that ran with `budget` and read `pages` (B, Hsel, n; None: not
    returned): note_cover when it chose pages (a budget that bought every page chose none); nothing to count
    where the config has no dense runs."""
    if config.dense_cover is not None and pages is not None and not reads_every_page(cache, budget,
                                                                                        config.choice.recent):
        note_cover(config, cache, covered_pages(pages, cache.kv_heads, cache.num_pages))
