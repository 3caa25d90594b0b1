"""Top-k attention as a sparse weighted sum: an exact threshold per row, then only the kept value rows.

    >>> out, lse, vals, idx = sparse_forward(problem, query, key, value, need_idx=True)

Per chunk of C queries, all heads at once:
1. logits (B, Hkv, G, C, Lc): one matmul per KV head for its G query heads (logits.py);
2. per row the kept keys (threshold.py: the k-th largest logit and the tie rule), as flat positions;
3. per kept key its weight exp(s - max) and per row their sum l, over the kept keys only;
4. the weighted sum of the kept value rows: `F.embedding_bag(mode="sum", per_sample_weights=w)`
   gathers k rows per query and sums them in one kernel (reads k rows of V, not Lc) while
   k * BAG_RATIO <= Lc; for larger k the weights go into the zeroed logit buffer, times V.
Nothing masks, exponentiates or sums the logits outside the selection; the logits are computed
once, so the selection and the sum see the same bits. lse = max + log(l). share_selection ranks the
keys of a KV group by the sum of its query heads' logits; each head weighs them by its own logits.
Workers (numpy, GIL released) do steps 2-3 on row blocks; chunked.py stays the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.ops.attention.checks import AttentionProblem
from gatherlens.ops.attention.chunked import chunk_size
from gatherlens.ops.attention.logits import apply_masks
from gatherlens.ops.attention.threshold import topk_rows
from gatherlens.ops.dtypes import NEG_INF, compute_dtype, stat_dtype

BUDGET = 1 << 21          # elements of one chunk's logits (8 MiB of float32; 16 MiB ran slower)
BAG_RATIO = 3             # gather-sum the k rows while k * BAG_RATIO <= keys seen; else dense
ENABLED = True            # False: every call takes the chunked reference path (tests)


def use_sparse(p: AttentionProblem, query: torch.Tensor) -> bool:
    """This path serves CPU tensors without autograd (the selection runs in numpy)."""
    return ENABLED and query.device.type == "cpu"


def sparse_forward(p: AttentionProblem, query, key, value, *, need_idx: bool, ordered: bool = False):
    """All queries, chunk by chunk -> out (B, Hq, Q, Dv), lse (B, Hq, Q), vals/idx (B, Hq, Q, k).

    lse, vals and idx are None unless need_idx (chunked_forward's contract).
    """
    B, Hkv, G, Q, Dv, k = p.batch, p.kv_heads, p.groups, p.q_len, p.value_dim, p.k_out
    cd = compute_dtype(query.dtype)
    q5 = query.unflatten(1, (Hkv, G))                           # (B, Hkv, G, Q, D)
    table = value.to(cd).reshape(B * Hkv * p.key_len, Dv)       # (B*Hkv*L, Dv) rows to gather
    out = query.new_empty(B, Hkv, G, Q, Dv)
    lse = torch.empty(B, Hkv, G, Q, dtype=stat_dtype(query.dtype))
    vals = torch.full((B, Hkv, G, Q, k), NEG_INF, dtype=cd) if need_idx else None
    idx = torch.full((B, Hkv, G, Q, k), -1, dtype=torch.long) if need_idx else None
    C = chunk_size(p, BUDGET)
    buf = torch.empty(B * Hkv * G * C * p.key_end(Q), dtype=cd)  # the logits of one chunk
    for q0 in range(0, Q, C):
        q1 = min(Q, q0 + C)
        o, l, v, i = sparse_chunk(p, q5, key, table, q0, q1, need_idx=need_idx, ordered=ordered, buf=buf)
        out[:, :, :, q0:q1], lse[:, :, :, q0:q1] = o, l
        if need_idx and i is not None:
            idx[..., q0:q1, : i.shape[-1]], vals[..., q0:q1, : v.shape[-1]] = i, v
    flat = lambda t: None if t is None else t.flatten(1, 2)     # (B, Hkv, G, ...) -> (B, Hq, ...)
    return flat(out), flat(lse) if need_idx else None, flat(vals), flat(idx)


def sparse_chunk(p: AttentionProblem, q5, key, table, q0: int, q1: int, *, need_idx: bool,
                 ordered: bool = False, buf: torch.Tensor | None = None):
    """Queries [q0, q1) -> out (B, Hkv, G, C, Dv), lse (B, Hkv, G, C), vals/idx (..., C, k') or None."""
    B, Hkv, G, C, Dv = p.batch, p.kv_heads, p.groups, q1 - q0, p.value_dim
    sd = stat_dtype(q5.dtype)
    Lc = p.key_end(q1)
    if Lc == 0:                                                 # no query here sees any key
        lse = torch.full((B, Hkv, G, C), NEG_INF, dtype=sd)
        return q5.new_zeros(B, Hkv, G, C, Dv), lse, None, None
    s = logits_into(p, q5, key, q0, q1, Lc, buf)                # (B, Hkv, G, C, Lc) in cd
    shared = p.share_selection and G > 1
    rank = s.to(sd).sum(2, keepdim=True) if shared else s      # (B, Hkv, G|1, C, Lc)
    rv, idx = topk_rows(rank.reshape(-1, Lc), p.top_k)          # (R, k) ascending key, padded
    k = idx.shape[-1]
    rv, idx = rv.view(B, Hkv, -1, C, k), idx.view(B, Hkv, -1, C, k).expand(B, Hkv, G, C, k)
    vals = s.gather(-1, idx.clamp_min(0)).masked_fill_(idx < 0, NEG_INF) if shared else rv
    m = vals.amax(-1, keepdim=True).to(sd)                      # (B, Hkv, G, C, 1)
    m = torch.where(m > NEG_INF, m, torch.zeros_like(m))        # empty rows: exp(-inf - 0) = 0
    w = torch.exp(vals.to(sd) - m)                              # (B, Hkv, G, C, k), 0 where padded
    l = w.sum(-1)                                               # (B, Hkv, G, C)
    if k * BAG_RATIO <= Lc:
        total = bag_sum(w, idx, table, p.key_len)               # (B, Hkv, G, C, Dv)
    else:
        total = dense_sum(w, idx, s, table.view(B, Hkv, p.key_len, Dv)[:, :, :Lc])
    alive = l > 0
    out = total / torch.where(alive, l, torch.ones_like(l)).unsqueeze(-1).to(total.dtype)
    lse = torch.where(alive, m.squeeze(-1) + torch.log(l), torch.full_like(l, NEG_INF))
    if need_idx and ordered:                                    # best first by the ranking, ties by index
        order = rv.argsort(dim=-1, descending=True, stable=True).expand(B, Hkv, G, C, k)
        vals, idx = vals.gather(-1, order), idx.gather(-1, order)
    return out.to(q5.dtype), lse, (vals if need_idx else None), (idx if need_idx else None)


def logits_into(p: AttentionProblem, q5, key, q0: int, q1: int, Lc: int, buf=None) -> torch.Tensor:
    """chunk_logits (logits.py) written into buf: one 2-D matmul per KV head for its G query heads,
    (G*C, D) @ (D, Lc); measured here faster than one batched matmul, and no fresh 8 MiB per chunk."""
    B, Hkv, G, C = p.batch, p.kv_heads, p.groups, q1 - q0
    cd = compute_dtype(q5.dtype)
    n = B * Hkv * G * C * Lc
    s = (buf[:n] if buf is not None and buf.numel() >= n else torch.empty(n, dtype=cd)).view(B, Hkv, G * C, Lc)
    q = q5[:, :, :, q0:q1].to(cd) * p.scale                     # (B, Hkv, G, C, D)
    k = key[:, :, :Lc].to(cd)                                   # (B, Hkv, Lc, D)
    for b in range(B):
        for h in range(Hkv):
            torch.mm(q[b, h].reshape(G * C, -1), k[b, h].t(), out=s[b, h])  # (G*C, Lc)
    return apply_masks(p, s.view(B, Hkv, G, C, Lc), q0, q1)


def bag_sum(w, idx, table, key_len: int) -> torch.Tensor:
    """sum_j w_j * V[idx_j] per row: `F.embedding_bag` over the value table (B*Hkv*L, Dv).

    w, idx (B, Hkv, G, C, k), padding idx -1 with weight 0 -> (B, Hkv, G, C, Dv).
    """
    B, Hkv, G, C, k = idx.shape
    base = torch.arange(0, B * Hkv * key_len, key_len).view(B, Hkv, 1, 1, 1)  # first row of each head
    rows = (idx.clamp_min(0) + base).reshape(-1, k)             # (B*Hkv*G*C, k)
    out = F.embedding_bag(rows, table, mode="sum", per_sample_weights=w.reshape(-1, k).to(table.dtype))
    return out.view(B, Hkv, G, C, -1)


def dense_sum(w, idx, s, value) -> torch.Tensor:
    """The weights added into the zeroed logit buffer s (B, Hkv, G, C, Lc), times V (B, Hkv, Lc, Dv)
    -> (B, Hkv, G, C, Dv): for k near the keys seen, one matmul beats k row gathers."""
    B, Hkv, G, C, Lc = s.shape
    dense = s.zero_().scatter_add_(-1, idx.clamp_min(0), w.to(s.dtype))  # padding adds 0 at key 0
    out = torch.matmul(dense.view(B, Hkv, G * C, Lc), value)    # (B, Hkv, G*C, Dv)
    return out.view(B, Hkv, G, C, -1)
