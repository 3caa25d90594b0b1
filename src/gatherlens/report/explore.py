"""What the explorable report carries: every layer's and head's scores, compactly, for the page's script.

    >>> story = collect(lm, "The cat sat on the mat because it was", top_k=4)
    >>> data = story.explore.pack()          # JSON-ready: base64 8-bit score codes, int16 picks
    >>> sorted(data)[:4]
    ['causal', 'dv', 'heads', 'keys']
    >>> explore_run(story.tensors, rows=(2032, 2048))   # a long text offline: the rows around the query

The page lets a reader pick any layer, head and query and move k. Its script draws every
attention figure from this data, so the page needs no server:
- masks: each distinct (rows, L) mask of the run once, and `mask_of[layer]` the one each layer used:
  every layer keeps its own (a hybrid model's sliding layers their window, its global layers the
  causal rule), with `kinds[layer]` what the model says the layer is;
- scores: the grid of every (layer, head) on the stored query rows, only the cells that layer's
  mask allows, as 8-bit codes per query row: score = lo + code x (hi - lo) / 255 with the row's
  float32 lo and hi (`quantize_rows`), so each score is at most (hi - lo) / 510 off (`score_err`
  says the largest); half the bytes of float16;
- picks: the keys the model's own top-k kept, per (layer, head, query), as int16 (-1 = none),
  so the page shows exactly what the model ran with at its k; for another k the script
  selects from the scores (best first, ties to the lower key, as the model does);
- values: the columns of every (layer, KV head)'s V that the value-gather figure shows.
A short text stores every query row; a long one (past MAX_TOKENS, offline) the WINDOW_ROWS rows
around the drawn query (`rows`), and its score grid shows the WINDOW_KEYS keys `keys` names.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

import torch

__all__ = ["ExploreData", "explore_run", "value_columns", "quantize_rows", "dequantize_rows", "FORMAT_VERSION"]

FORMAT_VERSION = 3          # 3: every layer its own mask (masks, mask_of, kinds), stored rows and keys
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
    """Every layer and head of one run on some query rows, as tensors; `pack()` makes the page's JSON."""

    layer_names: list[str]
    scores: torch.Tensor       # (N, Hq, R, L) float32, -inf where not allowed
    masks: torch.Tensor        # (M, R, L) bool: the distinct masks on the stored rows
    mask_of: tuple[int, ...]   # (N,) each layer's own mask in `masks`
    kinds: list[dict]          # (N,) {"kind": "full" | "sliding" | "chunked", "window": int | None}
    picks: torch.Tensor        # (N, Hq, R, k) int64 keys the model's top-k kept, -1 = none
    values: torch.Tensor       # (N, Hkv, L, C) float32: the shown columns of V
    value_cols: list[int]
    dv: int
    scales: list[float]
    run_k: int
    causal: bool
    dense_run: bool = False    # the model ran with every allowed key (top-k off)
    queries: int = 0           # Q, every query of the run (the stored rows are rows[0] .. rows[1] - 1)
    rows: tuple[int, int] = (0, 0)
    keys: tuple[int, int] = (0, 0)   # the key columns the score grid draws
    meta: dict = field(default_factory=dict)

    def allowed(self, layer: int) -> torch.Tensor:
        """(R, L) bool: layer `layer`'s own mask on the stored rows."""
        return self.masks[self.mask_of[layer]]

    def pack(self) -> dict:
        """JSON-ready data: shapes, then base64 little-endian arrays (see the module doc)."""
        N, Hq, R, L = self.scores.shape
        codes, lo, hi = self._codes()
        return {
            "v": FORMAT_VERSION, "layers": N, "layer_names": self.layer_names, "heads": Hq,
            "kv_heads": self.values.shape[1], "Q": self.queries, "L": L, "rows": list(self.rows),
            "keys": list(self.keys), "run_k": self.run_k,
            "k_stored": self.picks.shape[-1], "dense_run": self.dense_run, "causal": self.causal,
            "dv": self.dv, "value_cols": self.value_cols, "kinds": self.kinds,
            "scales": [round(s, 6) for s in self.scales],
            "masks": [_b64(m.to(torch.uint8)) for m in self.masks], "mask_of": list(self.mask_of),
            "scores": _b64(codes), "score_lo": _b64(lo), "score_hi": _b64(hi),
            "score_err": float((hi - lo).max()) / (2 * LEVELS) if lo.numel() else 0.0,
            "picks": _b64(self.picks.to(torch.int16)),
            "values": _b64(self.values.to(torch.float16)),
        }

    def _codes(self):
        """(codes (cells,) uint8 layer after layer, head after head; lo, hi (N, Hq, R) float32)."""
        codes, lo, hi = [], [], []
        for layer in range(self.scores.shape[0]):
            allowed = self.allowed(layer)
            c, a, b = quantize_rows(self.scores[layer][:, allowed], allowed.nonzero()[:, 0])   # (Hq, cells)
            if a.shape[-1] < allowed.shape[0]:                                 # rows past the last allowed cell: 0
                a, b = (torch.nn.functional.pad(t, (0, allowed.shape[0] - t.shape[-1])) for t in (a, b))
            codes.append(c.reshape(-1))
            lo.append(a)
            hi.append(b)
        return torch.cat(codes), torch.stack(lo), torch.stack(hi)

    def stored_scores(self) -> torch.Tensor:
        """(N, Hq, R, L) float64: the scores as the page decodes them (-inf where not allowed)."""
        out = torch.full(self.scores.shape, float("-inf"), dtype=torch.float64)
        for layer in range(self.scores.shape[0]):
            allowed = self.allowed(layer)
            rows = allowed.nonzero()[:, 0]
            codes, lo, hi = quantize_rows(self.scores[layer][:, allowed], rows)
            out[layer][:, allowed] = dequantize_rows(codes, lo, hi, rows)
        return out


def _b64(t: torch.Tensor) -> str:
    """A tensor's bytes, row-major, little-endian (every platform torch runs on), in base64."""
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")


def explore_run(run, layer_names: list[str] | None = None, rows: tuple[int, int] | None = None,
                keys: tuple[int, int] | None = None) -> ExploreData:
    """The explorer's data of a RunTensors (report/run_tensors.py) on query rows [rows[0], rows[1])
    (default: every row), the grid's key columns `keys` (default: every key)."""
    from gatherlens.report.run_tensors import kind_data

    N, Hq, Q, L = run.shape
    r0, r1 = rows or (0, Q)
    masks = run.masks[:, r0:r1]                                                  # (M, R, L)
    dv = run.value.shape[-1]
    cols = value_columns(dv)
    return ExploreData(
        layer_names=layer_names or [f"layer {i}" for i in range(N)],
        scores=torch.stack([run.layer_scores(layer, slice(r0, r1)) for layer in range(N)]),   # (N, Hq, R, L)
        masks=masks, mask_of=run.mask_of, kinds=[kind_data(k) for k in run.kinds],
        picks=run.picks[:, :, r0:r1].long(), values=run.value[..., cols], value_cols=cols, dv=dv,
        scales=list(run.scales), run_k=run.run_k, causal=run.causal, dense_run=run.dense_run,
        queries=Q, rows=(r0, r1), keys=keys or (0, L))
