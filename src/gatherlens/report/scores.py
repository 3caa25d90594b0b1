"""Every head's score grid of one attention call, recomputed from the query and key it was given.

    >>> scores, allowed = layer_scores(call)     # call: a gatherlens.models AttentionCall
    >>> scores.shape, allowed.shape              # (Hq, Q, L) scaled q.k (-inf where not allowed)
    (torch.Size([9, 9, 9]), torch.Size([9, 9, 9]))

One function serves the report's detailed head (collect) and the explorer's data for every
layer and head (explore), so both show the same numbers: q.k x scale, plus an additive mask
where the model used one, -inf where the causal or padding rule forbids a key.
"""
from __future__ import annotations

import torch

__all__ = ["layer_scores", "call_scale", "score_rows", "allowed_cells"]


def call_scale(call) -> float:
    """The softmax scale the call's selection used (the model's, else 1/sqrt(D))."""
    sel = call.selection
    return float(sel.meta.get("scale") or call.scale or call.query.shape[-1] ** -0.5)


def allowed_cells(call) -> torch.Tensor:
    """(Q, L) bool: the keys each query of this call's layer may attend to, in every head (batch 0;
    every head of a layer gets the same causal rule and mask; each layer its own)."""
    Hq, Q, L = call.query.shape[1], call.query.shape[2], call.key.shape[2]
    return _allowed(call, Hq, Q, L).all(0)


def _allowed(call, Hq: int, Q: int, L: int) -> torch.Tensor:
    """(Hq, Q, L) bool: which keys each query of each head may attend to (causal and mask)."""
    allowed = torch.ones(Hq, Q, L, dtype=torch.bool)
    if call.selection.is_causal:
        off = int(call.selection.meta.get("causal_offset", 0) or 0)
        allowed &= torch.ones(Q, L, dtype=torch.bool).tril(diagonal=off)
    mask = call.mask
    if mask is not None:
        m = mask[0][..., -Q:, :L].cpu()                                     # (1|Hq, Q, L)
        allowed &= m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min   # eager masks: min, or -inf
    return allowed


def score_rows(q: torch.Tensor, k: torch.Tensor, scale: float, allowed: torch.Tensor) -> torch.Tensor:
    """(Hq, R, L) scaled q.k of query rows q (Hq, R, D) against keys k (Hkv, L, D), -inf where
    `allowed` (R, L) or (Hq, R, L) is False; query head h reads KV head h // (Hq // Hkv).

        >>> score_rows(q[:, 5:9], k, 0.125, allowed[5:9]).shape     # four query rows of every head
        torch.Size([9, 4, 12])
    """
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)                # (Hq, L, D)
    logits = (q @ k.transpose(-1, -2)) * scale                              # (Hq, R, L)
    return logits.masked_fill(~allowed, float("-inf"))


def layer_scores(call) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, allowed) of batch 0 for every query head: (Hq, Q, L) float32 and bool.

    Key/value heads are shared by groups of query heads (GQA): head h reads KV head h // group.
    """
    q = call.query[0].detach().float().cpu()                                # (Hq, Q, D)
    k = call.key[0].detach().float().cpu()                                  # (Hkv, L, D)
    Hq, Q, L = q.shape[0], q.shape[1], k.shape[1]
    allowed = _allowed(call, Hq, Q, L)                                      # (Hq, Q, L)
    logits = score_rows(q, k, call_scale(call), allowed)                    # (Hq, Q, L)
    if call.mask is not None and call.mask.dtype != torch.bool:
        m = call.mask[0][..., -Q:, :L].float().cpu()                        # (1|Hq, Q, L)
        logits = logits + m.masked_fill(~allowed, 0.0)                      # -inf stays -inf
    return logits, allowed
