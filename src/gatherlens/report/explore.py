"""What the explorable report carries: every layer's and head's scores, compactly, for the page's script.

    >>> story = collect(lm, "The cat sat on the mat because it was", top_k=4)
    >>> data = story.explore.pack()          # JSON-ready: base64 8-bit score codes, int16 picks
    >>> sorted(data)[:4]
    ['allowed', 'causal', 'dv', 'heads']

The page lets a reader pick any layer, head and query and move k. Its script draws every
attention figure from this data, so the page needs no server:
- scores: the (Q, L) grid of every (layer, head), only the cells some head may look at (a
  causal model stores the lower triangle), as 8-bit codes per query row: score = lo + code x
  (hi - lo) / 255 with the row's float32 lo and hi (`quantize_rows`), so each score is at most
  (hi - lo) / 510 off (`score_err` says the largest); half the bytes of float16;
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

__all__ = ["ExploreData", "explore_calls", "value_columns", "quantize_rows", "dequantize_rows", "FORMAT_VERSION"]

FORMAT_VERSION = 2
LEVELS = 255               # the largest 8-bit score code
SHOWN_COLUMNS = 6          # columns of V the value figure draws: the first five and the last


def value_columns(dv: int, shown: int = SHOWN_COLUMNS) -> list[int]:
    """The V columns the value figure draws: all when few, else the first shown-1 and the last."""
    return list(range(dv)) if dv <= shown else [*range(shown - 1), dv - 1]


def quantize_rows(cells: torch.Tensor, rows: torch.Tensor):
    """cells (..., n) finite scores, rows (n,) the query row of each cell -> (codes (..., n) uint8,
    lo (..., R), hi (..., R) float32): each row's cells as 8-bit codes between its min and max."""
    R = int(rows.max()) + 1 if rows.numel() else 0
    idx = rows.expand(cells.shape)                                              # (..., n)
    lo = torch.full(cells.shape[:-1] + (R,), float("inf")).scatter_reduce(-1, idx, cells, "amin")
    hi = torch.full(cells.shape[:-1] + (R,), float("-inf")).scatter_reduce(-1, idx, cells, "amax")
    lo, hi = lo.nan_to_num(0.0, 0.0, 0.0), hi.nan_to_num(0.0, 0.0, 0.0)        # (..., R) rows with no cell: 0
    span = (hi - lo).gather(-1, idx).double()                                   # (..., n)
    off = (cells.double() - lo.gather(-1, idx).double())
    codes = torch.where(span > 0, (off / span.clamp_min(1e-300) * LEVELS).round(), torch.zeros_like(off))
    return codes.clamp(0, LEVELS).to(torch.uint8), lo, hi


def dequantize_rows(codes: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The scores the page decodes (float64, as its script computes): lo + code x (hi - lo) / 255."""
    idx = rows.expand(codes.shape)                                              # (..., n)
    l, h = lo.double().gather(-1, idx), hi.double().gather(-1, idx)
    return l + codes.double() * (h - l) / LEVELS


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
        codes, lo, hi = quantize_rows(cells, self.cell_rows())                 # (N, Hq, cells), (N, Hq, Q) x2
        return {
            "v": FORMAT_VERSION, "layers": N, "layer_names": self.layer_names, "heads": Hq,
            "kv_heads": self.values.shape[1], "Q": Q, "L": L, "run_k": self.run_k,
            "k_stored": self.picks.shape[-1], "dense_run": self.dense_run, "causal": self.causal,
            "dv": self.dv, "value_cols": self.value_cols,
            "scales": [round(s, 6) for s in self.scales],
            "allowed": _b64(self.allowed.to(torch.uint8)),
            "scores": _b64(codes), "score_lo": _b64(lo), "score_hi": _b64(hi),
            "score_err": float((hi - lo).max()) / (2 * LEVELS) if lo.numel() else 0.0,
            "picks": _b64(self.picks.to(torch.int16)),
            "values": _b64(self.values.to(torch.float16)),
        }

    def cell_rows(self) -> torch.Tensor:
        """(cells,) the query row of each stored cell, in the order `pack` stores them."""
        return self.allowed.nonzero()[:, 0]

    def stored_scores(self) -> torch.Tensor:
        """(N, Hq, Q, L) float64: the scores as the page decodes them (-inf where not allowed)."""
        rows = self.cell_rows()
        codes, lo, hi = quantize_rows(self.scores[:, :, self.allowed], rows)
        out = torch.full(self.scores.shape, float("-inf"), dtype=torch.float64)
        out[:, :, self.allowed] = dequantize_rows(codes, lo, hi, rows)
        return out


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
