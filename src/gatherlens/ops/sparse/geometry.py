"""Page geometry: the one home of every page-count rule (plain ints, no tensors needed).

    >>> page_count(100, 16)              # pages that hold 100 tokens, the last one partial
    7
    >>> page_range(6, 16, 100)           # the token positions [start, stop) of page 6
    (96, 100)
    >>> tokens_read(3, 16, 100)          # 2 whole pages + the partial last page (4 tokens)
    36
    >>> split_sequence(100, world_size=3, page_size=16)   # tokens each rank holds, in rank order
    [48, 48, 4]

A cache of `length` tokens in pages of `page_size` holds page_count(length, page_size) pages;
every page is full but the last, which holds length - (count - 1) * page_size tokens (1..page_size).
A sparse step always reads the last page, so n pages read hold tokens_read(n, ...) tokens.
Trace, dist, serve and bench take their page arithmetic from here; nothing else retypes it
(tests/test_architecture.py checks that).
"""
from __future__ import annotations

from gatherlens.errors import GatherValueError

__all__ = ["ceil_div", "page_count", "page_range", "last_page_tokens", "tokens_read", "split_sequence",
           "pages_per_rank", "page_offsets"]


def ceil_div(a: int, b: int) -> int:
    """The smallest integer >= a / b, for b > 0 (exact on ints, no floats).

        >>> ceil_div(100, 16), ceil_div(96, 16), ceil_div(0, 16)
        (7, 6, 0)
    """
    return -(-a // b)


def page_count(length: int, page_size: int) -> int:
    """Pages needed for `length` tokens (the last one may be partial; 0 tokens take 0 pages).

        >>> page_count(100, 16), page_count(96, 16), page_count(1, 16)
        (7, 6, 1)
    """
    return ceil_div(length, page_size)


def page_range(page: int, page_size: int, length: int) -> tuple[int, int]:
    """The token positions [start, stop) page `page` holds in a cache of `length` tokens.

        >>> page_range(0, 16, 100), page_range(6, 16, 100)
        ((0, 16), (96, 100))
    """
    n = page_count(length, page_size)
    if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < n:
        raise GatherValueError(f"page = {page!r} is outside the cache's pages [0, {n}) "
                               f"(length {length}, page_size {page_size})")
    start = page * page_size
    return start, min(start + page_size, length)


def last_page_tokens(length: int, page_size: int) -> int:
    """Tokens in the last (maybe partial) page: 1..page_size, or 0 for an empty cache.

        >>> last_page_tokens(100, 16), last_page_tokens(96, 16), last_page_tokens(0, 16)
        (4, 16, 0)
    """
    return length - max(page_count(length, page_size) - 1, 0) * page_size


def tokens_read(pages_read: int, page_size: int, length: int) -> int:
    """Key/value rows read by a step that read `pages_read` pages, the last (maybe partial) one among them.

        >>> tokens_read(3, 16, 100), tokens_read(7, 16, 100), tokens_read(50, 16, 100)
        (36, 100, 100)

    More pages than the cache holds read the whole cache; 0 pages read nothing.
    """
    n = min(pages_read, page_count(length, page_size))
    if n <= 0:
        return 0
    return (n - 1) * page_size + last_page_tokens(length, page_size)


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
    per = ceil_div(page_count(length, page_size), world_size) * page_size  # tokens per full rank
    out, left = [], length
    for _ in range(world_size):
        out.append(min(per, left))
        left -= out[-1]
    return out


def pages_per_rank(lengths, page_size: int) -> list[int]:
    """Pages each rank's part of a sequence takes, in rank order (`lengths`: tokens per rank).

        >>> pages_per_rank([48, 48, 4], 16)
        [3, 3, 1]
    """
    return [page_count(n, page_size) for n in lengths]


def page_offsets(lengths, page_size: int) -> list[int]:
    """The global id of each rank's first page: rank r's local page p is global page offsets[r] + p.

        >>> page_offsets([48, 48, 4], 16), page_offsets([16, 4, 0, 0], 16)
        ([0, 3, 6], [0, 1, 2, 2])
    """
    out, acc = [], 0
    for n in pages_per_rank(lengths, page_size):
        out.append(acc)
        acc += n
    return out
