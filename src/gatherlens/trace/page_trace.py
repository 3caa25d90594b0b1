"""The record of a whole sparse generation: which pages every layer read at every step.

    >>> recorder = PageTraceRecorder(num_layers=30, page_size=16, budget=512)
    >>> with observe_sparse(recorder):                 # gatherlens.models.runtime.decoding
    ...     for each generated token: ...; recorder.end_step(cache_length, token_text)
    >>> trace = recorder.record()                      # a PageTrace: (layers, steps, pages)
    >>> page_trace_svg(trace)                          # gatherlens.render.page_trace: pages x steps

The recorder is an observer of sparse decode steps: it reads only `call.layer` and
`call.selection` (a PageSelection), so it needs nothing from `models/`. A layer that was not
observed during a step decoded densely (a dense first layer, or a budget that bought every page)
and read every page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse.geometry import page_count

__all__ = ["PageTrace", "PageTraceRecorder", "NOT_YET"]

NOT_YET = -1.0  # a page the cache did not hold yet at that step


@dataclass
class PageTrace:
    """Which pages every layer read at every decode step, as plain data.

    read:      (layers, steps, pages) float32: the share of the layer's selection heads (KV groups,
               or query heads when each chose its own) that read the page at that step; 1.0 for
               every page of a layer that decoded densely; NOT_YET (-1) past the cache's length.
    dense:     (layers, steps) bool: the layer read every page at that step without choosing.
    lengths:   tokens in the cache at each step (the step's own token included).
    tokens:    the text of the token each step produced ("" where unknown).
    counts:    (layers, steps, selection heads) int64: pages each selection head read at that step (the
               auto budget's per-head counts; a dense layer's every page); None for a trace made without.
    """

    read: torch.Tensor
    dense: torch.Tensor
    lengths: list[int]
    page_size: int
    budget: int | None
    tokens: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    counts: torch.Tensor | None = None

    @property
    def num_layers(self) -> int:
        return self.read.shape[0]

    @property
    def num_steps(self) -> int:
        return self.read.shape[1]

    @property
    def num_pages(self) -> int:
        return self.read.shape[2]

    def pages_read(self) -> torch.Tensor:
        """(layers, steps) int: pages each layer read at each step (by any of its selection heads)."""
        return (self.read > 0).sum(-1)

    def mean_pages(self) -> float | None:
        """Mean pages a selection head of a choosing (not dense) layer read per step; None if none chose."""
        if self.counts is None or bool(self.dense.all()):
            return None
        return float(self.counts[~self.dense].float().mean())


class PageTraceRecorder:
    """Collects a PageTrace from sparse decode steps (an observer for `observe_sparse`).

    Call it with every SparseCall of a step, then `end_step(length, token)` once per step.
    """

    def __init__(self, num_layers: int, page_size: int, budget: int | None, meta: dict | None = None):
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise GatherValueError(f"num_layers = {num_layers!r} must be an int >= 1")
        self.num_layers, self.page_size, self.budget = num_layers, page_size, budget
        self.meta = dict(meta or {})
        self.current: dict[int, torch.Tensor] = {}  # layer -> (pages,) share read this step
        self.counted: dict[int, torch.Tensor] = {}  # layer -> (Hsel,) pages each selection head read
        self.steps: list[tuple[int, dict[int, torch.Tensor], str]] = []
        self.step_counts: list[dict[int, torch.Tensor]] = []
        self.heads = 0

    def __call__(self, call) -> None:
        sel = call.selection
        layer = call.layer if call.layer is not None else len(self.current)
        if not 0 <= layer < self.num_layers:
            raise GatherValueError(f"layer {layer} is outside [0, {self.num_layers})")
        self.current[layer] = sel.mask()[0].float().mean(0).cpu()  # (pages,) share of batch 0's heads
        self.counted[layer] = sel.counts[0].cpu()  # (Hsel,)
        self.heads = max(self.heads, self.counted[layer].numel())

    def end_step(self, length: int, token: str = "") -> None:
        """Close the step: the cache held `length` tokens; `token` is what the step produced."""
        self.steps.append((int(length), self.current, token))
        self.step_counts.append(self.counted)
        self.current, self.counted = {}, {}

    def record(self) -> PageTrace:
        """The PageTrace of every step so far."""
        if not self.steps:
            raise GatherValueError("no decode step was recorded (generate at least one token)")
        P = self.page_size
        pages = max(page_count(L, P) for L, _, _ in self.steps)
        read = torch.full((self.num_layers, len(self.steps), pages), NOT_YET)  # (layers, steps, pages)
        dense = torch.zeros(self.num_layers, len(self.steps), dtype=torch.bool)  # (layers, steps)
        for s, (L, seen, _) in enumerate(self.steps):
            n = page_count(L, P)
            for layer in range(self.num_layers):
                if layer in seen:
                    read[layer, s, :n] = seen[layer][:n]
                else:
                    read[layer, s, :n] = 1.0
                    dense[layer, s] = True
        return PageTrace(read=read, dense=dense, lengths=[L for L, _, _ in self.steps], page_size=P,
                         budget=self.budget, tokens=[t for _, _, t in self.steps], meta=dict(self.meta),
                         counts=self._counts())

    def _counts(self) -> torch.Tensor:
        """(layers, steps, Hsel) int64: each step's per-head counts; a layer not observed, every page."""
        out = torch.zeros(self.num_layers, len(self.steps), max(self.heads, 1), dtype=torch.long)
        for s, ((L, _, _), counted) in enumerate(zip(self.steps, self.step_counts)):
            out[:, s] = page_count(L, self.page_size)
            for layer, c in counted.items():
                out[layer, s, :c.numel()] = c
        return out
