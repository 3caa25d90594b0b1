"""Readable references for page-selected decoding: what the fast paths must equal.

    >>> out, lse = sparse_attention_reference(q, keys, values, pages, page_size=16)
    >>> page_bound_reference(q[0, 0, 0], keys[0, 0, 16:32])   # a bound >= every q . k of that page

Everything here is computed in float64 from the plain (B, Hkv, L, D) keys and (B, Hkv, L, Dv)
values, with an explicit mask, so it shares no code with `cache.py`, `page_choice.py` or
`decode.py`; soft-capping and sinks are written out as transformers writes them. For a cache
stored in 16 bits or int8, pass its keys and values as read (`cache.keys`, `cache.values`): the
fast paths must equal the reference over the stored values.
"""
from __future__ import annotations

import math

import torch

__all__ = ["page_bound_reference", "page_bounds_reference", "sparse_attention_reference",
           "dense_decode_reference"]


def page_bound_reference(q: torch.Tensor, page_keys: torch.Tensor) -> torch.Tensor:
    """sum_d max(q_d * min_d, q_d * max_d) for one query (D,) and one page's keys (T, D)."""
    lo = page_keys.double().amin(dim=0)  # (D,)
    hi = page_keys.double().amax(dim=0)  # (D,)
    qd = q.double()  # (D,)
    return torch.maximum(qd * lo, qd * hi).sum()


def page_bounds_reference(q: torch.Tensor, keys: torch.Tensor, page_size: int) -> torch.Tensor:
    """Bounds of every page for one query (D,) over one head's keys (L, D) -> (num_pages,)."""
    L = keys.shape[0]
    return torch.stack([page_bound_reference(q, keys[s:s + page_size]) for s in range(0, L, page_size)])


def sparse_attention_reference(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    pages: torch.Tensor,
    page_size: int,
    scale: float | None = None,
    *,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention of a decode query over only the tokens of the chosen pages.

    query:  (B, Hq, 1, D); keys: (B, Hkv, L, D), values: (B, Hkv, L, Dv), Hq = G * Hkv
    pages:  (B, Hsel, n) page ids per selection head; Hsel = Hkv (one choice per KV group)
            or Hq (one per query head)
    softcap: logits -> softcap * tanh(logits / softcap) before the page mask
    sinks:  (Hq,) one more softmax column per head, with no value (its term is in lse)
    returns out (B, Hq, 1, Dv) in query.dtype and lse (B, Hq, 1) float32 (natural log).
    """
    B, Hq, _, D = query.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    G, Hsel = Hq // Hkv, pages.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k = keys.double().repeat_interleave(G, dim=1)  # (B, Hq, L, D)
    v = values.double().repeat_interleave(G, dim=1)  # (B, Hq, L, Dv)
    page_of = torch.arange(L, device=keys.device) // page_size  # (L,)
    keep = (page_of.view(1, 1, 1, L) == pages.unsqueeze(-1)).any(dim=2)  # (B, Hsel, L)
    if Hsel != Hq:
        keep = keep.repeat_interleave(Hq // Hsel, dim=1)  # (B, Hq, L)
    logits = torch.matmul(query.double(), k.transpose(-1, -2)) * scale  # (B, Hq, 1, L)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)  # (B, Hq, 1, L)
    logits = logits.masked_fill(~keep.unsqueeze(2), float("-inf"))  # (B, Hq, 1, L)
    cols = logits  # (B, Hq, 1, L[+1]): the keys, and the sink's column
    if sinks is not None:
        cols = torch.cat([logits, sinks.double().view(1, Hq, 1, 1).expand(B, Hq, 1, 1)], dim=-1)
    lse = torch.logsumexp(cols, dim=-1)  # (B, Hq, 1)
    out = torch.matmul(torch.exp(logits - lse.unsqueeze(-1)), v)  # (B, Hq, 1, Dv)
    return out.to(query.dtype), lse.float()


def dense_decode_reference(query, keys, values, scale: float | None = None, *, softcap=None, sinks=None):
    """Plain dense decode attention (every key), for the budget >= length case."""
    P = keys.shape[2]  # one page holding every key
    pages = torch.zeros(query.shape[0], keys.shape[1], 1, dtype=torch.long, device=keys.device)
    return sparse_attention_reference(query, keys, values, pages, page_size=max(P, 1), scale=scale,
                                      softcap=softcap, sinks=sinks)
