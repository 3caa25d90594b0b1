"""Top-k attention forward, one chunk of queries at a time (the prefill path).

    >>> out, lse, vals, idx = chunked_forward(problem, query, key, value, need_idx=True)

Per chunk of C queries: logits (B, Hkv, G, C, Lc) against the keys the chunk may see (a causal
chunk stops at its last query's diagonal), select k per row, then one of two sums:

- gather (small k, few queries: decoding): copy the k selected value rows per query,
  (B, Hkv, G, C, k, Dv), and take the weighted sum. Reads only k rows of V.
- dense (prefill, or large k): set every logit outside the selection to -inf (the k-th largest
  is a threshold), softmax the chunk and multiply by V, (C, Lc) @ (Lc, Dv): the same sum with no
  copies, one large matmul. For prefill it beats the gather at every k (many small row copies
  and batched vector products lose to one matmul; `gatherlens bench attention` shows it).
Causal rows that see at most k keys skip the selection. With indices wanted (a selection record,
or autograd), the dense sum masks by the indices and also returns the log-sum-exp.

Nothing of size (B, H, Q, k, D) or (B, H, Q, L) ever exists: chunks bound both to
`CHUNK_ELEMENTS` elements. Softmax statistics are float32 (float64 for float64 input).
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.checks import AttentionProblem
from gatherlens.ops.attention.logits import chunk_logits
from gatherlens.ops.attention.select import indices_to_mask, keep_mask, select_topk
from gatherlens.ops.dtypes import NEG_INF, compute_dtype, stat_dtype

CHUNK_ELEMENTS = 1 << 21  # elements of one (chunk x keys) buffer: 8 MiB of float32, so the
                          # passes over one chunk (mask, select, softmax, matmul) stay in cache
                          # (larger buffers were slower; docs/benchmarks.md)
GATHER_RATIO = 8          # gather when k * GATHER_RATIO <= keys seen ...
GATHER_MAX_QUERIES = 16   # ... and the chunk has at most this many queries (decoding); else dense


def use_gather(k: int, key_len: int, queries: int) -> bool:
    """Gather the k value rows (True) or multiply a dense weight row by V (False).

    With many queries per chunk the dense sum wins even for small k (one large matmul against
    many small row copies and batched vector products); for a few queries against a long cache,
    reading only k rows of V wins (docs/benchmarks.md).
    """
    return k * GATHER_RATIO <= key_len and queries <= GATHER_MAX_QUERIES


def chunk_size(p: AttentionProblem, elements: int | None = None) -> int:
    """Queries per chunk so that one (chunk x keys) or (chunk x k x Dv) buffer holds at most
    `elements` (default CHUNK_ELEMENTS)."""
    elements = CHUNK_ELEMENTS if elements is None else elements
    k = p.k_out
    width = max(p.key_len, k * p.value_dim if use_gather(k, p.key_len, p.q_len) else 0, 1)
    return max(1, min(p.q_len, elements // (p.batch * p.q_heads * width)))


def gather_rows(value: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """value (B, Hkv, L, Dv), idx (B, Hkv, G, C, k) >= 0 -> (B, Hkv, G, C, k, Dv), row copies."""
    B, Hkv, L, Dv = value.shape
    if value.is_contiguous():
        base = torch.arange(0, B * Hkv * L, L, device=idx.device).view(B, Hkv, 1, 1, 1)
        rows = value.view(-1, Dv).index_select(0, (idx + base).reshape(-1))  # (N, Dv)
        return rows.view(*idx.shape, Dv)
    out = value.new_empty(*idx.shape, Dv)                       # a cache view: one head at a time
    for b in range(B):
        for h in range(Hkv):
            out[b, h] = value[b, h].index_select(0, idx[b, h].reshape(-1)).view(*idx.shape[2:], Dv)
    return out


def forward_chunk(p: AttentionProblem, q5, key, value, q0: int, q1: int, *, need_idx: bool,
                  ordered: bool = False):
    """Queries [q0, q1) -> out (B, Hkv, G, C, Dv), lse (B, Hkv, G, C), vals/idx (..., C, k) or None."""
    B, Hkv, G, C, Dv = p.batch, p.kv_heads, p.groups, q1 - q0, p.value_dim
    sd, cd = stat_dtype(q5.dtype), compute_dtype(q5.dtype)
    Lc = p.key_end(q1)
    k = min(p.top_k, Lc)
    if k == 0:                                                  # no query here sees any key
        out = q5.new_zeros(B, Hkv, G, C, Dv)
        lse = torch.full((B, Hkv, G, C), NEG_INF, dtype=sd, device=q5.device)
        return out, lse, None, None
    s = chunk_logits(p, q5, key, q0, q1, Lc)                    # (B, Hkv, G, C, Lc) in cd
    shared = p.share_selection and G > 1
    rank = s.to(sd).sum(2, keepdim=True) if shared else s       # (B, Hkv, G|1, C, Lc)
    gather = use_gather(k, Lc, C)
    vals = idx = None
    if need_idx or gather:
        vals, idx = select_topk(rank, k, ordered=ordered)      # (B, Hkv, G|1, C, k)
        if shared:
            idx = idx.expand(B, Hkv, G, C, k)                   # (B, Hkv, G, C, k)
            vals = s.gather(-1, idx.clamp_min(0)).masked_fill(idx < 0, NEG_INF)
    if gather:
        sf = vals.to(sd)                                        # (B, Hkv, G, C, k)
        lse = torch.logsumexp(sf, dim=-1)                       # (B, Hkv, G, C)
        w = torch.exp(sf - _finite(lse).unsqueeze(-1))          # (B, Hkv, G, C, k), 0 where padded
        rows = gather_rows(value, idx.clamp_min(0))             # (B, Hkv, G, C, k, Dv)
        out = torch.matmul(w.unsqueeze(-2).to(cd), rows.to(cd)).squeeze(-2)  # (B, Hkv, G, C, Dv)
        return out.to(value.dtype), lse, vals, idx
    if idx is not None:
        drop = ~indices_to_mask(idx, Lc)                        # (B, Hkv, G, C, Lc)
    elif shared:
        drop = keep_mask(rank, k)                               # (B, Hkv, 1, C, Lc) or None
        forbidden = rank == NEG_INF                             # a key some head of the group forbids
        drop = forbidden if drop is None else drop | forbidden
    else:
        return _dense_softmax(p, s, value[:, :, :Lc].to(cd), k, q0).to(value.dtype), None, None, None
    out, lse = kept_softmax_sum(s, drop, value[:, :, :Lc].to(cd), sd, shared)
    return out.to(value.dtype), lse, vals, idx


def _dense_softmax(p: AttentionProblem, s, value, k: int, q0: int):
    """The plain forward (no lse, no indices): -inf outside the top k, softmax, times V.

    Fewest passes over the (C, Lc) logits: compare, fill, softmax, matmul.
    """
    B, Hkv, G, C, Lc = s.shape
    # causal rows that see <= top_k keys need no selection: skip them
    r0 = min(C, max(0, p.top_k - p.causal_offset - q0)) if p.causal else 0
    if r0 < C and k < Lc:
        tail = s[..., r0:, :]                                   # (B, Hkv, G, C - r0, Lc)
        tail.masked_fill_(keep_mask(tail, k), NEG_INF)
    w = torch.softmax(s, dim=-1)                                # (B, Hkv, G, C, Lc)
    dead = s.amax(-1, keepdim=True) == NEG_INF if p.mask is not None or p.causal_offset < 0 else None
    if dead is not None and bool(dead.any()):                   # rows without keys: zeros, not nan
        w.masked_fill_(dead, 0.0)
    out = torch.matmul(w.view(B, Hkv, G * C, Lc), value)        # (B, Hkv, G*C, Dv)
    return out.view(B, Hkv, G, C, -1)                           # (B, Hkv, G, C, Dv)


def kept_softmax_sum(s, drop, value, sd, shared=False):
    """Softmax over the kept logits of s (B, Hkv, G, C, Lc), as a dense row times V (B, Hkv, Lc, Dv)
    -> out (B, Hkv, G, C, Dv), lse (B, Hkv, G, C).

    drop: True at keys outside the selection (None: keep all). Overwrites s with the unnormalized
    weights. (sparse_sum.scattered_weights_sum instead starts from the kept keys' weights.)
    """
    B, Hkv, G, C, Lc = s.shape
    # The row max is among the top-k keys, except under share_selection (a group's keys).
    m = s.masked_fill(drop, NEG_INF) if shared and drop is not None else s  # (B, Hkv, G, C, Lc)
    m = _finite(m.amax(-1, keepdim=True))                       # (B, Hkv, G, C, 1)
    w = s.sub_(m).exp_()                                        # (B, Hkv, G, C, Lc) in place on s
    if drop is not None:
        w.masked_fill_(drop, 0.0)
    l = w.sum(-1, dtype=sd)                                     # (B, Hkv, G, C)
    pv = torch.matmul(w.view(B, Hkv, G * C, Lc), value)         # (B, Hkv, G*C, Dv)
    pv = pv.view(B, Hkv, G, C, -1).to(sd)                       # (B, Hkv, G, C, Dv)
    out = pv / torch.where(l > 0, l, torch.ones_like(l)).unsqueeze(-1)
    lse = torch.where(l > 0, m.squeeze(-1).to(sd) + torch.log(l), torch.full_like(l, NEG_INF))
    return out, lse


def _finite(x: torch.Tensor) -> torch.Tensor:
    """-inf (an empty row) -> 0, so exp(s - x) stays 0 instead of nan."""
    return torch.where(x > NEG_INF, x, torch.zeros_like(x))


def chunked_forward(p: AttentionProblem, query, key, value, *, need_idx: bool, ordered: bool = False,
                    need_vals: bool | None = None, chunk_elements: int | None = None):
    """All queries, chunk by chunk -> out (B, Hq, Q, Dv), lse (B, Hq, Q), vals/idx (B, Hq, Q, k).

    lse, vals and idx are None unless need_idx.

    need_vals=False (autograd without a selection record) keeps the indices but not the logits.
    """
    need_vals = need_idx if need_vals is None else need_vals
    B, Hkv, G, Q, Dv, k = p.batch, p.kv_heads, p.groups, p.q_len, p.value_dim, p.k_out
    q5 = query.unflatten(1, (Hkv, G))                           # (B, Hkv, G, Q, D)
    out = query.new_empty(B, Hkv, G, Q, Dv)
    lse = vals = idx = None
    if need_idx:                                                # lse only with the selection
        lse = torch.empty(B, Hkv, G, Q, dtype=stat_dtype(query.dtype), device=query.device)
    if need_vals:
        vals = torch.full((B, Hkv, G, Q, k), NEG_INF, dtype=compute_dtype(query.dtype), device=query.device)
    if need_idx:
        idx = torch.full((B, Hkv, G, Q, k), -1, dtype=torch.long, device=query.device)
    C = chunk_size(p, chunk_elements)
    for q0 in range(0, Q, C):
        q1 = min(Q, q0 + C)
        o, l, v, i = forward_chunk(p, q5, key, value, q0, q1, need_idx=need_idx, ordered=ordered)
        out[:, :, :, q0:q1] = o
        if need_idx:
            lse[:, :, :, q0:q1] = l
        if need_idx and i is not None:
            idx[..., q0:q1, : i.shape[-1]] = i
        if need_vals and v is not None:
            vals[..., q0:q1, : v.shape[-1]] = v
    return (out.flatten(1, 2), None if lse is None else lse.flatten(1, 2),
            None if vals is None else vals.flatten(1, 2), None if idx is None else idx.flatten(1, 2))
