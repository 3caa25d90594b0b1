"""What dense, top-k and page-selected sparse attention keep for one query, as a plain record.

    >>> rec = KeepComparison(layer=15, head=3, query=40, query_token="␣was", dense=w, topk=(40, 0, 7),
    ...                      pages=(0, 3, 10), page_size=4, budget=16, topk_error=0.02,
    ...                      sparse_error=0.11, labels=labels)
    >>> keep_comparison_svg(rec, lang="zh")            # gatherlens.render.keep_compare
    >>> rec.topk_mass, rec.sparse_tokens               # dense weight the top-k keys hold; the pages' keys

gatherlens.report.keep_compare builds it from a run (the real top-k picks, the pages the real
sparse_decode chooses, the outputs of all three); render draws it. Plain data only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KeepComparison"]


@dataclass(frozen=True)
class KeepComparison:
    """One query of one head: the dense weight of every key, the keys top-k kept, the pages sparse
    decoding read, and how far the top-k and sparse outputs are from the dense one."""

    layer: int
    head: int
    query: int
    query_token: str
    dense: torch.Tensor           # (L,) float32 dense weight of every key (0 where not allowed)
    topk: tuple[int, ...]         # keys top-k kept, best first
    pages: tuple[int, ...]        # pages sparse decoding read (ascending)
    page_size: int
    budget: int
    topk_error: float             # ||o_topk - o_dense|| / ||o_dense|| (relative L2 over Dv)
    sparse_error: float           # ||o_sparse - o_dense|| / ||o_dense||
    labels: tuple[str, ...] = ()  # the L key tokens (shown), or () for numbers only
    seen: int = 0                 # keys the sparse step's cache held (up to the query's last allowed key); 0: L
    ring: tuple[int, int] | None = None   # a local layer: the window [a, b) its ring holds, read densely (no pages)
    kind: str = "full"            # the layer's kind: "full", "sliding" or "chunked"
    window: int | None = None     # a local layer's window

    @property
    def length(self) -> int:
        return int(self.dense.numel())

    @property
    def sparse_tokens(self) -> tuple[int, ...]:
        """The key positions the chosen pages hold (the last page may be partial)."""
        if self.ring is not None:
            return tuple(range(*self.ring))
        P, L = self.page_size, self.seen or self.length
        return tuple(j for p in self.pages for j in range(p * P, min((p + 1) * P, L)))

    @property
    def topk_mass(self) -> float:
        """The share of the dense weight on the top-k keys."""
        return float(self.dense[list(self.topk)].sum()) if self.topk else 0.0

    @property
    def sparse_mass(self) -> float:
        """The share of the dense weight on the keys of the chosen pages."""
        keys = list(self.sparse_tokens)
        return float(self.dense[keys].sum()) if keys else 0.0
