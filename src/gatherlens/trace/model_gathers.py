"""Plain records of gathers a model runs itself beyond the embedding lookup: Gemma's scaling of the gathered
rows and a mixture of experts' routing (RoPE's cos/sin rows are a GatherRecord: trace.builders).

    >>> rec = ScaleRecord(ids=(2, 7), labels=("a", "b"), rows=r, out=o, scale=5.657, d=32, equal=True)
    >>> moe = MoeRouting(layer=1, labels=("a", "b"), probs=p, index=i, weights=w)   # p (T, E), i, w (T, k)
    >>> moe.per_expert[3]                       # the tokens expert 3 gathered: its rows of the batch
    (0, 4, 5)

gatherlens.report.model_gathers fills them from one real run (hooks on the model's own modules);
gatherlens.render.model_gathers draws them. Every field is plain data.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ScaleRecord", "MoeRouting"]


@dataclass(frozen=True, eq=False)
class ScaleRecord:
    """The gathered rows W[ids] times the model's scale, as its embedding module returned them."""

    ids: tuple[int, ...]
    labels: tuple[str, ...]
    rows: torch.Tensor        # (S, C) the first C columns of W[ids]
    out: torch.Tensor         # (S, C) the same columns of what the embedding module returned
    scale: float              # Gemma: sqrt(d), held in the weights' dtype
    d: int
    equal: bool               # out == rows * scale, every column of every row (checked on the whole rows)


@dataclass(frozen=True, eq=False)
class MoeRouting:
    """One MoE layer's routing of T tokens over E experts, as its router returned it."""

    layer: int
    labels: tuple[str, ...]   # the T tokens
    probs: torch.Tensor       # (T, E) softmax of the router's logits
    index: torch.Tensor       # (T, k) the experts each token picked, best first
    weights: torch.Tensor     # (T, k) the weights their outputs are summed with
    layers: int = 1           # MoE layers in the model

    @property
    def experts(self) -> int:
        return int(self.probs.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.index.shape[1])

    @property
    def per_expert(self) -> tuple[tuple[int, ...], ...]:
        """For each expert, the tokens it gathered (ascending): the gather its block runs per expert."""
        picked = self.index.tolist()
        return tuple(tuple(t for t, row in enumerate(picked) if e in row) for e in range(self.experts))
