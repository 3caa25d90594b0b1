"""Plain records of the `explain` story that are not single gathers: the head groups, one head's
score grid and the terminal summary. gatherlens.report builds them from its story;
gatherlens.render draws them (render/report_figures.py, render/summary.py).

    >>> HeadMap(9, 3).groups                           # which query heads read which KV head
    [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    >>> grid = ScoreGrid(layer=1, head=0, top_k=2, query=2, scores=s, dense=d, allowed=a,
    ...                  indices=i, labels=("The", "␣cat", "␣sat"))   # (Q, L), (Q, k) tensors
    >>> scores_svg(grid, lang="zh")                    # gatherlens.render.report_figures

Every field is plain data (ints, floats, strings, tuples, tensors): a picture reads these
fields only, never the object the story was collected in.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["HeadMap", "ScoreGrid", "TokenRow", "LookupLine", "KeyRow", "TopKeys", "Candidate",
           "NextToken", "GatherLine", "ExplainSummary"]


@dataclass(frozen=True)
class HeadMap:
    """Which query heads share which KV head (grouped-query attention)."""

    q_heads: int
    kv_heads: int

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def groups(self) -> list[list[int]]:
        """groups[g] = the query heads that read KV head g."""
        return [list(range(g * self.group, (g + 1) * self.group)) for g in range(self.kv_heads)]

    def kv_of(self, head: int) -> int:
        return head // self.group


@dataclass(frozen=True, eq=False)
class ScoreGrid:
    """One head of one layer as the score grid shows it: every score, the dense weight of every
    cell, the allowed cells and the keys top-k kept; `labels` names the positions (the last L
    label the keys, the last Q the queries; fewer labels than positions: numbers are shown). A long
    text's grid is a window (row0, col0 into `queries` x `keys`); a local layer's grid marks its window."""

    layer: int
    head: int
    top_k: int
    query: int                 # the query position drawn in detail (its row is bold)
    scores: torch.Tensor       # (Q, L) scaled logits, -inf where not allowed
    dense: torch.Tensor        # (Q, L) softmax over all allowed keys
    allowed: torch.Tensor      # (Q, L) bool
    indices: torch.Tensor      # (Q, k) kept key positions, best first, -1 = none
    labels: tuple[str, ...]
    row0: int = 0              # a window of a long text: its first row's index among every query row
    col0: int = 0              # ... and its first key column's
    queries: int = 0           # every query row of the run (0: the grid's own Q)
    keys: int = 0              # every key of the run (0: the grid's own L)
    kind: str = "full"         # the layer's kind: "full" (global), "sliding" or "chunked"
    window: int | None = None  # a local layer's window


# -- the terminal summary of `gatherlens explain` ----------------------------------------------
@dataclass(frozen=True)
class TokenRow:
    """One token: as shown, its id, and the first values of the word-table row it gathers."""

    token: str
    id: int
    values: tuple[float, ...] = ()


@dataclass(frozen=True)
class LookupLine:
    """One embedding lookup: where, the table's shape, the ids looked up, bytes per table row
    (d x element size for a float table; the blocks of a row for a GGUF table)."""

    module: str
    table_shape: tuple[int, int]
    ids: tuple[int, ...]
    row_bytes: int


@dataclass(frozen=True)
class KeyRow:
    """A key one query kept: its position, token, score, top-k weight and dense weight."""

    key: int
    token: str
    score: float
    weight: float
    dense: float


@dataclass(frozen=True)
class TopKeys:
    """The keys one query of one head kept, and the share of the dense weight they hold."""

    layer: int
    head: int
    kv_head: int
    query: int
    query_token: str
    top_k: int
    rows: tuple[KeyRow, ...]
    mass: float


@dataclass(frozen=True)
class Candidate:
    """A next-token candidate: id, token as shown, probability."""

    id: int
    token: str
    prob: float


@dataclass(frozen=True)
class NextToken:
    """The best next tokens after `after` with top-k attention (k = top_k) and with dense."""

    after: str
    top_k: int
    top: tuple[Candidate, ...]
    dense: tuple[Candidate, ...]


@dataclass(frozen=True)
class GatherLine:
    """One row of the table of every gather: op, module ("" = top level), calls, bytes read."""

    op: str
    module: str
    count: int
    bytes_read: int


@dataclass(frozen=True)
class ExplainSummary:
    """What the terminal summary of `explain` prints, section by section."""

    model_name: str
    model_class: str
    text: str
    table: str                     # the word table's name ("W_tok"); "" without a word lookup
    width: int                     # d: values in one row of that table
    tokens: tuple[TokenRow, ...]
    lookups: tuple[LookupLine, ...]
    heads: HeadMap
    keys: TopKeys
    next_token: NextToken | None   # None for an encoder
    gathers: tuple[GatherLine, ...]
    events: int
    bytes_read: int
