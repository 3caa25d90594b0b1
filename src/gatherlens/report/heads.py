"""What each head does, measured from its scores: the one home of the head gallery's rules.

    >>> gallery = head_gallery(story)                  # every layer and head of a Story
    >>> gallery.tile(15, 3).tag, round(gallery.tile(15, 3).kept, 2)
    ('sink', 0.91)
    >>> measure_layer(0, scores, picks, ids)[0].tag    # (H, Q, L) scores of one layer
    'previous'

Each head's dense weights (softmax over the allowed keys) are measured on the queries at
positions t >= 2, where key 0, key t - 1 and the query itself are three different keys:
- sink: the mean weight on key 0 (the first token);
- previous: the mean weight on key t - 1;
- copying (induction): for queries whose token occurred earlier at some p, the mean weight on
  the keys p + 1 right after those copies (keys t - 1 and t left out: previous and self);
- entropy: the mean entropy of the weights over the allowed keys, divided by its most,
  log(allowed keys), so 1 is perfectly even.
The first rule of `HeadRules.tag` that holds names the head: copying >= 40%, previous >= 50%,
sink >= 50%, entropy >= 0.8 ("broad"), else "mixed". `kept` is the mean share of the dense
weight the run's own top-k picks hold, over every query. Up to `HeadRules.rows` (128) queries
every row is measured (the offline page's every text); a longer live text is measured on 128
query rows evenly spaced. docs/guide.md says the same for readers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.errors import GatherValueError
from gatherlens.report.scores import score_rows
from gatherlens.trace.head_records import HEAD_TAGS, HeadGallery, HeadTile

__all__ = ["HeadRules", "RULES", "measure_layer", "measured_rows", "head_gallery", "gallery_data"]


@dataclass(frozen=True)
class HeadRules:
    """Thresholds of the head tags (shares of dense weight, entropy as a share of its most) and
    the size of the small maps: at most `grid` x `grid` blocks, weights as `levels` levels."""

    copying: float = 0.4
    previous: float = 0.5
    sink: float = 0.5
    broad: float = 0.8
    grid: int = 16
    levels: int = 16
    rows: int = 128            # most query rows measured (evenly spaced past it: long live texts)

    def __post_init__(self):
        for name in ("copying", "previous", "sink", "broad"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 < v <= 1.0:
                raise GatherValueError(f"HeadRules: {name} = {v!r} is outside the valid range (0, 1]")
        for name, lo, hi in (("grid", 1, 256), ("levels", 2, 256), ("rows", 2, 1 << 20)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise GatherValueError(f"HeadRules: {name} = {v!r} is outside the valid range [{lo}, {hi}]")

    def tag(self, sink: float | None, previous: float | None, copying: float | None,
            entropy: float | None) -> str:
        """The first rule that holds: copying, previous, sink, broad; else "mixed".

            >>> RULES.tag(sink=0.9, previous=0.05, copying=None, entropy=0.1)
            'sink'
        """
        for name, share, least in (("copying", copying, self.copying),
                                   ("previous", previous, self.previous), ("sink", sink, self.sink),
                                   ("broad", entropy, self.broad)):
            if share is not None and share >= least:
                return name
        return "mixed"


RULES = HeadRules()


def _mean(values: torch.Tensor, rows: torch.Tensor) -> list[float | None]:
    """Per head, the mean of values (H, Q) over the rows (Q,) marked; None when none is."""
    if not bool(rows.any()):
        return [None] * values.shape[0]
    return values[:, rows].mean(-1).tolist()                                # (H,)


def _copy_targets(ids: list[int], t: torch.Tensor, L: int) -> torch.Tensor:
    """(R, L) bool: key j follows an earlier copy of the token at position t (j - 1 holds it), j <= t - 2."""
    key_ids = torch.tensor(ids[len(ids) - L:])                              # (L,)
    j = torch.arange(L).unsqueeze(0)                                        # (1, L)
    before = torch.cat([key_ids.new_full((1,), -1), key_ids[:-1]])          # (L,) token at j - 1
    same = before.unsqueeze(0) == key_ids[t].unsqueeze(1)                   # (R, L)
    return same & (j >= 1) & (j <= t.unsqueeze(1) - 2)


def _blocks(n: int, g: int) -> torch.Tensor:
    """(g, n) averaging matrix: row b has 1/size on the positions of block b (near-equal blocks)."""
    of = torch.arange(n) * g // n                                           # (n,) block of each position
    onehot = torch.nn.functional.one_hot(of, g).T.float()                   # (g, n)
    return onehot / onehot.sum(-1, keepdim=True)


def _maps(dense: torch.Tensor, allowed: torch.Tensor, rules: HeadRules) -> list:
    """Per head, the (Gq, Gk) grid of levels: the weight a query block puts on a key block."""
    H, Q, L = dense.shape
    rows = _blocks(Q, min(rules.grid, Q))                                   # (Gq, Q)
    cols = (_blocks(L, min(rules.grid, L)) > 0).float()                     # (Gk, L)
    weight = rows @ dense @ cols.T                                          # (H, Gq, Gk)
    seen = ((rows > 0).float() @ allowed.float() @ cols.T) > 0              # (Gq, Gk)
    top = rules.levels - 1
    level = (weight.clamp(0, 1) * top).round().to(torch.int64)             # (H, Gq, Gk)
    level = level.masked_fill(~seen, -1)
    return [tuple(tuple(r) for r in head) for head in level.tolist()]


def measure_layer(layer: int, scores: torch.Tensor, picks: torch.Tensor, ids: list[int],
                  rules: HeadRules = RULES, positions: torch.Tensor | None = None) -> list[HeadTile]:
    """Every head of one layer measured: scores (H, Q, L) with -inf where not allowed, picks
    (H, Q, k) the keys the run kept (-1 = none), ids the text's token ids (the last L are the keys),
    positions (Q,) the key position of each score row (default: the last Q positions).

        >>> [t.tag for t in measure_layer(0, scores, picks, ids)]
        ['sink', 'previous', 'mixed', ...]
    """
    H, Q, L = scores.shape
    allowed = scores > float("-inf")                                        # (H, Q, L)
    dense = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0)           # (H, Q, L)
    t = torch.arange(Q) + (L - Q) if positions is None else positions.long()  # (Q,) query positions
    n_allowed = allowed.sum(-1)                                             # (H, Q)
    rows = (t >= 2) & (n_allowed[0] >= 2)                                   # (Q,) measured queries
    sink = dense[..., 0]                                                    # (H, Q)
    prev = dense.gather(-1, (t - 1).clamp(min=0).expand(H, Q).unsqueeze(-1)).squeeze(-1)  # (H, Q)
    targets = _copy_targets(ids, t, L)                                      # (Q, L)
    copying = (dense * targets).sum(-1)                                     # (H, Q)
    logs = torch.where(dense > 0, dense.log(), torch.zeros_like(dense))     # (H, Q, L)
    entropy = -(dense * logs).sum(-1) / n_allowed.clamp(min=2).float().log()  # (H, Q)
    ok = picks >= 0                                                         # (H, Q, k)
    kept = (dense.gather(-1, picks.clamp(min=0)) * ok).sum(-1)              # (H, Q)
    any_row = n_allowed[0] > 0                                              # (Q,)
    shares = zip(_mean(sink, rows), _mean(prev, rows), _mean(copying, rows & targets.any(-1)),
                 _mean(entropy, rows), _mean(kept, any_row), _maps(dense, allowed[0], rules))
    return [HeadTile(layer=layer, head=h, tag=rules.tag(s, p, c, e), kept=k or 0.0, sink=s,
                     previous=p, copying=c, entropy=e, grid=g)
            for h, (s, p, c, e, k, g) in enumerate(shares)]


def measured_rows(Q: int, rules: HeadRules = RULES) -> torch.Tensor:
    """(R,) the query rows a head is measured on: all of them, or `rules.rows` evenly spaced."""
    if Q <= rules.rows:
        return torch.arange(Q)
    return torch.linspace(0, Q - 1, rules.rows).round().long()              # (rows,) first and last kept


def _layers(story, rules: HeadRules):
    """(scores (H, R, L), picks (H, R, k), positions (R,)) of every layer on the measured rows:
    from the run's q and k (story.tensors, any length) or the page's full grids (story.explore)."""
    run = getattr(story, "tensors", None)
    if run is None:
        x = story.explore
        for layer in range(x.scores.shape[0]):
            yield x.scores[layer], x.picks[layer], None
        return
    N, _, Q, L = run.shape
    rows = measured_rows(Q, rules)                                          # (R,)
    for layer in range(N):
        q = run.query[layer][:, rows]                                       # (Hq, R, D)
        yield (score_rows(q, run.key[layer], run.scales[layer], run.allowed(layer)[rows]),
               run.picks[layer][:, rows].long(), rows + (L - Q))


def head_gallery(story, rules: HeadRules = RULES) -> HeadGallery:
    """The gallery of a Story (gatherlens.report.collect): every layer and head, measured."""
    tiles = [tile for layer, (scores, picks, positions) in enumerate(_layers(story, rules))
             for tile in measure_layer(layer, scores, picks, story.ids, rules, positions)]
    x = getattr(story, "tensors", None) or story.explore
    return HeadGallery(layers=len(tiles) // story.heads.q_heads, heads=story.heads.q_heads,
                       top_k=x.run_k, dense_run=x.dense_run, levels=rules.levels,
                       tiles=tuple(tiles), layer=story.attention.layer, head=story.attention.head,
                       kinds=tuple((k.kind, k.window) for k in story.tensors.kinds) if story.tensors else ())


def gallery_data(gallery: HeadGallery, rules: HeadRules = RULES) -> dict:
    """JSON-ready: the rules, then per layer and head the tag, the kept share, the measured
    shares and the small map (levels 0 .. levels - 1, -1 where not allowed)."""
    def r(v):
        return None if v is None else round(v, 4)

    return {"layers": gallery.layers, "heads": gallery.heads, "top_k": gallery.top_k,
            "dense_run": gallery.dense_run, "levels": gallery.levels, "tags": list(HEAD_TAGS),
            "layer_kinds": [{"kind": k, "window": w} for k, w in gallery.kinds],
            "rules": {k: getattr(rules, k) for k in ("copying", "previous", "sink", "broad", "grid", "rows")},
            "tiles": [{"layer": t.layer, "head": t.head, "tag": t.tag, "kept": r(t.kept),
                       "sink": r(t.sink), "previous": r(t.previous), "copying": r(t.copying),
                       "entropy": r(t.entropy), "map": [list(row) for row in t.grid]}
                      for t in gallery.tiles]}
