"""Plain references for the attention gathers: loops you can read, slow on purpose.

    >>> out, sel = naive_topk_attention(q, k, v, 4, is_causal=True)   # same rules as topk_attention
    >>> out2 = dense_masked_attention(q, k, v, sel.indices)            # the gradient reference

`naive_topk_attention` does, per (batch, head, query): score every key, mask, sort (stable, so a
lower key index wins a tie), take k allowed keys, softmax over them, gather their value rows and
sum. `dense_masked_attention` is ordinary softmax attention in which every key but the selected
ones is masked out; its autograd gradients are what the fast path must reproduce. Both take
`softcap` (logits -> softcap * tanh(logits / softcap), before the mask) and `sinks` (Hq,) (one
more softmax column per head, with no value), written out here as transformers writes them.
"""
from __future__ import annotations

import math

import torch

from gatherlens.ops.attention.selection import AttentionSelection


def naive_apply_attention_scores(scores, values, *, mask=None):
    """softmax(scores + mask) @ values, one query row at a time; an all-masked row gives zeros."""
    B, H, Q, K = scores.shape
    out = scores.new_zeros(B, H, Q, values.shape[-1])           # (B, H, Q, D)
    if mask is not None:
        mask = torch.broadcast_to(mask, scores.shape)           # (B, H, Q, K)
    for b in range(B):
        for h in range(H):
            for i in range(Q):
                row = scores[b, h, i].clone()                   # (K,)
                if mask is not None:
                    m = mask[b, h, i]
                    row = row.masked_fill(~m, -math.inf) if m.dtype == torch.bool else row + m
                if not bool((row > -math.inf).any()):
                    continue
                w = torch.softmax(row, dim=-1)                  # (K,)
                out[b, h, i] = w @ values[b, h]                 # (D,)
    return out


def _full_logits(query, key, *, is_causal, attn_mask, scale, enable_gqa, softcap=None):
    """Scaled, capped, masked logits (B, Hq, Q, L), computed the way the fast path does
    (q * scale) @ k^T, in float32 for 16-bit inputs."""
    B, Hq, Q, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    cd = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    k = key.repeat_interleave(Hq // Hkv, dim=1).to(cd)         # (B, Hq, L, D)
    s = torch.matmul(query.to(cd) * scale, k.transpose(-1, -2))  # (B, Hq, Q, L), 16-bit in float32
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)                   # (B, Hq, Q, L)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, -math.inf)
        else:
            s = s + attn_mask.to(s.dtype)
    if is_causal:
        keep = torch.ones(Q, L, dtype=torch.bool, device=s.device).tril()  # (Q, L) top-left
        s = s.masked_fill(~keep, -math.inf)
    return s


def naive_topk_attention(query, key, value, top_k, *, is_causal=False, attn_mask=None, scale=None,
                         enable_gqa=False, share_selection=False, softcap=None, sinks=None):
    """The reference: returns (out (B, Hq, Q, Dv), AttentionSelection)."""
    B, Hq, Q, D = query.shape
    Hkv, L, Dv = key.shape[1], key.shape[2], value.shape[-1]
    G = Hq // Hkv
    s = _full_logits(query, key, is_causal=is_causal, attn_mask=attn_mask, scale=scale,
                     enable_gqa=enable_gqa, softcap=softcap)    # (B, Hq, Q, L)
    k_out = min(top_k, L)
    out = query.new_zeros(B, Hq, Q, Dv)
    idx = torch.full((B, Hq, Q, k_out), -1, dtype=torch.long)
    sd = torch.float64 if query.dtype == torch.float64 else torch.float32
    wts = torch.zeros(B, Hq, Q, k_out, dtype=sd)
    sel_s = s.new_full((B, Hq, Q, k_out), -math.inf)
    lse = torch.full((B, Hq, Q), -math.inf, dtype=sd)
    for b in range(B):
        for h in range(Hq):
            hk = h // G
            for i in range(Q):
                row = s[b, h, i]                                # (L,)
                if share_selection:
                    rank_row = s[b, hk * G:(hk + 1) * G, i].float().sum(0)  # (L,) group score
                else:
                    rank_row = row
                order = torch.sort(rank_row, descending=True, stable=True).indices  # (L,)
                keep = [int(j) for j in order if rank_row[j] > -math.inf][:top_k]
                sink = None if sinks is None else sinks[h].detach().float().view(1)  # (1,)
                if not keep:
                    lse[b, h, i] = -math.inf if sink is None else float(sink[0])
                    continue
                j = torch.tensor(keep)                          # (n,)
                logits = row[j]                                 # (n,)
                cols = logits.float() if sink is None else torch.cat([logits.float(), sink])  # (n[+1],)
                w = torch.softmax(cols, dim=-1)[: len(keep)]    # (n,) the sink's column dropped
                out[b, h, i] = (w @ value[b, hk, j].float()).to(out.dtype)  # (Dv,)
                n = len(keep)
                idx[b, h, i, :n] = j
                wts[b, h, i, :n] = w.to(wts.dtype)
                sel_s[b, h, i, :n] = logits
                lse[b, h, i] = torch.logsumexp(cols, dim=-1).to(lse.dtype)
    sel = AttentionSelection(
        indices=idx, weights=wts, scores=sel_s, lse=lse, key_len=L, top_k=top_k,
        is_causal=is_causal, share_selection=share_selection, kv_heads=Hkv,
        meta={"path": "naive"},
    )
    return out, sel


def dense_masked_attention(query, key, value, indices, *, scale=None, attn_mask=None, softcap=None,
                           sinks=None):
    """Softmax attention where every key but `indices` (B, Hq, Q, k; -1 = none) is masked.

    Differentiable with ordinary autograd (in sinks (Hq,) too): the gradient reference for
    topk_attention. A float `attn_mask` is added to the logits (its -inf entries are never among
    the indices anyway), after the softcap.
    """
    B, Hq, Q, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k = key.repeat_interleave(Hq // Hkv, dim=1)                 # (B, Hq, L, D)
    v = value.repeat_interleave(Hq // Hkv, dim=1)               # (B, Hq, L, Dv)
    s = torch.matmul(query * scale, k.transpose(-1, -2))       # (B, Hq, Q, L)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)                   # (B, Hq, Q, L)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        s = s + attn_mask.to(s.dtype)
    pad = torch.where(indices < 0, torch.full_like(indices, L), indices)  # (B, Hq, Q, k)
    keep = torch.zeros(B, Hq, Q, L + 1, dtype=torch.bool).scatter_(-1, pad, True)[..., :L]
    any_key = keep.any(-1, keepdim=True)                        # (B, Hq, Q, 1)
    s = s.masked_fill(~keep, -math.inf).masked_fill(~any_key, 0.0)  # (B, Hq, Q, L)
    if sinks is not None:                                       # one more column, no value
        col = sinks.to(s.dtype).view(1, Hq, 1, 1).expand(B, Hq, Q, 1)  # (B, Hq, Q, 1)
        s = torch.cat([s, col], dim=-1)                         # (B, Hq, Q, L + 1)
    w = torch.softmax(s, dim=-1)[..., :L] * any_key             # (B, Hq, Q, L), empty rows -> 0
    return torch.matmul(w, v)                                   # (B, Hq, Q, Dv)
