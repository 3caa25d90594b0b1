"""The readable reference of block-sparse prefill: what the fast paths must equal.

    >>> out, lse = block_prefill_reference(q, k, v, blocks, block_size=64)   # blocks (B, H, nq, nk) bool

Per batch row, per query head, per query block: the key blocks its map keeps are gathered, each
logit scaled (and soft-capped), the causal rule (and a local layer's window) masks what a query may
not see, softmax (with the head's sink as one more column with no value), the weighted sum of the
values. Float64 throughout, plain loops and an explicit mask: it shares no code with the fast paths
(`blocked.py`, `fused_prefill.cpp`) but the block geometry's spans.
"""
from __future__ import annotations

import math

import torch

from gatherlens.ops.attention.variants import PLAIN, AttentionVariant

__all__ = ["block_prefill_reference"]


def block_prefill_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
                            block_size: int, scale: float | None = None,
                            variant: AttentionVariant = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, Hq, Q, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv), blocks (B, H, nq, nk) bool, H = Hkv or Hq
    -> out (B, Hq, Q, Dv) in q.dtype, lse (B, Hq, Q) float64 (natural log; -inf for a row that sees nothing).

    The Q queries are the last Q positions of the L keys (bottom-right causal).
    """
    B, Hq, Q, D = q.shape
    Hkv, L, Dv = k.shape[1], k.shape[2], v.shape[3]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, Hq, Q, Dv, dtype=torch.float64)                       # (B, Hq, Q, Dv)
    lse = torch.full((B, Hq, Q), float("-inf"), dtype=torch.float64)           # (B, Hq, Q)
    for b in range(B):
        for h in range(Hq):
            sel = h if blocks.shape[1] == Hq else h // (Hq // blocks.shape[1])
            kv = h // (Hq // Hkv)
            for i in range(blocks.shape[2]):
                rows = slice(i * block_size, min(Q, (i + 1) * block_size))
                chosen = [j for j in range(blocks.shape[3]) if bool(blocks[b, sel, i, j])]
                o, s = _one_block(q[b, h, rows].double(), k[b, kv].double(), v[b, kv].double(), chosen,
                                  block_size, scale, variant, h, first=L - Q + rows.start)
                out[b, h, rows], lse[b, h, rows] = o, s
    return out.to(q.dtype), lse


def _one_block(qi, keys, values, chosen, block_size, scale, variant, head, first):
    """qi (n, D) of the query positions first.. -> out (n, Dv), lse (n,) over the chosen key blocks."""
    n, L = qi.shape[0], keys.shape[0]
    if not chosen:
        return torch.zeros(n, values.shape[1], dtype=torch.float64), torch.full((n,), float("-inf"), dtype=torch.float64)
    pos = torch.cat([torch.arange(j * block_size, min(L, (j + 1) * block_size)) for j in chosen])  # (m,)
    logits = (qi @ keys[pos].T) * scale                                        # (n, m)
    if variant.softcap is not None:
        logits = variant.softcap * torch.tanh(logits / variant.softcap)
    qpos = torch.arange(first, first + n)[:, None]                             # (n, 1)
    seen = pos[None, :] <= qpos                                                # (n, m) causal
    if variant.window is not None:
        seen &= (qpos - pos[None, :]) < variant.window
    logits = logits.masked_fill(~seen, float("-inf"))                          # (n, m)
    if variant.sinks is not None:
        sink = torch.full((n, 1), float(variant.sinks[head]), dtype=torch.float64)  # (n, 1)
        logits = torch.cat([logits, sink], dim=1)                              # (n, m + 1)
        vals = torch.cat([values[pos], torch.zeros(1, values.shape[1], dtype=torch.float64)])  # (m + 1, Dv)
    else:
        vals = values[pos]                                                     # (m, Dv)
    lse = torch.logsumexp(logits, dim=1)                                       # (n,)
    w = torch.exp(logits - lse[:, None]).nan_to_num(0.0)                       # (n, m[+1])
    return w @ vals, lse
