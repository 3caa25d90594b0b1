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

__all__ = ["SequenceLayout", "split_sequence"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
        return tuple(_cdiv(n, self.page_size) for n in self.lengths)

    @property
    def page_offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for n in self.pages_per_rank:
            out.append(acc)
            acc += n
        return tuple(out)

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


def split_sequence(length: int, world_size: int, page_size: int) -> list[int]:
    """Tokens per rank for `length` tokens over `world_size` ranks: whole pages, as even as can be.

        >>> split_sequence(20, 4, 16)
        [16, 4, 0, 0]

    Pages are dealt like torch.chunk deals rows: ceil(pages / W) to each rank in order, the
    last non-empty rank taking the rest (with the partial last page); trailing ranks may get none.
    """
    for name, v, low in (("length", length, 0), ("world_size", world_size, 1), ("page_size", page_size, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise GatherValueError(f"{name} = {v!r} must be an int >= {low}")
    per = _cdiv(_cdiv(length, page_size), world_size) * page_size  # tokens per full rank
    out, left = [], length
    for _ in range(world_size):
        out.append(min(per, left))
        left -= out[-1]
    return out
