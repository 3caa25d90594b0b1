"""Autograd for top-k attention: save the selection, recompute logits per chunk in backward.

    >>> out, lse, vals, idx = TopkAttentionFn.apply(query, key, value, sinks, problem, ordered)

`ordered=True` (a selection record was asked for) also returns the selected logits, best first.

Saved for backward: query, key, value, out, the selected indices (int32, (B, H, Q, k)) and the
log-sum-exp per row. Nothing of size (Q x L) is kept: backward walks the same query chunks,
rebuilds the logits of one chunk, turns the indices into a dense keep-mask and applies the
softmax backward restricted to the selected keys (flash-attention style):

    P = exp(S - lse) * keep,  dS = P * (dO @ V^T - rowsum(dO * O)),
    dQ = scale * dS @ K,  dK = dS^T @ (scale * Q),  dV = P^T @ dO.

The selection itself is piecewise constant, so these are the gradients of a dense attention in
which every key but the selected ones is masked (naive.dense_masked_attention). With a softcap,
dS is multiplied by the cap's slope 1 - tanh^2(logit / softcap) before dQ and dK. With sinks
(sinks (Hq,) or None), lse includes the sink, so P is already the weight of each key, and the
sink's own gradient is d sink_h = -sum over rows of head h of exp(sink_h - lse) * rowsum(dO * O).
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.chunked import chunk_size, chunked_forward
from gatherlens.ops.attention.logits import chunk_logits_and_slope
from gatherlens.ops.attention.select import indices_to_mask
from gatherlens.ops.attention.variants import join_sinks, sink_logits
from gatherlens.ops.dtypes import NEG_INF, stat_dtype


class TopkAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, sinks, problem, ordered):
        out, lse, vals, idx = chunked_forward(problem, query, key, value, need_idx=True, ordered=ordered,
                                              need_vals=ordered)
        out, lse = join_sinks(out, lse, sinks)                  # (B, Hq, Q, Dv), (B, Hq, Q)
        vals = query.new_empty(0) if vals is None else vals     # logits only for a selection record
        idx32 = idx.to(torch.int32) if problem.key_len < 2**31 else idx
        ctx.save_for_backward(query, key, value, out, lse, idx32, sinks)
        ctx.problem = problem
        ctx.mark_non_differentiable(lse, vals, idx)
        return out, lse, vals, idx

    @staticmethod
    def backward(ctx, d_out, _d_lse, _d_vals, _d_idx):
        query, key, value, out, lse, idx, sinks = ctx.saved_tensors
        p = ctx.problem
        B, Hkv, G, Q = p.batch, p.kv_heads, p.groups, p.q_len
        cd = stat_dtype(query.dtype)                            # compute dtype of the backward
        q5 = query.to(cd).unflatten(1, (Hkv, G))                # (B, Hkv, G, Q, D)
        k_c, v_c = key.to(cd), value.to(cd)                     # (B, Hkv, L, D), (B, Hkv, L, Dv)
        do5 = d_out.to(cd).unflatten(1, (Hkv, G))               # (B, Hkv, G, Q, Dv)
        o5 = out.to(cd).unflatten(1, (Hkv, G))                  # (B, Hkv, G, Q, Dv)
        lse5 = lse.unflatten(1, (Hkv, G))                       # (B, Hkv, G, Q)
        idx5 = idx.unflatten(1, (Hkv, G))                       # (B, Hkv, G, Q, k)
        dq = torch.zeros_like(q5)                               # (B, Hkv, G, Q, D)
        dk, dv = torch.zeros_like(k_c), torch.zeros_like(v_c)
        C = chunk_size(p)
        for q0 in range(0, Q, C):
            q1 = min(Q, q0 + C)
            Lc, n = p.key_end(q1), q1 - q0
            if Lc == 0:
                continue
            s, slope = chunk_logits_and_slope(p, q5, k_c, q0, q1, Lc)  # (B, Hkv, G, n, Lc) each
            keep = indices_to_mask(idx5[..., q0:q1, :].long(), Lc)  # (B, Hkv, G, n, Lc)
            l = lse5[..., q0:q1].unsqueeze(-1)                  # (B, Hkv, G, n, 1)
            l = torch.where(l > NEG_INF, l, torch.zeros_like(l))
            P = s.sub_(l).exp_().mul_(keep)                     # (B, Hkv, G, n, Lc)
            do = do5[..., q0:q1, :]                             # (B, Hkv, G, n, Dv)
            delta = (do * o5[..., q0:q1, :]).sum(-1, keepdim=True)  # (B, Hkv, G, n, 1)
            dP = torch.matmul(do, v_c[:, :, None, :Lc].transpose(-1, -2))  # (B, Hkv, G, n, Lc)
            dS = P * (dP - delta)                               # (B, Hkv, G, n, Lc)
            dS = dS if slope is None else dS * slope            # through the cap
            dS2 = dS.reshape(B, Hkv, G * n, Lc)                 # (B, Hkv, G*n, Lc)
            P2 = P.reshape(B, Hkv, G * n, Lc)                   # (B, Hkv, G*n, Lc)
            qs = (q5[..., q0:q1, :] * p.scale).reshape(B, Hkv, G * n, -1)  # (B, Hkv, G*n, D)
            dq[..., q0:q1, :] = torch.matmul(dS2, k_c[:, :, :Lc]).view(B, Hkv, G, n, -1) * p.scale
            dk[:, :, :Lc] += torch.matmul(dS2.transpose(-1, -2), qs)  # (B, Hkv, Lc, D)
            dv[:, :, :Lc] += torch.matmul(P2.transpose(-1, -2), do.reshape(B, Hkv, G * n, -1))
        d_sinks = _sinks_grad(sinks, lse, d_out, out) if ctx.needs_input_grad[3] else None
        return (dq.flatten(1, 2).to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), d_sinks, None, None)


def _sinks_grad(sinks, lse, d_out, out) -> torch.Tensor:
    """d sinks (Hq,): -sum over batch and queries of exp(sink - lse) * rowsum(dO * O)."""
    sd = lse.dtype
    delta = (d_out.to(sd) * out.to(sd)).sum(-1)                # (B, Hq, Q)
    share = torch.exp(sink_logits(sinks, lse) - lse)            # (B, Hq, Q) the sink's weight
    share = torch.where(lse > NEG_INF, share, torch.zeros_like(share))
    return (-(share * delta).sum((0, 2))).to(sinks.dtype)       # (Hq,)
