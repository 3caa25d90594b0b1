"""Top-k attention on the CPU as a sparse weighted sum: an exact threshold per row, then only the
kept value rows (the fast path of `topk_attention` without autograd; chunked.py is its reference).

    >>> out, lse, vals, idx = sparse_forward(problem, query, key, value, need_idx=True)

Per chunk of C queries, all heads at once:
1. logits (B, Hkv, G, C, Lc): per KV head, (G*C, D) @ (D, 1024-key blocks) into one reused
   buffer; decoding (few rows) computes K @ q^T and reads the result in place, strided;
2. per row the kept keys, their softmax weights and the log-sum-exp in one C++ operator call
   (select/threshold_select.py); a causal row passes its length instead of being masked;
3. the weighted sum of the kept value rows: `F.embedding_bag(mode="sum", per_sample_weights=w)`
   gathers k rows per query (reads k rows of V, not Lc) while k * BAG_RATIO <= Lc; for larger k
   the row of logits becomes its row of weights in place, times V (one matmul).
Nothing masks, exponentiates or sums the logits outside the selection, and they are computed
once, so the selection and the sum see the same bits. share_selection ranks a KV group's keys by
the sum of its heads' logits (added in head order, as chunked.py does); each head weighs them by
its own logits. Prefill chunks run on one thread each (select/workers.in_workers): one join per call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.ops.attention.checks import AttentionProblem
from gatherlens.ops.attention.chunked import chunk_size
from gatherlens.ops.attention.logits import apply_masks
from gatherlens.ops.attention.select import in_workers, topk_rows, topk_summed_rows, topk_weights_
from gatherlens.ops.attention.variants import softcap_
from gatherlens.ops.dtypes import NEG_INF, compute_dtype, stat_dtype
from gatherlens.ops.sparse.geometry import ceil_div

CHUNK_ELEMENTS = 1 << 22  # elements of one chunk's logits at most (16 MiB of float32) ...
CHUNK_ROWS = 168          # ... and at most this many query rows per KV head (G * C): the matmul
KEY_BLOCK = 1024          # (G*C, D) @ (D, KEY_BLOCK) blocks ran fastest (docs/benchmarks.md) ...
KEY_BLOCK_ROWS = 64       # ... from this many rows G*C on; fewer (decoding): one batched matmul
BAG_RATIO = 4             # gather-sum the k rows while k * BAG_RATIO <= keys seen; else dense
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
    C = min(chunk_size(p, CHUNK_ELEMENTS), max(1, CHUNK_ROWS // G))
    starts = iter(range((Q - 1) // C * C, -1, -C))              # the longest (causal) chunks first

    def work():                                                 # take chunks until none is left
        buf = torch.empty(B * Hkv * G * C * p.key_end(Q), dtype=cd)  # this worker's chunk logits
        for q0 in starts:
            q1 = min(Q, q0 + C)
            o, l, v, i = sparse_chunk(p, q5, key, table, q0, q1, need_idx=need_idx, ordered=ordered, buf=buf)
            out[:, :, :, q0:q1], lse[:, :, :, q0:q1] = o, l
            if need_idx and i is not None:
                idx[..., q0:q1, : i.shape[-1]], vals[..., q0:q1, : v.shape[-1]] = i, v

    in_workers(min(torch.get_num_threads(), ceil_div(Q, C)), work)
    flat = lambda t: None if t is None else t.flatten(1, 2)     # (B, Hkv, G, ...) -> (B, Hq, ...)
    return flat(out), flat(lse) if need_idx else None, flat(vals), flat(idx)


def sparse_chunk(p: AttentionProblem, q5, key, table, q0: int, q1: int, *, need_idx: bool,
                 ordered: bool = False, buf: torch.Tensor | None = None):
    """Queries [q0, q1) -> out (B, Hkv, G, C, Dv), lse (B, Hkv, G, C), vals/idx (..., C, k') or None."""
    B, Hkv, G, C, Dv = p.batch, p.kv_heads, p.groups, q1 - q0, p.value_dim
    Lc = p.key_end(q1)
    if Lc == 0:                                                 # no query here sees any key
        lse = torch.full((B, Hkv, G, C), NEG_INF, dtype=stat_dtype(q5.dtype))
        return q5.new_zeros(B, Hkv, G, C, Dv), lse, None, None
    s = softcap_(logits_into(p, q5, key, q0, q1, Lc, buf), p.softcap)  # (B, Hkv, G, C, Lc) in cd
    lens = None
    if p.mask is not None or not p.causal:
        apply_masks(p, s, q0, q1)
    else:                                                       # causal only: each row a prefix
        lens = (torch.arange(q0, q1) + p.causal_offset + 1).clamp(0, Lc)  # (C,)
    if not need_idx and not (p.share_selection and G > 1) and min(p.top_k, Lc) * BAG_RATIO > Lc:
        R = B * Hkv * G * C                                     # large k: weights in place, times V
        s = s.contiguous()
        lse = topk_weights_(s.view(R, Lc), p.top_k, lens=None if lens is None else lens.repeat(B * Hkv * G))
        value = table.view(B, Hkv, p.key_len, Dv)[:, :, :Lc]    # (B, Hkv, Lc, Dv)
        out = torch.matmul(s.view(B, Hkv, G * C, Lc), value).view(B, Hkv, G, C, Dv)
        return out.to(q5.dtype), lse.view(B, Hkv, G, C).to(stat_dtype(q5.dtype)), None, None
    if p.share_selection and G > 1:
        vals, idx, w, lse, rank = shared_weights(p, s, lens)    # idx: key index (-1 = none)
        rows = idx.clamp_min(0) + _bases(p)
    else:
        R = B * Hkv * G * C
        lens = None if lens is None else lens.repeat(B * Hkv * G)  # (R,)
        base = _bases(p).expand(B, Hkv, G, C, 1).reshape(R)     # (R,) first table row of the head
        vals, rows, w, lse = topk_rows(s.reshape(B * Hkv, G * C, Lc), p.top_k, lens=lens, base=base,
                                       weights=True)
        k = vals.shape[-1]
        vals, rows, w = (t.view(B, Hkv, G, C, k) for t in (vals, rows, w))
        lse = lse.view(B, Hkv, G, C)
        idx = torch.where(vals > NEG_INF, rows - _bases(p), -1) if need_idx else None
        rank = vals
    k = vals.shape[-1]
    if k * BAG_RATIO <= Lc:
        out = F.embedding_bag(rows.reshape(-1, k), table, mode="sum",
                              per_sample_weights=w.reshape(-1, k).to(table.dtype)).view(B, Hkv, G, C, Dv)
    else:
        out = scattered_weights_sum(w, rows - _bases(p), s, table.view(B, Hkv, p.key_len, Dv)[:, :, :Lc])
    if not need_idx:
        return out.to(q5.dtype), lse.to(stat_dtype(q5.dtype)), None, None
    if ordered:                                                 # best first by the ranking, ties by index
        order = rank.argsort(dim=-1, descending=True, stable=True).expand(B, Hkv, G, C, k)
        vals, idx = vals.gather(-1, order), idx.gather(-1, order)
    return out.to(q5.dtype), lse.to(stat_dtype(q5.dtype)), vals, idx


def shared_weights(p: AttentionProblem, s: torch.Tensor, lens):
    """share_selection: rank a KV group's keys by the sum of its G heads' logits; each head then
    weighs the kept keys by its own logits. s (B, Hkv, G, C, Lc), lens (C,) or None ->
    vals, idx (key index, -1 padded), w, lse (B, Hkv, G, C[, k]) and the ranking rank (B, Hkv, 1, C, k)."""
    B, Hkv, G, C, Lc = s.shape
    lens = None if lens is None else lens.repeat(B * Hkv)       # (B*Hkv*C,)
    rank, idx = topk_summed_rows(s, p.top_k, lens=lens)        # (B*Hkv*C, k): sums in head order
    k = idx.shape[-1]
    rank, idx = rank.view(B, Hkv, 1, C, k), idx.view(B, Hkv, 1, C, k).expand(B, Hkv, G, C, k)
    vals = s.gather(-1, idx.clamp_min(0)).masked_fill_(idx < 0, NEG_INF)  # (B, Hkv, G, C, k)
    m = vals.amax(-1, keepdim=True)                             # (B, Hkv, G, C, 1)
    m = torch.where(m > NEG_INF, m, torch.zeros_like(m))        # empty rows: exp(-inf - 0) = 0
    w = torch.exp(vals - m)                                     # (B, Hkv, G, C, k), 0 where padded
    l = w.sum(-1, keepdim=True)                                 # (B, Hkv, G, C, 1)
    lse = torch.where(l > 0, m + torch.log(l), NEG_INF).squeeze(-1)
    return vals, idx, w / torch.where(l > 0, l, 1.0), lse, rank


def _bases(p: AttentionProblem) -> torch.Tensor:
    """(B, Hkv, 1, 1, 1): the first row of each KV head in the value table (B*Hkv*L, Dv)."""
    return torch.arange(0, p.batch * p.kv_heads * p.key_len, p.key_len).view(p.batch, p.kv_heads, 1, 1, 1)


def logits_into(p: AttentionProblem, q5, key, q0: int, q1: int, Lc: int, buf=None) -> torch.Tensor:
    """chunk_logits (logits.py) before the cap and the masks, written into buf: one 2-D matmul per
    KV head for its G query heads, (G*C, D) @ (D, Lc) (faster here than one batched matmul; no
    fresh buffer)."""
    B, Hkv, G, C = p.batch, p.kv_heads, p.groups, q1 - q0
    cd = compute_dtype(q5.dtype)
    n = B * Hkv * G * C * Lc
    s = (buf[:n] if buf is not None and buf.numel() >= n else torch.empty(n, dtype=cd)).view(B, Hkv, G * C, Lc)
    q = q5[:, :, :, q0:q1].to(cd) * p.scale                     # (B, Hkv, G, C, D)
    k = key[:, :, :Lc].to(cd)                                   # (B, Hkv, Lc, D)
    if G * C < KEY_BLOCK_ROWS:                                  # decoding: K @ q^T (faster, docs/benchmarks.md, than
        st = torch.matmul(k, q.reshape(B, Hkv, G * C, -1).transpose(-1, -2))  # q @ K^T), (B, Hkv, Lc, G*C)
        return st.transpose(-1, -2).unflatten(2, (G, C))        # a strided view, no copy
    for b in range(B):
        for h in range(Hkv):
            qh = q[b, h].reshape(G * C, -1)                     # (G*C, D)
            for j in range(0, Lc, KEY_BLOCK):
                j1 = min(Lc, j + KEY_BLOCK)
                torch.mm(qh, k[b, h, j:j1].t(), out=s[b, h, :, j:j1])  # (G*C, j1 - j)
    return s.view(B, Hkv, G, C, Lc)


def scattered_weights_sum(w, idx, s, value) -> torch.Tensor:
    """Weights w (B, Hkv, G, C, k) at keys idx, added into the zeroed logit buffer s (B, Hkv, G, C, Lc),
    times V (B, Hkv, Lc, Dv) -> (B, Hkv, G, C, Dv): for k near the keys seen, one matmul beats k
    row gathers (chunked.kept_softmax_sum instead starts from the logits and a drop mask)."""
    B, Hkv, G, C, Lc = s.shape
    dense = s.zero_().scatter_add_(-1, idx.clamp_min(0), w.to(s.dtype))  # padding adds 0 at key 0
    out = torch.matmul(dense.reshape(B, Hkv, G * C, Lc), value)  # (B, Hkv, G*C, Dv)
    return out.view(B, Hkv, G, C, -1)
