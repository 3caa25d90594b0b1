"""`topk_attention`: F.scaled_dot_product_attention with one more argument, `top_k`.

    >>> out = topk_attention(q, k, v, top_k=64, is_causal=True)                  # (B, Hq, Q, Dv)
    >>> out, sel = topk_attention(q, k, v, 64, enable_gqa=True, return_selection=True)
    >>> sel.indices.shape                                                        # (B, Hq, Q, 64)

Dispatch: inputs that need gradients go through the autograd Function (autograd.py, chunked
forward + chunked recompute backward); a few queries against a long cache take the decode path
(decode.py); everything else the chunked prefill path (chunked.py). All share one selection rule
(select.py) and are tested against the per-query loop in naive.py.
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.autograd import TopkAttentionFn
from gatherlens.ops.attention.checks import check_topk_args
from gatherlens.ops.attention.chunked import chunked_forward, stat_dtype
from gatherlens.ops.attention.decode import decode_forward, is_decode
from gatherlens.ops.attention.selection import AttentionSelection


def topk_attention(query, key, value, top_k, *, is_causal=False, attn_mask=None, scale=None,
                   enable_gqa=False, share_selection=False, return_selection=False):
    """Attention over each query's `top_k` highest-scoring allowed keys.

        >>> q = torch.randn(1, 8, 128, 64); k = v = torch.randn(1, 2, 128, 64)
        >>> topk_attention(q, k, v, 16, is_causal=True, enable_gqa=True).shape
        torch.Size([1, 8, 128, 64])

    Arguments are those of `F.scaled_dot_product_attention`: query (B, Hq, Q, D), key (B, Hkv, L, D),
    value (B, Hkv, L, Dv); `attn_mask` bool (True = attend) or additive float, broadcastable to
    (B, Hq, Q, L), or a `torch.nn.attention.bias.CausalBias`; `scale` defaults to 1/sqrt(D);
    `enable_gqa` lets Hq be a multiple of Hkv. Unlike SDPA, `is_causal` and `attn_mask` may be
    combined (both apply).

    Rules:
    - Per query, logits = scale * q.k + float mask; keys forbidden by the causal rule, a False in a
      bool mask or -inf in a float mask are not allowed. Masks apply before the selection.
    - `is_causal` is SDPA's: query i sees keys j <= i, aligned top-left when Q != L. For decoding
      (Q = 1 against a cache) pass is_causal=False, as transformers does: the query is the last
      position and sees the whole cache. For Q > 1 new queries at the end of a cache pass
      `attn_mask=causal_lower_right(Q, L)`.
    - The `top_k` allowed keys with the highest logits are kept; ties go to the lower key index.
      Fewer allowed keys than `top_k`: all of them (indices padded with -1). A query with no
      allowed key gets a zero output row and lse = -inf (SDPA gives NaN there).
    - Softmax over the kept logits, weighted sum of their value rows. With top_k >= the number of
      allowed keys this equals SDPA.
    - `share_selection` (GQA): one key set per KV head, ranked by the sum over its query heads'
      logits (a key forbidden for any head of the group is not selected); each head then takes
      its softmax over that set.
    - Differentiable in query, key and value (not through the mask or the selection itself).

    Returns out (B, Hq, Q, Dv), or (out, AttentionSelection) with `return_selection=True`:
    indices (B, Hq, Q, k) best first, weights, selected logits and lse (B, Hq, Q) such that
    out = sum_j exp(score_j - lse) * value_j; lse is float32 (float64 for float64 inputs).
    """
    p = check_topk_args(query, key, value, top_k, is_causal=is_causal, attn_mask=attn_mask,
                        scale=scale, enable_gqa=enable_gqa, share_selection=share_selection)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if p.batch == 0 or p.q_heads == 0:                         # nothing to attend: empty results
        sd = stat_dtype(query.dtype)
        out = query.new_zeros(p.batch, p.q_heads, p.q_len, p.value_dim)       # (B, Hq, Q, Dv)
        lse = torch.empty(p.batch, p.q_heads, p.q_len, dtype=sd, device=query.device)
        vals = torch.empty(p.batch, p.q_heads, p.q_len, p.k_out, dtype=sd, device=query.device)
        idx = torch.empty(vals.shape, dtype=torch.long, device=query.device)  # (B, Hq, Q, k)
        path = "empty"
    elif needs_grad:
        out, lse, vals, idx = TopkAttentionFn.apply(query, key, value, p, bool(return_selection))
        path = "autograd"
    elif is_decode(p):
        out, lse, vals, idx = decode_forward(p, query, key, value, need_idx=bool(return_selection),
                                             ordered=bool(return_selection))
        path = "decode"
    else:
        out, lse, vals, idx = chunked_forward(p, query, key, value, need_idx=bool(return_selection),
                                              ordered=bool(return_selection))
        path = "chunked"
    if not return_selection:
        return out
    return out, _selection(p, vals, idx, lse, is_causal, path)


def _selection(p, vals, idx, lse, is_causal, path) -> AttentionSelection:
    sd = stat_dtype(vals.dtype)
    l = torch.where(lse > float("-inf"), lse, torch.zeros_like(lse)).unsqueeze(-1)  # (B, Hq, Q, 1)
    weights = torch.exp(vals.detach().to(sd) - l).masked_fill(idx < 0, 0.0)      # (B, Hq, Q, k)
    return AttentionSelection(
        indices=idx, weights=weights, scores=vals.detach(), lse=lse.detach(), key_len=p.key_len,
        top_k=p.top_k, is_causal=bool(is_causal) or p.causal, share_selection=p.share_selection,
        kv_heads=p.kv_heads,
        meta={"scale": p.scale, "causal_offset": p.causal_offset, "path": path},
    )
