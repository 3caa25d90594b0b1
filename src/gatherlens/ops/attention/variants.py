"""Soft-capping and attention sinks: the two logit rules of today's decoders, in one place.

    >>> s = softcap_(logits, 50.0)                  # in place: 50 * tanh(logits / 50) (Gemma 2)
    >>> out, lse = join_sinks(out, lse, sinks)      # out (B, Hq, Q, Dv), lse (B, Hq, Q), sinks (Hq,)

- **soft-capping** (Gemma 2): the scaled logits become ``softcap * tanh(logits / softcap)`` before
  any mask and before any selection, so a top-k or a page choice ranks the capped logits (the cap
  is monotonic: the ranking of one row is unchanged, the weights are not).
- **sinks** (GPT-OSS's ``s_aux``): one learned logit per query head joins every softmax as an
  extra column with no value row, ``out = sum_j e^{l_j} v_j / (sum_j e^{l_j} + e^{sink})``. Given
  the attention over the keys alone (out_k, lse_k), that is ``out_k * sigmoid(lse_k - sink)`` and
  ``lse = logaddexp(lse_k, sink)``: a rescaling after any path, the same for every backend.

Used by `topk_attention` (ops/attention) and `sparse_decode` (ops/sparse); the plain references
(naive.py of each) write the rules out literally instead.
"""
from __future__ import annotations

import torch

from gatherlens.ops.dtypes import NEG_INF

__all__ = ["capped", "softcap_", "softcap_slope_", "join_sinks", "sink_logits"]


def capped(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """s (...) -> softcap * tanh(s / softcap), a new tensor (autograd-safe); None: s itself."""
    return s if softcap is None else softcap * torch.tanh(s / softcap)


def softcap_(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """capped, in place on s (no autograd through it). Returns s."""
    if softcap is not None:
        s.div_(softcap).tanh_().mul_(softcap)
    return s


def softcap_slope_(s: torch.Tensor, softcap: float | None) -> torch.Tensor | None:
    """softcap_(s) in place, returning d capped / d logit = 1 - tanh^2 (same shape; None without a cap)."""
    if softcap is None:
        return None
    t = s.div_(softcap).tanh_()                                 # (...) tanh(s / softcap), in place
    slope = 1.0 - t * t                                         # (...)
    t.mul_(softcap)
    return slope


def sink_logits(sinks: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """sinks (H,) -> (1, H, 1) in lse's dtype, to broadcast against lse (B, H, Q)."""
    return sinks.to(lse.dtype).view(1, -1, 1)                   # (1, H, 1)


def join_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor | None):
    """The sink of each head joins the softmax: out (B, H, Q, Dv), lse (B, H, Q) over the keys
    alone -> out, lse with the sink (lse = logaddexp(lse, sink)); sinks None: unchanged.

    A row with no key gets out 0 and lse = sink. Plain torch ops: differentiable wherever out and
    lse are (topk_attention's autograd Function has its own backward, autograd.py).
    """
    if sinks is None:
        return out, lse
    sink = sink_logits(sinks, lse)                              # (1, H, 1)
    alive = lse > NEG_INF                                       # (B, H, Q)
    keep = torch.where(alive, torch.sigmoid(torch.where(alive, lse, 0.0) - sink), 0.0)  # (B, H, Q)
    wd = torch.promote_types(out.dtype, lse.dtype)              # float32 for 16-bit out, float64 kept
    out = (out.to(wd) * keep.to(wd).unsqueeze(-1)).to(out.dtype)  # (B, H, Q, Dv)
    return out, torch.logaddexp(lse, sink.expand_as(lse))       # (B, H, Q)
