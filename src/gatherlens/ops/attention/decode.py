"""Top-k attention for decoding: a few new queries (usually Q = 1) against a long KV cache.

    >>> out = decode_forward(problem, query, key, value)        # query (B, Hq, 1, D), key (B, Hkv, L, D)

Alignment: the new query is the last position, so it may see every key of the cache. That is
what F.scaled_dot_product_attention does with is_causal=False, and what transformers passes when
q_len == 1; for Q > 1 new queries against a longer cache, pass
`attn_mask=torch.nn.attention.bias.causal_lower_right(Q, L)` (query i sees keys j <= i + L - Q).

Why it is faster than SDPA: q @ K^T must still read all of K, but only k rows of V are read
(gathered), instead of all L. With K and V the same size, about 2x is the ceiling at small k.
All queries form one chunk; GQA multiplies each KV head once for its G query heads.
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.checks import AttentionProblem
from gatherlens.ops.attention.chunked import forward_chunk
from gatherlens.ops.dtypes import NEG_INF, compute_dtype

DECODE_MAX_Q = 16         # at most this many queries take the one-chunk decode path


def is_decode(p: AttentionProblem) -> bool:
    return 1 <= p.q_len <= DECODE_MAX_Q and p.key_len >= 4 * p.q_len


def decode_forward(p: AttentionProblem, query, key, value, *, need_idx: bool, ordered: bool = False):
    """-> out (B, Hq, Q, Dv), lse (B, Hq, Q), vals/idx (B, Hq, Q, k) or None."""
    q5 = query.unflatten(1, (p.kv_heads, p.groups))             # (B, Hkv, G, Q, D)
    out, lse, vals, idx = forward_chunk(p, q5, key, value, 0, p.q_len, need_idx=need_idx, ordered=ordered)
    flat = lambda t: None if t is None else t.flatten(1, 2)     # (B, Hkv, G, ...) -> (B, Hq, ...)
    if need_idx and idx is not None and idx.shape[-1] < p.k_out:  # causal chunk saw fewer keys
        pad = p.k_out - idx.shape[-1]
        idx = torch.nn.functional.pad(idx, (0, pad), value=-1)
        vals = torch.nn.functional.pad(vals, (0, pad), value=NEG_INF)
    if need_idx and idx is None:                               # no query saw any key
        shape = (p.batch, p.kv_heads, p.groups, p.q_len, p.k_out)
        idx = torch.full(shape, -1, dtype=torch.long, device=query.device)
        vals = torch.full(shape, NEG_INF, dtype=compute_dtype(query.dtype), device=query.device)
    return flat(out), flat(lse) if need_idx else None, flat(vals), flat(idx)
