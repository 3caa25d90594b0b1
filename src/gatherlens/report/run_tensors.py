"""What one text's forward produced, kept so that a change of layer, head or query needs no model run.

    >>> run = run_tensors(calls, run_k=4)        # calls: (module path, AttentionCall) per layer
    >>> run.query.shape, run.key.shape           # (N, Hq, Q, D), (N, Hkv, L, D) float32
    >>> run.scores(layer=15, head=3, rows=range(100, 116)).shape     # (16, L): 16 query rows
    >>> run.allowed(5).shape, run.kinds[5]       # layer 5's own mask (Q, L); its kind and window
    ((841, 841), LayerKind(kind='full', window=None))
    >>> run.nbytes / 2**20                        # 233 MiB at 2,048 tokens of SmolLM2

The explorer's long texts (`gatherlens serve`, up to LIVE_MAX_TOKENS) keep no (Q, L) grid of
every head (at 2,048 tokens that is 4.5 GB of float32): they keep every layer's query, key and
value rows (float32, as the model gave them) and the keys the model's own top-k kept, and
compute the scores of the rows a view shows with the report's one score rule
(report.scores.score_rows: the same q.k x scale, -inf where not allowed).

Every layer keeps its own mask: a hybrid model (Gemma 3: five sliding layers of 512 tokens to one
global layer) gives its sliding layers a window and its global layers the plain causal rule. The
distinct masks are kept once each (`masks`, (M, Q, L) bool) and `mask_of[layer]` says which one a
layer used, exactly as its attention call got it; `kinds[layer]` is what the model says the layer
is (models/attention/features.module_kind: "full", "sliding" or "chunked", with its window).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.errors import GatherIndexError
from gatherlens.report.scores import allowed_cells, call_scale, score_rows

__all__ = ["RunTensors", "run_tensors", "layer_kind", "kind_data"]


@dataclass(frozen=True)
class RunTensors:
    """Every layer's q, k, v of one run (batch 0), its own mask and kind, and the model's picks."""

    query: torch.Tensor        # (N, Hq, Q, D) float32
    key: torch.Tensor          # (N, Hkv, L, D) float32
    value: torch.Tensor        # (N, Hkv, L, Dv) float32
    picks: torch.Tensor        # (N, Hq, Q, k) int16 keys the model's top-k kept, -1 = none
    masks: torch.Tensor        # (M, Q, L) bool: each distinct rule of which keys a query may see
    mask_of: tuple[int, ...]   # (N,) the index into `masks` of each layer's own mask
    kinds: tuple               # (N,) LayerKind of each layer (kind, window)
    scales: tuple[float, ...]  # (N,) the softmax scale of each layer
    run_k: int
    causal: bool
    dense_run: bool = False
    logits: torch.Tensor | None = None   # (V,) float32: the last position's logits (what the sampler draws from)
    ids: tuple[int, ...] = ()            # the text's token ids (the sampler's penalty history)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(layers, query heads, queries, keys)."""
        N, Hq, Q, _ = self.query.shape
        return N, Hq, Q, self.key.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held (what a server's cache of runs counts)."""
        held = (self.query, self.key, self.value, self.picks, self.masks) + ((self.logits,) if self.logits is not None else ())
        return sum(t.numel() * t.element_size() for t in held)

    def allowed(self, layer: int) -> torch.Tensor:
        """(Q, L) bool: the keys each query of `layer` may attend to (that layer's own mask)."""
        return self.masks[self.mask_of[layer]]

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
        q = self.query[layer, head, rows].unsqueeze(0)                         # (1, R, D)
        k = self.key[layer, self.kv_head(head)].unsqueeze(0)                   # (1, L, D)
        return score_rows(q, k, self.scales[layer], self.allowed(layer)[rows])[0]   # (R, L)

    def layer_scores(self, layer: int, rows: slice = slice(None)) -> torch.Tensor:
        """(Hq, R, L) float32 scores of every head of one layer on query rows `rows` (all by default)."""
        return score_rows(self.query[layer][:, rows], self.key[layer], self.scales[layer],
                          self.allowed(layer)[rows])

    def kv_head(self, head: int) -> int:
        return head // (self.query.shape[1] // self.key.shape[1])


def layer_kind(call):
    """The LayerKind of one attention call's module (models/attention/features: full, sliding, chunked)."""
    from gatherlens.models.attention.features import module_kind

    return module_kind(call.module)


def kind_data(kind) -> dict:
    """A LayerKind as JSON: {"kind": "full" | "sliding" | "chunked", "window": int | None}."""
    return {"kind": kind.kind, "window": kind.window}


def _distinct(masks: list[torch.Tensor]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(distinct (M, Q, L), index of each mask among them): equal masks kept once."""
    kept, of = [], []
    for m in masks:
        at = next((i for i, k in enumerate(kept) if torch.equal(k, m)), None)
        if at is None:
            kept.append(m)
            at = len(kept) - 1
        of.append(at)
    return torch.stack(kept), tuple(of)


def run_tensors(calls: list, run_k: int, dense_run: bool = False) -> RunTensors:
    """RunTensors from every layer's (module path, AttentionCall), in layer order."""
    masks, mask_of = _distinct([allowed_cells(c) for _, c in calls])            # (M, Q, L)
    k = max(c.selection.indices.shape[-1] for _, c in calls)
    picks = [torch.nn.functional.pad(c.selection.indices[0].cpu(), (0, k - c.selection.indices.shape[-1]),
                                     value=-1) for _, c in calls]               # (Hq, Q, k) each
    return RunTensors(
        query=torch.stack([c.query[0].detach().float().cpu() for _, c in calls]),
        key=torch.stack([c.key[0].detach().float().cpu() for _, c in calls]),
        value=torch.stack([c.value[0].detach().float().cpu() for _, c in calls]),
        picks=torch.stack(picks).to(torch.int16), masks=masks, mask_of=mask_of,
        kinds=tuple(layer_kind(c) for _, c in calls),
        scales=tuple(call_scale(c) for _, c in calls), run_k=run_k,
        causal=_causal(calls, masks), dense_run=dense_run)


def _causal(calls: list, masks: torch.Tensor) -> bool:
    """True when the model is causal: a call ran the causal rule, or no layer's mask lets a query see a
    later key (a hybrid's sliding layers get a mask rather than the causal flag)."""
    if any(bool(c.selection.is_causal) for _, c in calls):
        return True
    _, Q, L = masks.shape
    return Q > 1 and not bool(masks.triu(diagonal=L - Q + 1).any())
