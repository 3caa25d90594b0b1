"""Who holds which part of a sequence-sharded KV cache.

    >>> split_sequence(100, world_size=3, page_size=16)      # tokens each rank holds, in rank order
    [48, 48, 4]
    >>> lay = SequenceLayout(lengths=(48, 48, 4), page_size=16)
    >>> lay.page_offsets, lay.num_pages                       # first global page of each rank; all pages
    ((0, 3, 6), 7)

Rank r holds tokens sum(lengths[:r]) .. sum(lengths[:r + 1]) - 1. Every part before the last
non-empty one is a whole number of pages, so a rank's local page p is global page
page_offsets[r] + p and the pages of the whole cache are exactly the ranks' pages in rank order.
"""
from __future__ import annotations

from dataclasses import dataclass

from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse.geometry import page_offsets, pages_per_rank, split_sequence

__all__ = ["SequenceLayout", "split_sequence"]


@dataclass(frozen=True)
class SequenceLayout:
    """The token counts of every rank's part of one sequence, in rank order."""

    lengths: tuple[int, ...]
    page_size: int

    def __post_init__(self):
        P, L = self.page_size, self.lengths
        last = max((r for r, n in enumerate(L) if n), default=-1)
        for r in range(last):
            if L[r] % P:
                raise GatherValueError(
                    f"rank {r} holds {L[r]} tokens, not a whole number of pages (page_size = {P}); "
                    f"every rank's part but the last must be (lengths by rank: {list(L)})")
        if last < 0:
            raise GatherValueError(f"the sharded cache is empty on every rank (lengths {list(L)}); "
                                   f"append keys and values before decoding")

    @property
    def world_size(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        return sum(self.lengths)

    @property
    def pages_per_rank(self) -> tuple[int, ...]:
        return tuple(pages_per_rank(self.lengths, self.page_size))

    @property
    def page_offsets(self) -> tuple[int, ...]:
        return tuple(page_offsets(self.lengths, self.page_size))

    @property
    def token_offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for n in self.lengths:
            out.append(acc)
            acc += n
        return tuple(out)

    @property
    def num_pages(self) -> int:
        return sum(self.pages_per_rank)

    def owner(self, page: int) -> int:
        """The rank holding global page `page`."""
        for r, (off, n) in enumerate(zip(self.page_offsets, self.pages_per_rank)):
            if off <= page < off + n:
                return r
        raise GatherValueError(f"page {page} is outside the cache's pages [0, {self.num_pages})")
