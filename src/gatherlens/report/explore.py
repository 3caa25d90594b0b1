"""What the explorable report carries: every layer's and head's scores, compactly, for the page's script.

    >>> story = collect(lm, "The cat sat on the mat because it was", top_k=4)
    >>> data = story.explore.pack()          # JSON-ready: base64 float16 scores, int16 picks
    >>> sorted(data)[:4]
    ['allowed', 'causal', 'dv', 'heads']

The page lets a reader pick any layer, head and query and move k. Its script draws every
attention figure from this data, so the page needs no server:
- scores: the (Q, L) grid of every (layer, head), as float16, only the cells some head may
  look at (a causal model stores the lower triangle);
- picks: the keys the model's own top-k kept, per (layer, head, query), as int16 (-1 = none),
  so the page shows exactly what the model ran with at its k; for another k the script
  selects from the scores (best first, ties to the lower key, as the model does);
- values: the columns of every (layer, KV head)'s V that the value-gather figure shows.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

import torch

from gatherlens.report.scores import call_scale, layer_scores

__all__ = ["ExploreData", "explore_calls", "value_columns", "FORMAT_VERSION"]

FORMAT_VERSION = 1
SHOWN_COLUMNS = 6          # columns of V the value figure draws: the first five and the last


def value_columns(dv: int, shown: int = SHOWN_COLUMNS) -> list[int]:
    """The V columns the value figure draws: all when few, else the first shown-1 and the last."""
    return list(range(dv)) if dv <= shown else [*range(shown - 1), dv - 1]


@dataclass
class ExploreData:
    """Every layer and head of one run, as tensors; `pack()` makes the page's JSON of it."""

    layer_names: list[str]
    scores: torch.Tensor       # (N, Hq, Q, L) float32, -inf where not allowed
    allowed: torch.Tensor      # (Q, L) bool: cells any head of any layer may look at
    picks: torch.Tensor        # (N, Hq, Q, k) int64 keys the model's top-k kept, -1 = none
    values: torch.Tensor       # (N, Hkv, L, C) float32: the shown columns of V
    value_cols: list[int]
    dv: int
    scales: list[float]
    run_k: int
    causal: bool
    dense_run: bool = False    # the model ran with every allowed key (top-k off)
    meta: dict = field(default_factory=dict)

    def pack(self) -> dict:
        """JSON-ready data: shapes, then base64 little-endian arrays (see the module doc)."""
        N, Hq, Q, L = self.scores.shape
        cells = self.scores[:, :, self.allowed]                                # (N, Hq, cells)
        return {
            "v": FORMAT_VERSION, "layers": N, "layer_names": self.layer_names, "heads": Hq,
            "kv_heads": self.values.shape[1], "Q": Q, "L": L, "run_k": self.run_k,
            "k_stored": self.picks.shape[-1], "dense_run": self.dense_run, "causal": self.causal,
            "dv": self.dv, "value_cols": self.value_cols,
            "scales": [round(s, 6) for s in self.scales],
            "allowed": _b64(self.allowed.to(torch.uint8)),
            "scores": _b64(cells.to(torch.float16)),
            "picks": _b64(self.picks.to(torch.int16)),
            "values": _b64(self.values.to(torch.float16)),
        }


def _b64(t: torch.Tensor) -> str:
    """A tensor's bytes, row-major, little-endian (every platform torch runs on), in base64."""
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")


def explore_calls(calls: list, run_k: int, dense_run: bool = False) -> ExploreData:
    """The explorer's data from every layer's (module path, AttentionCall), in layer order."""
    scores, allowed, picks, values = [], None, [], []
    for _, call in calls:
        s, a = layer_scores(call)                                               # (Hq, Q, L)
        scores.append(s)
        allowed = a.any(0) if allowed is None else allowed | a.any(0)           # (Q, L)
        picks.append(call.selection.indices[0].cpu())                           # (Hq, Q, k)
        v = call.value[0].detach().float().cpu()                                # (Hkv, L, Dv)
        values.append(v)
    dv = values[0].shape[-1]
    cols = value_columns(dv)
    k = max(p.shape[-1] for p in picks)
    picks = [torch.nn.functional.pad(p, (0, k - p.shape[-1]), value=-1) for p in picks]
    return ExploreData(
        layer_names=[path for path, _ in calls], scores=torch.stack(scores), allowed=allowed,
        picks=torch.stack(picks), values=torch.stack(values)[..., cols], value_cols=cols, dv=dv,
        scales=[call_scale(c) for _, c in calls], run_k=run_k,
        causal=bool(calls[0][1].selection.is_causal), dense_run=dense_run)
