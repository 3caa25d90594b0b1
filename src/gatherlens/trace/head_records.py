"""Plain records of the head gallery: every layer and head of one run, measured and mapped small.

    >>> tile = HeadTile(layer=3, head=1, tag="previous", kept=0.93, sink=0.02, previous=0.97,
    ...                 copying=None, entropy=0.08, grid=((15, -1), (0, 15)))
    >>> gallery = HeadGallery(layers=1, heads=2, top_k=4, dense_run=False, levels=16,
    ...                       tiles=(tile, ...), layer=3, head=1)
    >>> gallery.tile(3, 1).tag                          # drawn by gatherlens.render.gallery
    'previous'

gatherlens.report.heads measures the tiles from the run's scores (the rules live there, once);
gatherlens.render.gallery draws them. Every field is plain data (ints, floats, strings, tuples).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEAD_TAGS", "HeadTile", "HeadGallery"]

# what a head does, as the gallery names it: the measured rules (report/heads.py) pick one
HEAD_TAGS = ("sink", "previous", "copying", "broad", "mixed")


@dataclass(frozen=True)
class HeadTile:
    """One head of one layer: its tag, the measured shares, and its small score map.

    grid[r][c]: the dense weight query block r puts on key block c, as a level in
    [0, levels - 1] (level / (levels - 1) is the weight); -1 where no query of the block may see
    any key of it (the causal triangle). Shares are None where the text gives nothing to
    measure (too short, or no repeated token for copying).
    """

    layer: int
    head: int
    tag: str                      # one of HEAD_TAGS
    kept: float                   # mean share of dense weight the run's top-k kept, per query
    sink: float | None            # mean dense weight on key 0
    previous: float | None        # mean dense weight on key i - 1
    copying: float | None         # mean dense weight on the keys after earlier copies of token i
    entropy: float | None         # mean entropy of a query's dense weights / log(allowed keys)
    grid: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class HeadGallery:
    """Every head of a run, layer-major (tiles[layer * heads + head]), and the head the report shows."""

    layers: int
    heads: int
    top_k: int                    # the k the run kept (the kept shares are at this k)
    dense_run: bool               # top-k was off: every kept share is 1
    levels: int                   # grid levels: 0 .. levels - 1
    tiles: tuple[HeadTile, ...]
    layer: int = 0                # the head the report's sections open with
    head: int = 0
    kinds: tuple[tuple[str, int | None], ...] = ()   # per layer (kind, window): "full", "sliding", "chunked"

    def tile(self, layer: int, head: int) -> HeadTile:
        return self.tiles[layer * self.heads + head]

    @property
    def size(self) -> int:
        """Cells per side of every tile's grid."""
        return len(self.tiles[0].grid) if self.tiles else 0
