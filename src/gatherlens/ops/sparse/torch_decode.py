"""The torch path of sparse decode: gather the chosen pages, then exact attention over them.

    >>> out, lse = attend_pages(q, cache, pages, scale)             # q (B, Hq, 1, D), pages (B, Hsel, n)
    >>> out, lse = attend_pages(q, cache, pages, scale, key_mask)   # key_mask (B, L), True = attend
    >>> out, lse = attend_pages(q, cache, pages, scale, variant=AttentionVariant(softcap=30.0))  # (B, Hq, 1, Dv)

`cache.gather_pages` copies the n chosen pages of every selection head into a reusable workspace
(one index_select each for K and V); `attend_gathered` then runs exact attention over those rows.
The Triton path (triton_decode.py) computes the same result without the copy. The variant's softcap
caps the scaled logits before the mask, and its sinks ask for an exact lse (ops/attention/variants.py:
decode.py joins the sinks after); values may be Dv wide (cache.value_dim).
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.variants import PLAIN, AttentionVariant, capped, softcap_
from gatherlens.ops.dtypes import NEG_INF, compute_dtype

from .cache import PagedKVCache

__all__ = ["attend_pages", "attend_gathered", "attend_all"]

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend_pages(q: torch.Tensor, cache: PagedKVCache, pages: torch.Tensor, scale: float,
                 key_mask: torch.Tensor | None = None, *, variant: AttentionVariant = PLAIN):
    """Attention of q (B, Hq, 1, D) over the pages (B, Hsel, n, ascending) of `cache`; -1 entries (the
    auto budget's padding after each head's own pages) read nothing.

    key_mask: optional (B, L) bool, True = attend (padded batches): masked keys inside the chosen
    pages get no weight. variant: see attend_gathered. Returns out (B, Hq, 1, Dv) in the compute
    dtype and lse (B, Hq, 1) float32 (with sinks: the compute dtype).
    """
    B, Hq, _, D = q.shape
    Hsel, n = pages.shape[1], pages.shape[2]
    read = pages >= 0  # (B, Hsel, n) False: the auto budget's -1 padding
    padded = not bool(read.all())
    pages = pages.clamp(min=0) if padded else pages  # (B, Hsel, n) a -1 gathered as page 0, then masked
    k, v = cache.gather_pages(pages)  # (B, Hsel, n*P, D), (B, Hsel, n*P, Dv)
    valid = n * cache.page_size - (cache.num_pages * cache.page_size - cache.length)
    keep = None
    if key_mask is not None or padded:
        pos = cache.page_positions(pages)  # (B, Hsel, n*P)
        keep, valid = pos < cache.length, n * cache.page_size  # (B, Hsel, n*P): the last page's tail dropped
        if key_mask is not None:
            keep &= key_mask.gather(-1, pos.clamp(max=cache.length - 1).reshape(B, -1)).view_as(pos)
        if padded:
            keep &= read.repeat_interleave(cache.page_size, dim=-1)  # (B, Hsel, n*P)
    qs = q.view(B, Hsel, Hq // Hsel, D)  # (B, Hsel, R, D)
    out, lse = attend_gathered(qs, k, v, valid, scale, keep, variant=variant)
    return out.reshape(B, Hq, 1, -1), lse.reshape(B, Hq, 1)  # (B, Hq, 1, Dv), (B, Hq, 1)


def attend_all(q: torch.Tensor, cache: PagedKVCache, scale: float, key_mask: torch.Tensor | None = None, *,
               variant: AttentionVariant = PLAIN):
    """Dense attention of q (B, Hq, 1, D) over every cached token, read in place (no gather).

    The KV group's query heads are folded into one (G, D) block per KV head, so K and V are
    read once per group, not repeated per head. key_mask: optional (B, L) bool, True = attend.
    variant: see attend_gathered. Returns out (B, Hq, 1, Dv) in the compute dtype and lse
    (B, Hq, 1) float32 (with sinks: the compute dtype).
    """
    B, Hq, _, D = q.shape
    Hkv, L = cache.kv_heads, cache.length
    keep = None if key_mask is None else key_mask[:, None, :].expand(B, Hkv, L)  # (B, Hkv, L)
    qs = q.reshape(B, Hkv, Hq // Hkv, D)  # (B, Hkv, G, D)
    out, lse = attend_gathered(qs, cache.keys, cache.values, L, scale, keep,
                               variant=variant)  # (B, Hkv, G, Dv), (B, Hkv, G)
    return out.reshape(B, Hq, 1, -1), lse.reshape(B, Hq, 1)  # (B, Hq, 1, Dv), (B, Hq, 1)


def _rows_in_tasks(k: torch.Tensor) -> bool:
    """With several threads and K, V small enough to stay in cache (<= 4 MiB per head), give each
    query row its own task (the kernel's GQA layout): the kernel parallelises over heads only, so
    the folded (G, D) block leaves threads idle, while re-reading a cached K costs little.
    Above that, the folded block reads K and V once per group (docs/bench/notes.md)."""
    return torch.get_num_threads() > 1 and 2 * k.shape[-2] * k.shape[-1] * k.element_size() <= 1 << 22


def attend_gathered(q, k, v, valid: int, scale: float, keep: torch.Tensor | None = None, *,
                    variant: AttentionVariant = PLAIN):
    """Exact attention of q (B, Hs, R, D) over the first `valid` rows of k (B, Hs, S, D), v (B, Hs, S, Dv).

    keep: optional (B, Hs, S) bool, False = no weight; a row with no key left gets out 0, lse -inf.
    variant.softcap: the scaled logits become softcap * tanh(logits / softcap) before the mask.
    variant.sinks (exact lse): return lse in the compute dtype (float64 for float64), differentiable
    in q, not float32 from the fused kernel: what a sink's rescaling needs (decode.py casts it after).
    On CPU without `keep`, a softcap or sinks this is one fused call (PyTorch's flash-attention
    CPU kernel, which also returns the log-sum-exp): one parallel region instead of ~10, which
    matters on a busy machine. Otherwise the explicit matmul / logsumexp / matmul below, in float32
    for half-precision input so the logits keep their precision; without autograd, in place.
    Returns out (B, Hs, R, Dv) and lse (B, Hs, R) float32 (with sinks: the compute dtype).
    """
    k, v = k[:, :, :valid], v[:, :, :valid]  # (B, Hs, S', D), (B, Hs, S', Dv)
    softcap, exact_lse = variant.softcap, variant.sinks is not None
    fused = keep is None and softcap is None and not exact_lse and k.shape[-1] == v.shape[-1]
    if fused and q.device.type == "cpu" and _CPU_FLASH is not None:
        B, Hs, R, D = q.shape
        if R > 1 and _rows_in_tasks(k):  # one task per query head: the kernel splits work by head
            out, lse = _CPU_FLASH(q.reshape(B, Hs * R, 1, D), k, v, 0.0, False, scale=scale)  # (B, Hs*R, 1, D)
            return out.view(B, Hs, R, D), lse.float().view(B, Hs, R)
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, scale=scale)  # (B, Hs, R, D), (B, Hs, R)
        return out, lse.float()
    cd = compute_dtype(k.dtype)
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    if torch.is_grad_enabled() and q.requires_grad:  # the in-place steps below would break autograd
        out, lse = _attend_out_of_place(q, k, v, scale, None if keep is None else keep[:, :, :valid], softcap)
        return out, lse if exact_lse else lse.float()  # (B, Hs, R, Dv), (B, Hs, R)
    logits = torch.matmul(q, k.transpose(-1, -2))  # (B, Hs, R, S')
    softcap_(logits.mul_(scale), softcap)
    if keep is not None:
        logits.masked_fill_(~keep[:, :, None, :valid], NEG_INF)  # (B, Hs, R, S')
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, Hs, R, 1)
    probs = logits.sub_(lse).exp_()  # (B, Hs, R, S')
    if keep is not None:
        probs.nan_to_num_(0.0)  # a row with every key masked: exp(-inf - -inf)
    lse = lse.squeeze(-1)  # (B, Hs, R)
    return torch.matmul(probs, v), lse if exact_lse else lse.float()  # (B, Hs, R, Dv), (B, Hs, R)


def _attend_out_of_place(q, k, v, scale: float, keep, softcap):
    """attend_gathered's explicit steps without in-place ops, for a query that needs a gradient:
    out (B, Hs, R, Dv), lse (B, Hs, R) in the compute dtype."""
    logits = capped(torch.matmul(q, k.transpose(-1, -2)) * scale, softcap)  # (B, Hs, R, S')
    if keep is not None:
        logits = logits.masked_fill(~keep[:, :, None, :], NEG_INF)  # (B, Hs, R, S')
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, Hs, R, 1)
    probs = torch.exp(logits - torch.where(lse > NEG_INF, lse, 0.0))  # (B, Hs, R, S'), 0 in empty rows
    return torch.matmul(probs, v), lse.squeeze(-1)  # (B, Hs, R, Dv), (B, Hs, R)
