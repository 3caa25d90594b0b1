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

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gatherlens.ops.attention.checks import AttentionProblem
from gatherlens.ops.attention.chunked import chunk_size
from gatherlens.ops.attention.logits import chunk_logits
from gatherlens.ops.attention.threshold import keep_block, map_row_ranges
from gatherlens.ops.dtypes import NEG_INF, compute_dtype, stat_dtype

BUDGET = 1 << 22          # elements of one chunk's logits (16 MiB of float32)
BAG_RATIO = 3             # gather-sum the k rows while k * BAG_RATIO <= keys seen; else dense
ENABLED = True            # False: every call takes the chunked reference path (tests)


@dataclass
class _Rows:
    """One chunk's selection rows and the logits their weights come from (numpy views)."""

    rank: np.ndarray       # (R, Lc) rows the selection ranks: logits, or a KV group's sum
    logits: np.ndarray     # (B*Hkv, G, C, Lc) the logits the weights use
    k: int
    sets: int              # weight sets per selection row: G under share_selection, else 1
    key_len: int           # L, the stride of one KV head in the value table


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
    for q0 in range(0, Q, C):
        q1 = min(Q, q0 + C)
        o, l, v, i = sparse_chunk(p, q5, key, table, q0, q1, need_idx=need_idx, ordered=ordered)
        out[:, :, :, q0:q1], lse[:, :, :, q0:q1] = o, l
        if need_idx and i is not None:
            idx[..., q0:q1, : i.shape[-1]], vals[..., q0:q1, : v.shape[-1]] = i, v
    flat = lambda t: None if t is None else t.flatten(1, 2)     # (B, Hkv, G, ...) -> (B, Hq, ...)
    return flat(out), flat(lse) if need_idx else None, flat(vals), flat(idx)


def sparse_chunk(p: AttentionProblem, q5, key, table, q0: int, q1: int, *, need_idx: bool,
                 ordered: bool = False):
    """Queries [q0, q1) -> out (B, Hkv, G, C, Dv), lse (B, Hkv, G, C), vals/idx (..., C, k') or None."""
    B, Hkv, G, C, Dv = p.batch, p.kv_heads, p.groups, q1 - q0, p.value_dim
    sd = stat_dtype(q5.dtype)
    Lc = p.key_end(q1)
    if Lc == 0:                                                 # no query here sees any key
        lse = torch.full((B, Hkv, G, C), NEG_INF, dtype=sd)
        return q5.new_zeros(B, Hkv, G, C, Dv), lse, None, None
    s = chunk_logits(p, q5, key, q0, q1, Lc)                    # (B, Hkv, G, C, Lc) in cd
    shared = p.share_selection and G > 1
    rank = s.to(sd).sum(2) if shared else s                     # (B, Hkv, [G,] C, Lc)
    rows = _Rows(rank.reshape(-1, Lc).numpy(), s.view(B * Hkv, G, C, Lc).numpy(), p.top_k,
                 G if shared else 1, p.key_len)
    sel = _merge(map_row_ranges(rows.rank.shape[0], lambda r0, r1: select_block(rows, r0, r1)))
    k = min(p.top_k, Lc)
    if k * BAG_RATIO <= Lc:
        total = _bag_sums(sel, table)                           # (sets, R, Dv)
        total = total.view(B, Hkv, G, C, Dv) if not shared else total.view(G, B, Hkv, C, Dv).movedim(0, 2)
    else:
        total = _dense_sums(sel, s, table.view(B, Hkv, p.key_len, Dv)[:, :, :Lc])  # (B, Hkv, G, C, Dv)
    l = torch.from_numpy(sel["l"])                              # (sets, R) float64
    l = l.view(B, Hkv, G, C) if not shared else l.view(G, B, Hkv, C).movedim(0, 2)
    m = torch.from_numpy(sel["m"]).to(torch.float64)
    m = m.view(B, Hkv, G, C) if not shared else m.view(G, B, Hkv, C).movedim(0, 2)
    alive = l > 0                                               # (B, Hkv, G, C)
    out = total / torch.where(alive, l, torch.ones_like(l)).unsqueeze(-1).to(total.dtype)
    lse = torch.where(alive, m + torch.log(l), torch.full_like(l, NEG_INF)).to(sd)
    if not need_idx:
        return out.to(q5.dtype), lse, None, None
    vals, idx = _padded(sel, k, (B, Hkv, G, C), shared, ordered)
    return out.to(q5.dtype), lse, vals, idx


def select_block(rows: _Rows, r0: int, r1: int) -> dict:
    """Selection rows [r0, r1) -> their kept keys and, per weight set, the weights (a worker's job)."""
    a = rows.rank[r0:r1]                                        # (r, Lc)
    r, Lc = a.shape
    flat = np.flatnonzero(keep_block(a, rows.k))                # (n,) r * Lc + j, ascending
    starts = np.searchsorted(flat, np.arange(r + 1, dtype=np.int64) * Lc)  # (r + 1,)
    counts = np.diff(starts)                                    # (r,)
    local = np.repeat(np.arange(r, dtype=np.int64), counts)     # (n,) row of each kept key
    cols = flat - local * Lc                                    # (n,) key index
    grow = local + r0                                           # (n,) selection row in the chunk
    BH, G, C, _ = rows.logits.shape
    per_head = C * (G if rows.sets == 1 else 1)                 # selection rows per KV head
    head = grow // per_head                                     # (n,) b * Hkv + h
    srow = [grow] if rows.sets == 1 else [(head * G + g) * C + grow % C for g in range(G)]
    logits = rows.logits.reshape(-1)
    res = {"counts": counts, "cols": cols, "table": cols + head * rows.key_len,
           "pos": np.stack([sr * Lc + cols for sr in srow])}   # (sets, n) positions in the logits
    res["vals"] = logits[res["pos"]]                            # (sets, n)
    res["rank"] = a.reshape(-1)[flat][None] if rows.sets > 1 else res["vals"]  # (1|sets, n) order key
    res["m"], res["w"], res["l"] = _weights(res["vals"], counts, starts)
    return res


def _weights(vals: np.ndarray, counts: np.ndarray, starts: np.ndarray):
    """vals (sets, n) of rows (counts) -> row max m (sets, r), w = exp(vals - m) (sets, n), l (sets, r)."""
    sets, r = vals.shape[0], counts.shape[0]
    m = np.full((sets, r), -np.inf, dtype=vals.dtype)
    l = np.zeros((sets, r), dtype=np.float64)
    if vals.shape[1] == 0:
        return m, vals.copy(), l
    alive = counts > 0
    first = starts[:-1][alive]                                  # segment starts of non-empty rows
    m[:, alive] = np.maximum.reduceat(vals, first, axis=1)
    w = np.exp(vals - np.repeat(m, counts, axis=1))             # (sets, n)
    l[:, alive] = np.add.reduceat(w, first, axis=1, dtype=np.float64)
    return m, w, l


def _merge(parts: list) -> dict:
    """Worker results, in row order, as one chunk's arrays (row arrays along the last axis)."""
    if len(parts) == 1:
        return parts[0]
    return {key: np.concatenate([p[key] for p in parts], axis=-1) for key in parts[0]}


def _bag_sums(sel: dict, table: torch.Tensor) -> torch.Tensor:
    """sum_j w_j * table[row_j] per selection row and weight set -> (sets, R, Dv)."""
    idx = torch.from_numpy(sel["table"])                        # (n,)
    counts = torch.from_numpy(sel["counts"])                    # (R,)
    offsets = torch.zeros_like(counts)
    torch.cumsum(counts[:-1], 0, out=offsets[1:])               # (R,) first key of each row
    w = torch.from_numpy(sel["w"]).to(table.dtype)              # (sets, n)
    return torch.stack([F.embedding_bag(idx, table, offsets, mode="sum", per_sample_weights=w[g])
                        for g in range(w.shape[0])])            # (sets, R, Dv)


def _dense_sums(sel: dict, s: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The weights scattered into the zeroed logit buffer s (B, Hkv, G, C, Lc), times V -> (B, Hkv, G, C, Dv)."""
    B, Hkv, G, C, Lc = s.shape
    w = s.zero_()                                               # the logits are no longer needed
    w.view(-1)[torch.from_numpy(sel["pos"]).reshape(-1)] = torch.from_numpy(sel["w"]).reshape(-1).to(s.dtype)
    out = torch.matmul(w.view(B, Hkv, G * C, Lc), value)        # (B, Hkv, G*C, Dv)
    return out.view(B, Hkv, G, C, -1)


def _padded(sel: dict, k: int, shape, shared: bool, ordered: bool):
    """The kept keys as (vals, idx) (B, Hkv, G, C, k), padded with -inf / -1: in ascending key
    index, or ordered best first by the ranking (ties: lower index first)."""
    B, Hkv, G, C = shape
    counts = torch.from_numpy(sel["counts"])                    # (R,)
    R = counts.shape[0]
    row = torch.repeat_interleave(torch.arange(R), counts)      # (n,)
    first = torch.cumsum(counts, 0) - counts                    # (R,)
    slot = torch.arange(row.shape[0]) - first[row]              # (n,) place within the row
    sets = sel["vals"].shape[0]
    idx = torch.full((R, k), -1, dtype=torch.long)
    idx[row, slot] = torch.from_numpy(sel["cols"])
    vals = torch.full((sets, R, k), NEG_INF, dtype=torch.from_numpy(sel["vals"][:0]).dtype)
    vals[:, row, slot] = torch.from_numpy(sel["vals"])
    if ordered:
        key = vals if not shared else torch.full((1, R, k), NEG_INF, dtype=torch.float64).index_put_(
            (torch.zeros_like(row), row, slot), torch.from_numpy(sel["rank"][0]).double())
        order = key.argsort(dim=-1, descending=True, stable=True)  # (1|sets, R, k), padding last
        vals, idx = vals.gather(-1, order.expand_as(vals)), idx.gather(-1, order[0])
    if not shared:
        return vals.view(B, Hkv, G, C, k), idx.view(B, Hkv, G, C, k)
    vals = vals.view(G, B, Hkv, C, k).movedim(0, 2)             # (B, Hkv, G, C, k)
    return vals, idx.view(B, Hkv, 1, C, k).expand(B, Hkv, G, C, k)

