"""Scaled, masked logits of one chunk of queries against the keys it may see.

    >>> s = chunk_logits(problem, q5, key, q0=0, q1=128)    # (B, Hkv, G, 128, key_end(128))

Queries are grouped by KV head, q5 = query.view(B, Hkv, G, Q, D), so grouped-query attention
multiplies each KV head once for its G query heads and never repeats K. A disallowed key
(causal rule, False in a bool mask, -inf in a float mask) gets the logit -inf; the selection treats
exactly the finite logits as allowed. 16-bit inputs are scored in float32. With
`problem.softcap` the scaled logits are capped (variants.softcap_) before any mask.
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.checks import AttentionProblem
from gatherlens.ops.attention.variants import softcap_, softcap_slope_
from gatherlens.ops.dtypes import NEG_INF, compute_dtype


def chunk_logits(p: AttentionProblem, q5: torch.Tensor, key: torch.Tensor, q0: int, q1: int,
                 key_end: int | None = None) -> torch.Tensor:
    """Logits (B, Hkv, G, C, Lc) for queries [q0, q1) and keys [0, Lc), Lc = key_end."""
    s = _scaled_logits(p, q5, key, q0, q1, key_end)             # (B, Hkv, G, C, Lc)
    softcap_(s, p.softcap)
    apply_masks(p, s, q0, q1)
    return s


def chunk_logits_and_slope(p: AttentionProblem, q5: torch.Tensor, key: torch.Tensor, q0: int, q1: int,
                           key_end: int | None = None):
    """chunk_logits, and the cap's derivative d capped / d logit (B, Hkv, G, C, Lc) (None without
    a softcap): what autograd's backward multiplies dS by."""
    s = _scaled_logits(p, q5, key, q0, q1, key_end)             # (B, Hkv, G, C, Lc)
    slope = softcap_slope_(s, p.softcap)                        # (B, Hkv, G, C, Lc) or None
    apply_masks(p, s, q0, q1)
    return s, slope


def _scaled_logits(p: AttentionProblem, q5, key, q0: int, q1: int, key_end: int | None) -> torch.Tensor:
    """scale * q.k (B, Hkv, G, C, Lc), before the cap and the masks."""
    Lc = p.key_end(q1) if key_end is None else key_end
    B, Hkv, G, C = p.batch, p.kv_heads, p.groups, q1 - q0
    cd = compute_dtype(q5.dtype)
    q = q5[:, :, :, q0:q1].to(cd) * p.scale                     # (B, Hkv, G, C, D)
    k = key[:, :, :Lc].to(cd)                                   # (B, Hkv, Lc, D)
    s = torch.matmul(q.reshape(B, Hkv, G * C, -1), k.transpose(-1, -2))  # (B, Hkv, G*C, Lc)
    return s.view(B, Hkv, G, C, Lc)                             # (B, Hkv, G, C, Lc)


def apply_masks(p: AttentionProblem, s: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """In place: -inf where the causal rule or a bool mask forbids, + a float mask."""
    Lc = s.shape[-1]
    if p.mask is not None:
        m = p.mask
        m = m[..., q0:q1, :] if m.shape[-2] != 1 else m         # (B|1, Hkv|1, G|1, C|1, L|1)
        m = m[..., :Lc] if m.shape[-1] != 1 else m              # (B|1, Hkv|1, G|1, C|1, Lc|1)
        if m.dtype == torch.bool:
            s.masked_fill_(~m, NEG_INF)
        else:
            s.add_(m.to(s.dtype))
    j0 = max(0, q0 + p.causal_offset + 1)                       # keys before j0: seen by every row
    if p.causal and j0 < Lc:
        qi = torch.arange(q0, q1, device=s.device).unsqueeze(-1)  # (C, 1)
        kj = torch.arange(j0, Lc, device=s.device)              # (Lc - j0,)
        s[..., j0:].masked_fill_(kj > qi + p.causal_offset, NEG_INF)  # only the diagonal block
    return s
