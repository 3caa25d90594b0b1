"""What one text's forward produced, kept so that a change of layer, head or query needs no model run.

    >>> run = run_tensors(calls, run_k=4)        # calls: (module path, AttentionCall) per layer
    >>> run.query.shape, run.key.shape           # (N, Hq, Q, D), (N, Hkv, L, D) float32
    >>> run.scores(layer=15, head=3, rows=range(100, 116)).shape     # (16, L): 16 query rows
    >>> run.nbytes / 2**20                        # 233 MiB at 2,048 tokens of SmolLM2

The explorer's long texts (`gatherlens serve`, up to LIVE_MAX_TOKENS) keep no (Q, L) grid of
every head (at 2,048 tokens that is 4.5 GB of float32): they keep every layer's query, key and
value rows (float32, as the model gave them) and the keys the model's own top-k kept, and
compute the scores of the rows a view shows with the report's one score rule
(report.scores.score_rows: the same q.k x scale, -inf where not allowed).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.errors import GatherIndexError
from gatherlens.report.scores import allowed_cells, call_scale, score_rows

__all__ = ["RunTensors", "run_tensors"]


@dataclass(frozen=True)
class RunTensors:
    """Every layer's q, k, v of one run (batch 0) and the model's picks; see the module doc."""

    query: torch.Tensor        # (N, Hq, Q, D) float32
    key: torch.Tensor          # (N, Hkv, L, D) float32
    value: torch.Tensor        # (N, Hkv, L, Dv) float32
    picks: torch.Tensor        # (N, Hq, Q, k) int16 keys the model's top-k kept, -1 = none
    allowed: torch.Tensor      # (Q, L) bool: the causal / mask rule, the same in every layer
    scales: tuple[float, ...]  # (N,) the softmax scale of each layer
    run_k: int
    causal: bool
    dense_run: bool = False

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(layers, query heads, queries, keys)."""
        N, Hq, Q, _ = self.query.shape
        return N, Hq, Q, self.key.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held (what a server's cache of runs counts)."""
        return sum(t.numel() * t.element_size() for t in (self.query, self.key, self.value, self.picks,
                                                          self.allowed))

    def check(self, layer: int, head: int, query: int) -> None:
        """A GatherIndexError naming the first of layer, head, query outside its range."""
        N, Hq, Q, _ = self.shape
        for name, value, hi, many in (("layer", layer, N, "layers"), ("head", head, Hq, "heads"),
                                      ("query", query, Q, "queries")):
            if not 0 <= value < hi:
                raise GatherIndexError(f"{name} {value} is outside [0, {hi}): the run has {hi} {many}")

    def scores(self, layer: int, head: int, rows) -> torch.Tensor:
        """(R, L) float32 scores of query rows `rows` of one head (-inf where not allowed)."""
        rows = torch.as_tensor(list(rows), dtype=torch.long)                   # (R,)
        g = self.query.shape[1] // self.key.shape[1]
        q = self.query[layer, head, rows].unsqueeze(0)                         # (1, R, D)
        k = self.key[layer, head // g].unsqueeze(0)                            # (1, L, D)
        return score_rows(q, k, self.scales[layer], self.allowed[rows])[0]     # (R, L)

    def layer_scores(self, layer: int) -> torch.Tensor:
        """(Hq, Q, L) float32 scores of every head of one layer (what report.scores.layer_scores gives)."""
        return score_rows(self.query[layer], self.key[layer], self.scales[layer], self.allowed)

    def kv_head(self, head: int) -> int:
        return head // (self.query.shape[1] // self.key.shape[1])


def run_tensors(calls: list, run_k: int, dense_run: bool = False) -> RunTensors:
    """RunTensors from every layer's (module path, AttentionCall), in layer order."""
    allowed = allowed_cells(calls[0][1])                                        # (Q, L)
    k = max(c.selection.indices.shape[-1] for _, c in calls)
    picks = [torch.nn.functional.pad(c.selection.indices[0].cpu(), (0, k - c.selection.indices.shape[-1]),
                                     value=-1) for _, c in calls]               # (Hq, Q, k) each
    return RunTensors(
        query=torch.stack([c.query[0].detach().float().cpu() for _, c in calls]),
        key=torch.stack([c.key[0].detach().float().cpu() for _, c in calls]),
        value=torch.stack([c.value[0].detach().float().cpu() for _, c in calls]),
        picks=torch.stack(picks).to(torch.int16), allowed=allowed,
        scales=tuple(call_scale(c) for _, c in calls), run_k=run_k,
        causal=bool(calls[0][1].selection.is_causal), dense_run=dense_run)
