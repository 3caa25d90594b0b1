"""Which pages a sparse decode step read, as plain data.

    >>> out, sel = sparse_decode(q, cache, budget=2048, return_selection=True)
    >>> sel.pages[0, 0]          # page ids KV group 0 of batch 0 read, ascending
    >>> sel.token_positions(0, 0)  # the key positions those pages hold
    >>> sel.to_svg(head=0)       # its picture (Drawable: drawn by gatherlens.render on call)
    >>> gatherlens.trace.as_record(sel, head=0)   # the record that picture is drawn from

Data only: this module imports neither `trace/` nor `render/`; the pictures come from the
`Drawable` mixin's one lazy call into `gatherlens.render.draw`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gatherlens.drawable import Drawable

from .config import OP
from .geometry import page_count, tokens_read


@dataclass
class PageSelection(Drawable):
    """The pages one decode step gathered, per (batch, selection head).

    pages:      (B, Hsel, n) int64 page ids, ascending; always holds page 0 and the last page. The auto
                budget (mass not None): each head's own pages ascending, then -1 up to n (`counts`).
                Hsel = kv_heads when `share_selection` (the G query heads of a KV group read the
                same pages), else query_heads.
    bounds:     (B, Hsel, num_pages) float32 upper bound of the (unscaled) q.k in every page,
                the score the choice was made by (group-reduced by `group_score` when shared).
    lse:        (B, Hq, 1) float32 log-sum-exp of the scaled logits over the tokens read.
    page_size:  tokens per page.
    length:     tokens in the cache (the last page holds length - (num_pages - 1) * page_size).
    budget:     the token budget asked for.
    query_heads, kv_heads: Hq and Hkv.
    share_selection, group_score, recent, choose, mass, min_pages: how the choice was made (see
                sparse_decode); with choose="oracle", `bounds` holds each page's true attention mass instead.
    """

    pages: torch.Tensor
    bounds: torch.Tensor
    lse: torch.Tensor
    page_size: int
    length: int
    budget: int
    query_heads: int
    kv_heads: int
    share_selection: bool = OP.share_selection
    group_score: str = OP.group_score
    meta: dict = field(default_factory=dict)
    recent: int = OP.recent
    choose: str = OP.choose
    mass: float | None = None
    min_pages: int = 1

    @property
    def num_pages(self) -> int:
        return page_count(self.length, self.page_size)

    @property
    def counts(self) -> torch.Tensor:
        """(B, Hsel) int64: pages each selection head read (all n for a fixed budget)."""
        return (self.pages >= 0).sum(-1)

    @property
    def tokens_read(self) -> int:
        """Key/value rows each selection head read (the last page may be partial); the auto budget:
        the most any head read."""
        return tokens_read(int(self.counts.max()) if self.pages.numel() else 0, self.page_size, self.length)

    def mask(self) -> torch.Tensor:
        """(B, Hsel, num_pages) bool: True for the pages that were read."""
        m = torch.zeros(self.bounds.shape[:-1] + (self.bounds.shape[-1] + 1,), dtype=torch.bool,
                        device=self.pages.device)  # one more column: where the -1 padding lands
        return m.scatter_(-1, torch.where(self.pages < 0, self.bounds.shape[-1], self.pages), True)[..., :-1]

    def token_positions(self, batch: int = 0, head: int = 0) -> torch.Tensor:
        """(tokens_read,) int64: the key positions one selection head read, ascending."""
        P = self.page_size
        pages = self.pages[batch, head]  # (n,)
        pos = pages[pages >= 0].unsqueeze(-1) * P + torch.arange(P, device=self.pages.device)
        pos = pos.reshape(-1)  # (n * P,)
        return pos[pos < self.length]

    def __repr__(self) -> str:
        B, Hsel, n = self.pages.shape
        if self.mass is not None:
            c = self.counts.float()
            n = f"{c.mean():.1f} (auto, {int(c.min())}..{int(c.max())})"
        return (f"PageSelection(pages={n} of {self.num_pages} per head, tokens_read={self.tokens_read} "
                f"of {self.length}, page_size={self.page_size}, budget={self.budget}, "
                f"batch={B}, selection_heads={Hsel}, share_selection={self.share_selection})")
