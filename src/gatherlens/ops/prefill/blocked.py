"""The torch path of block-sparse prefill: the kept key blocks gathered, their partial softmaxes merged.

    >>> out, lse = block_prefill(q, k, v, blocks, block_size=64)    # same signature as naive.py

The "torch" row of attend.BLOCK_PREFILL (fused_prefill.py's C++ operator is the "native" one, where
it fits). Every query block of every selection head is one row ("pair") of batched calls: its G
query heads folded into G * block rows (grouped-query attention: one gather per KV head when the selection is
shared). A kept key block is either *whole* (every query of the block sees every key of it: no
mask) or *partial* (the diagonal, a window's edge). The whole blocks of each pair are listed in
ascending order, and the pairs that keep the same number of them attend in one call, with no
padding and no mask; the partial blocks follow, one per step, masked (the aligned diagonal:
causal). Each step gives an
(out, lse) that joins the running one by log-sum-exp (flash attention's merge). A step runs
on torch's CPU flash-attention kernel where it fits (CPU, no soft-capping, no mask but the
diagonal's causal one, keys and values of one width), else as plain products. Sinks join at the
end (`variants.join_sinks`). Logits and sums run in float32 for 16-bit inputs.
"""
from __future__ import annotations

import math

import torch

from gatherlens.ops.attention.variants import PLAIN, AttentionVariant, join_sinks, softcap_
from gatherlens.ops.dtypes import NEG_INF, compute_dtype
from gatherlens.ops.prefill.selection import block_spans

__all__ = ["block_prefill", "GATHERED", "whole_blocks"]

GATHERED = 1 << 24  # most gathered key and value elements one call holds
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def whole_blocks(query_len: int, key_len: int, block_size: int, window: int | None = None, device=None):
    """(nq, nk) bool: every query of block i sees every key of block j (no mask needed); a last key
    block cut short is never whole (its padding slots must be masked)."""
    qa, qb, ka, _ = block_spans(query_len, key_len, block_size, device)
    ok = (ka + block_size - 1)[None, :] <= qa[:, None]                        # (nq, nk)
    if window is not None:
        ok &= (qb[:, None] - ka[None, :]) < window                            # (nq, nk)
    return ok


def _fold_queries(q: torch.Tensor, heads: int, nq: int, bs: int, dtype) -> torch.Tensor:
    """q (B, Hq, Q, D) -> (B*H*nq, G*bs, D): a selection head's G query heads folded per query block."""
    B, Hq, Q, D = q.shape
    qp = torch.nn.functional.pad(q.to(dtype), (0, 0, 0, nq * bs - Q))        # (B, Hq, nq*bs, D)
    qp = qp.view(B, heads, Hq // heads, nq, bs, D).permute(0, 1, 3, 2, 4, 5)  # (B, H, nq, G, bs, D)
    return qp.reshape(B * heads * nq, (Hq // heads) * bs, D)                  # (P, G*bs, D)


def _blocked_rows(x: torch.Tensor, nk: int, bs: int, dtype) -> torch.Tensor:
    """x (B, Hkv, L, E) -> (B*Hkv*nk, bs, E): every key block of every KV head, zero-padded."""
    B, Hkv, L, E = x.shape
    xp = torch.nn.functional.pad(x.to(dtype), (0, 0, 0, nk * bs - L))        # (B, Hkv, nk*bs, E)
    return xp.reshape(B * Hkv * nk, bs, E)                                    # (B*Hkv*nk, bs, E) (a copy for a strided x)


def _lists(kept: torch.Tensor, base: torch.Tensor):
    """kept (P, nk) bool, base (P,) first row of each pair's KV head -> (idx (P, K) ascending, counts (P,),
    rows (P, K) into the blocked keys); K the longest list (0 when nothing is kept)."""
    counts = kept.sum(-1)                                                     # (P,)
    K = int(counts.max()) if counts.numel() else 0
    idx = torch.sort(kept.to(torch.int8), dim=-1, descending=True, stable=True).indices[:, :K]  # (P, K)
    return idx, counts, base[:, None] + idx                                   # (P, K) x2


def block_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, block_size: int,
                  scale: float | None = None, variant: AttentionVariant = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, Hq, Q, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv), blocks (B, H, nq, nk) bool (H = Hkv or Hq)
    -> out (B, Hq, Q, Dv) in q.dtype, lse (B, Hq, Q) (float32, float64 for float64 inputs).

    The Q queries are the last Q of the L keys (bottom-right causal), as in a prefill.
    """
    B, Hq, Q, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    H, bs, cd = blocks.shape[1], block_size, compute_dtype(q.dtype)
    nq, nk = blocks.shape[2], blocks.shape[3]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qf = _fold_queries(q, H, nq, bs, cd)                                      # (P, R, D)
    kb, vb = _blocked_rows(k, nk, bs, cd), _blocked_rows(v, nk, bs, cd)       # (B*Hkv*nk, bs, D|Dv)
    pair = torch.arange(B * H * nq, device=q.device)                          # (P,)
    n = pair // nq                                                            # (P,) selection row b*H + h
    base = ((n // H) * Hkv + (n % H) * Hkv // H) * nk                         # (P,)
    kept = blocks.reshape(-1, nk)                                             # (P, nk)
    whole = kept & whole_blocks(Q, L, bs, variant.window, q.device).repeat(B * H, 1)  # (P, nk)
    state = _state(qf, vb.shape[2])
    step = _Step(scale, variant.softcap, Hq // H, bs)
    _walk_whole(qf, kb, vb, _lists(whole, base), state, step)
    qpos = _query_positions(pair % nq, Hq // H, bs, L - Q)                    # (P, R)
    _walk_partial(qf, kb, vb, _lists(kept & ~whole, base), qpos, state, step, variant.window)
    out, lse = _finish(state, B, H, Hq // H, nq, bs, Q)                       # (B, Hq, Q, Dv), (B, Hq, Q)
    out, lse = join_sinks(out, lse, variant.sinks)
    return out.to(q.dtype), lse


def _state(qf: torch.Tensor, Dv: int) -> list:
    """[lse (P, R), out (P, R, Dv)]: the attention so far of every folded row (lse -inf: no key yet)."""
    P, R, _ = qf.shape
    lse = torch.full((P, R), NEG_INF, dtype=qf.dtype, device=qf.device)       # (P, R)
    return [lse, torch.zeros(P, R, Dv, dtype=qf.dtype, device=qf.device)]


def _merge(state: list, sel, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Join one step's out (p, R, Dv), lse (p, R) into the running attention of the pairs `sel`."""
    old_lse, old_out = state[0][sel], state[1][sel]                           # (p, R), (p, R, Dv)
    lse = lse.to(old_lse.dtype)                                               # (p, R)
    new = torch.logaddexp(old_lse, lse)                                       # (p, R)
    safe = torch.where(new == NEG_INF, 0.0, new)                              # (p, R)
    a, b = torch.exp(old_lse - safe)[..., None], torch.exp(lse - safe)[..., None]  # (p, R, 1) x2
    state[1][sel] = old_out * a + out.to(old_out.dtype) * b                   # (p, R, Dv)
    state[0][sel] = new


class _Step:
    """One attention step over gathered keys: the CPU flash kernel where it fits, else plain products."""

    def __init__(self, scale: float, softcap: float | None, groups: int, block_size: int):
        self.scale, self.softcap, self.groups, self.block_size = scale, softcap, groups, block_size

    def flash_fits(self, q: torch.Tensor, v: torch.Tensor) -> bool:
        return (_CPU_FLASH is not None and q.device.type == "cpu" and self.softcap is None
                and q.shape[-1] == v.shape[-1] and not (torch.is_grad_enabled() and q.requires_grad))

    def __call__(self, q, k, v, *, causal: bool = False, seen: torch.Tensor | None = None):
        """q (p, R, D), k (p, n, D), v (p, n, Dv); causal: the aligned diagonal block (n = block);
        seen (p, R, n) bool, True = may attend -> out (p, R, Dv), lse (p, R)."""
        if seen is None and self.flash_fits(q, v):
            p, R, D = q.shape
            if causal:  # the causal rule is per query head: unfold G
                G, n = self.groups, k.shape[1]
                qh = q.view(p, G, R // G, D)                                  # (p, G, bs, D)
                out, lse = _CPU_FLASH(qh, k[:, None].expand(p, G, n, D), v[:, None].expand(p, G, n, -1), 0.0,
                                      True, scale=self.scale)                 # (p, G, bs, Dv), (p, G, bs)
                return out.reshape(p, R, -1), lse.reshape(p, R)
            out, lse = _CPU_FLASH(q[:, None], k[:, None], v[:, None], 0.0, False, scale=self.scale)
            return out[:, 0], lse[:, 0]                                       # (p, R, Dv), (p, R)
        s = torch.bmm(q, k.transpose(1, 2)).mul_(self.scale)                  # (p, R, n)
        softcap_(s, self.softcap)
        if causal:
            seen = _diagonal(self.groups, self.block_size, q.device)          # (R, bs)
        if seen is not None:
            s.masked_fill_(~seen, NEG_INF)
        lse = torch.logsumexp(s, dim=-1)                                      # (p, R)
        safe = torch.where(lse == NEG_INF, 0.0, lse)                          # (p, R)
        return torch.bmm(torch.exp_(s.sub_(safe[..., None])), v), lse         # (p, R, Dv), (p, R)


def _diagonal(G: int, bs: int, device) -> torch.Tensor:
    """(G*bs, bs) bool: row (g, r) sees key c <= r (an aligned diagonal block, heads folded)."""
    r = torch.arange(bs, device=device)                                       # (bs,)
    return (r[None, :] <= r[:, None]).repeat(G, 1)                            # (G*bs, bs)


def _walk_whole(qf, kb, vb, lists, state, step) -> None:
    """The whole blocks: one call per group of pairs keeping the same number of them (no padding, no mask),
    a group split so that its gathered keys and values stay under GATHERED elements."""
    idx, counts, rows = lists
    bs, width = kb.shape[1], kb.shape[2] + vb.shape[2]
    for e in torch.unique(counts).tolist():
        if e == 0:
            continue
        group = torch.nonzero(counts == e).squeeze(1)                         # (g,)
        per = max(1, GATHERED // (e * bs * width))
        for s0 in range(0, group.shape[0], per):
            sel = group[s0:s0 + per]                                          # (p,)
            r = rows[sel, :e].reshape(-1)                                     # (p*e,)
            kg = kb.index_select(0, r).view(sel.shape[0], e * bs, -1)         # (p, e*bs, D)
            vg = vb.index_select(0, r).view(sel.shape[0], e * bs, -1)         # (p, e*bs, Dv)
            out, lse = step(qf[sel], kg, vg)                                  # (p, R, Dv), (p, R)
            state[0][sel], state[1][sel] = lse.to(state[0].dtype), out.to(state[1].dtype)


def _query_positions(block: torch.Tensor, G: int, bs: int, offset: int) -> torch.Tensor:
    """block (P,) query block of each pair -> (P, G*bs) absolute position of each folded row."""
    r = torch.arange(bs, device=block.device).repeat(G)                       # (G*bs,)
    return offset + block[:, None] * bs + r[None, :]                          # (P, G*bs)


def _walk_partial(qf, kb, vb, lists, qpos, state, step, window) -> None:
    """The partial blocks (diagonal, window edge), one per step over the pairs that have one, masked."""
    idx, counts, rows = lists
    bs = kb.shape[1]
    offs = torch.arange(bs, device=qf.device)                                 # (bs,)
    for j in range(rows.shape[1]):
        sel = torch.nonzero(counts > j).squeeze(1)                            # (p,)
        r = rows[sel, j]                                                      # (p,)
        kpos = idx[sel, j, None] * bs + offs                                  # (p, bs)
        qp = qpos[sel][:, :, None]                                            # (p, R, 1)
        if window is None and bool((qp[:, :bs, 0] - kpos == 0).all()):      # aligned diagonals: causal
            _merge(state, sel, *step(qf[sel], kb[r], vb[r], causal=True))
            continue
        seen = kpos[:, None, :] <= qp                                         # (p, R, bs)
        if window is not None:
            seen &= (qp - kpos[:, None, :]) < window
        _merge(state, sel, *step(qf[sel], kb[r], vb[r], seen=seen))


def _finish(state, B, H, G, nq, bs, Q):
    """[lse, out] of the folded rows -> out (B, Hq, Q, Dv), lse (B, Hq, Q)."""
    lse, out = state
    Dv = out.shape[-1]
    out = out.view(B, H, nq, G, bs, Dv).permute(0, 1, 3, 2, 4, 5).reshape(B, H * G, nq * bs, Dv)  # (B, Hq, nq*bs, Dv)
    lse = lse.view(B, H, nq, G, bs).permute(0, 1, 3, 2, 4).reshape(B, H * G, nq * bs)  # (B, Hq, nq*bs)
    return out[:, :, :Q], lse[:, :, :Q]
