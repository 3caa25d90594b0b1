"""The selection rules of block-sparse prefill: block scores, cheap, then the one choice rule.

    >>> s = antidiagonal_scores(q, k, block_size=64, stride=16, scale=0.125)   # (B, Hq, nq, nk)
    >>> s = pooled_scores(q, k, block_size=64, scale=0.125)                    # (B, Hq, nq, nk)
    >>> blocks = choose_blocks(s, allowed, config)                             # (B, H, nq, nk) bool

A score is an estimate of the share of a query block's attention that falls in each key block:
every row of allowed blocks sums to 1. Both rules read q (B, Hq, Q, D) and k (B, Hkv, L, D),
fold the query heads of a KV group into one matrix product, and cost far less than attention:

- antidiagonal (XAttention): in every stride x stride tile of the logit matrix, the sum of its
  antidiagonal, obtained as one product of "strided" queries (stride rows reversed, concatenated:
  (Q/stride, stride*D)) and strided keys: (Q/stride) x (L/stride) logits, 1/stride of attention's.
  Softmax per tile row over the allowed tiles, summed per block.
- pooled (FlexPrefill's query-aware estimate): the mean query of a block against the mean key of a
  block, softmaxed over the allowed blocks: (Q/block) x (L/block) logits.

`choose_blocks` is the one choice: the sink and local blocks first, then the others by score
(ties: the lower block wins), kept while the budget lasts and until the threshold's share of the
mass is covered; a shared selection takes the largest share of any head of the group.
"""
from __future__ import annotations

import torch

from gatherlens.ops.dtypes import NEG_INF
from gatherlens.ops.prefill.config import PrefillConfig
from gatherlens.ops.prefill.selection import block_geometry, block_spans
from gatherlens.ops.sparse.geometry import ceil_div

__all__ = ["antidiagonal_scores", "pooled_scores", "forced_blocks", "choose_blocks", "group_scores"]


def _padded(x: torch.Tensor, length: int) -> torch.Tensor:
    """x (B, H, n, D) -> (B, H, length, D) float32 (or float64), zero rows appended."""
    x = x if x.dtype in (torch.float32, torch.float64) else x.float()         # (B, H, n, D)
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.shape[2]))         # (B, H, length, D)


def _grouped_logits(qs: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """qs (B, Hq, A, E), ks (B, Hkv, C, E) -> (B, Hq, A, C): one product per KV group."""
    B, Hq, A, E = qs.shape
    Hkv, C = ks.shape[1], ks.shape[2]
    g = qs.reshape(B, Hkv, (Hq // Hkv) * A, E)                                 # (B, Hkv, G*A, E)
    return torch.matmul(g, ks.transpose(-1, -2)).view(B, Hq, A, C)             # (B, Hq, A, C)


def antidiagonal_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, stride: int, scale: float,
                        window: int | None = None) -> torch.Tensor:
    """q (B, Hq, Q, D), k (B, Hkv, L, D) -> (B, Hq, nq, nk) float32 shares (rows of allowed blocks sum to 1)."""
    B, Hq, Q, D = q.shape
    L = k.shape[2]
    nq, nk = ceil_div(Q, block_size), ceil_div(L, block_size)
    qp = _padded(q, nq * block_size)                                           # (B, Hq, nq*bs, D)
    kp = _padded(k, nk * block_size)                                           # (B, Hkv, nk*bs, D)
    qs = qp.view(B, Hq, -1, stride, D).flip(3).reshape(B, Hq, -1, stride * D)  # (B, Hq, Tq, S*D)
    ks = kp.reshape(B, kp.shape[1], -1, stride * D)                            # (B, Hkv, Tk, S*D)
    logits = _grouped_logits(qs, ks).mul_(scale / stride)                      # (B, Hq, Tq, Tk)
    tiles = block_geometry(Q, L, stride, window, q.device)                     # (Tq', Tk') tile rule
    allowed = torch.zeros(logits.shape[-2:], dtype=torch.bool, device=q.device)  # (Tq, Tk)
    allowed[: tiles.shape[0], : tiles.shape[1]] = tiles
    logits.masked_fill_(~allowed, NEG_INF)
    p = torch.softmax(logits, dim=-1).nan_to_num_(0.0)                         # (B, Hq, Tq, Tk)
    per = block_size // stride
    s = p.view(B, Hq, nq, per, nk, per).sum(dim=(3, 5))                        # (B, Hq, nq, nk)
    return _normalized(s)


def pooled_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, scale: float,
                  window: int | None = None) -> torch.Tensor:
    """q (B, Hq, Q, D), k (B, Hkv, L, D) -> (B, Hq, nq, nk) float32 shares: mean query x mean key per block."""
    B, Hq, Q, D = q.shape
    L = k.shape[2]
    nq, nk = ceil_div(Q, block_size), ceil_div(L, block_size)
    qm = _block_means(_padded(q, nq * block_size), Q, block_size)             # (B, Hq, nq, D)
    km = _block_means(_padded(k, nk * block_size), L, block_size)             # (B, Hkv, nk, D)
    logits = _grouped_logits(qm, km).mul_(scale)                               # (B, Hq, nq, nk)
    logits.masked_fill_(~block_geometry(Q, L, block_size, window, q.device), NEG_INF)
    return torch.softmax(logits, dim=-1).nan_to_num_(0.0)                      # (B, Hq, nq, nk)


def _block_means(x: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """x (B, H, n*bs, D) zero-padded past `length` -> (B, H, n, D): the mean of each block's real rows."""
    B, H, T, D = x.shape
    n = T // block_size
    rows = torch.clamp(length - torch.arange(n, device=x.device) * block_size, max=block_size)  # (n,)
    return x.view(B, H, n, block_size, D).sum(3) / rows.to(x.dtype).view(1, 1, n, 1)  # (B, H, n, D)


def _normalized(s: torch.Tensor) -> torch.Tensor:
    """s (..., nk) >= 0 -> rows that sum to 1 (a zero row stays zero)."""
    total = s.sum(-1, keepdim=True)                                            # (..., 1)
    return s / torch.where(total > 0, total, 1.0)                              # (..., nk)


def group_scores(scores: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """scores (B, Hq, nq, nk) -> (B, Hkv, nq, nk): the largest share of any head of the group, renormalised."""
    B, Hq, nq, nk = scores.shape
    g = scores.view(B, kv_heads, Hq // kv_heads, nq, nk).amax(dim=2)           # (B, Hkv, nq, nk)
    return _normalized(g)


def forced_blocks(query_len: int, key_len: int, config: PrefillConfig, window: int | None = None,
                  device=None) -> torch.Tensor:
    """(nq, nk) bool: the sink blocks and the `local_blocks` nearest blocks of each query block (allowed ones)."""
    bs = config.block_size
    qa, qb, ka, kb = block_spans(query_len, key_len, bs, device)
    last = qb // bs                                                            # (nq,) block of the last query
    j = torch.arange(ka.shape[0], device=device)                               # (nk,)
    near = (j[None, :] > last[:, None] - config.local_blocks) & (j[None, :] <= last[:, None])  # (nq, nk)
    sink = (j < config.sink_blocks)[None, :]                                   # (1, nk)
    return (near | sink) & block_geometry(query_len, key_len, bs, window, device)  # (nq, nk)


def choose_blocks(scores: torch.Tensor, allowed: torch.Tensor, forced: torch.Tensor,
                  config: PrefillConfig) -> torch.Tensor:
    """scores (B, H, nq, nk) shares, allowed / forced (nq, nk) -> kept (B, H, nq, nk) bool.

    Ranked: forced blocks first, then by share descending, the lower block first on ties; a block
    is kept while fewer than `budget` rank before it and the shares ranked before it sum to less
    than `threshold` (forced blocks always; budget and threshold None: every allowed block).
    """
    if config.exact:
        return allowed.expand(scores.shape).clone()                            # (B, H, nq, nk)
    rank_key = torch.where(forced, 2.0, torch.where(allowed, scores, -1.0))    # (B, H, nq, nk)
    order = torch.sort(rank_key, dim=-1, descending=True, stable=True).indices  # (B, H, nq, nk)
    share = torch.gather(torch.where(allowed, scores, 0.0), -1, order)         # (B, H, nq, nk)
    keep = torch.gather(allowed.expand(scores.shape), -1, order)               # (B, H, nq, nk)
    if config.threshold is not None:
        before = share.cumsum(-1) - share                                      # (B, H, nq, nk)
        keep &= before < config.threshold
    if config.budget is not None:
        keep[..., config.budget:] = False
    keep |= torch.gather(forced.expand(scores.shape), -1, order)               # (B, H, nq, nk)
    return torch.zeros_like(keep).scatter_(-1, order, keep)                    # (B, H, nq, nk)
