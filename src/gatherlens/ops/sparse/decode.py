"""Sparse decode: score page summaries, gather only the chosen pages, attend over them exactly.

    >>> cache = PagedKVCache(batch=1, kv_heads=8, head_dim=128)
    >>> cache.append(k, v)                                  # (B, Hkv, L, D)
    >>> out = sparse_decode(q, cache, budget=2048)          # q (B, Hq, 1, D) -> (B, Hq, 1, D)
    >>> out, lse, sel = sparse_decode(q, cache, budget=2048, return_lse=True, return_selection=True)

Reads the page summaries (2D per page) plus `budget` tokens of K and V, instead of all of K and V.
With budget >= cache.length every page is read and the result is dense attention.
"""
from __future__ import annotations

import math
import os

import torch

from gatherlens.errors import GatherTypeError, GatherValueError

from .cache import PagedKVCache
from .select import GROUP_SCORES, check_budget, select_pages
from .selection import PageSelection

__all__ = ["sparse_decode", "gather_pages", "attend_gathered"]

BACKENDS = ("auto", "torch", "triton")


def gather_pages(cache: PagedKVCache, pages: torch.Tensor, query_heads: int):
    """Copy the chosen pages' keys and values into (B, Hsel, n * P, D) tensors (one index_select each).

    The tensors are views of the cache's workspace: valid until the next decode on this cache.

    pages: (B, Hsel, n) page ids; Hsel = kv_heads or query_heads (then head h reads KV head h // G).
    """
    B, Hsel, n = pages.shape
    Hkv, P, D = cache.kv_heads, cache.page_size, cache.head_dim
    cap = cache._k.shape[2]
    kv_of = torch.arange(Hsel, device=pages.device) * Hkv // Hsel  # (Hsel,) KV head of each
    row0 = (torch.arange(B, device=pages.device).view(B, 1) * Hkv + kv_of.view(1, Hsel)) * cap  # (B, Hsel)
    rows = (pages + row0.unsqueeze(-1)).reshape(-1)  # (B * Hsel * n,) rows of the (B*Hkv*cap, P*D) view
    k, v = cache.workspace(rows.numel())  # (B*Hsel*n, P*D) each, reused across steps
    torch.index_select(cache._k.view(B * Hkv * cap, P * D), 0, rows, out=k)  # (B*Hsel*n, P*D)
    torch.index_select(cache._v.view(B * Hkv * cap, P * D), 0, rows, out=v)  # (B*Hsel*n, P*D)
    return k.view(B, Hsel, n * P, D), v.view(B, Hsel, n * P, D)


def attend_gathered(q, k, v, valid: int, scale: float):
    """Exact attention of q (B, Hs, R, D) over the first `valid` rows of k, v (B, Hs, S, D).

    On CPU this is one fused call (PyTorch's flash-attention CPU kernel, which also returns the
    log-sum-exp): one parallel region instead of ~10, which matters on a busy machine. Elsewhere,
    and if that kernel is missing, the explicit matmul / logsumexp / matmul below; half-precision
    inputs are computed in float32 so the logits keep their precision.
    returns out (B, Hs, R, D) and lse (B, Hs, R) float32.
    """
    k, v = k[:, :, :valid], v[:, :, :valid]  # (B, Hs, S', D)
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, scale=scale)  # (B, Hs, R, D), (B, Hs, R)
        return out, lse.float()
    if k.dtype in (torch.bfloat16, torch.float16):
        k, v, q = k.float(), v.float(), q.float()
    logits = torch.matmul(q, k.transpose(-1, -2))  # (B, Hs, R, S')
    logits.mul_(scale)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, Hs, R, 1)
    probs = logits.sub_(lse).exp_()  # (B, Hs, R, S')
    return torch.matmul(probs, v), lse.squeeze(-1).float()  # (B, Hs, R, D), (B, Hs, R)


_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _check(query, cache, budget, page_size, group_score, backend):
    if not isinstance(cache, PagedKVCache):
        raise GatherTypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    if not isinstance(query, torch.Tensor):
        raise GatherTypeError(f"query must be a torch.Tensor, got {type(query).__name__}")
    if not query.dtype.is_floating_point:
        raise GatherTypeError(f"query must be a floating tensor, got {query.dtype}")
    check_budget(budget)
    if page_size is not None and page_size != cache.page_size:
        raise GatherValueError(
            f"page_size = {page_size!r} does not match the cache's page_size = {cache.page_size}")
    if query.ndim != 4 or query.shape[2] != 1:
        raise GatherValueError(
            f"query has shape {tuple(query.shape)}; expected (B, Hq, 1, D): one decode query per head")
    B, Hq, _, D = query.shape
    if B != cache.batch or D != cache.head_dim:
        raise GatherValueError(
            f"query (B, Hq, 1, D) = {tuple(query.shape)} does not match the cache's "
            f"batch = {cache.batch}, head_dim = {cache.head_dim}")
    if Hq == 0 or Hq % cache.kv_heads:
        raise GatherValueError(
            f"query heads Hq = {Hq} must be a multiple of the cache's kv_heads = {cache.kv_heads}")
    if cache.length == 0:
        raise GatherValueError("cache is empty (length 0): append keys and values before decoding")
    if group_score not in GROUP_SCORES:
        raise GatherValueError(f"group_score = {group_score!r} must be one of {GROUP_SCORES}")
    if backend not in BACKENDS:
        raise GatherValueError(f"backend = {backend!r} must be one of {BACKENDS}")
    if query.device != cache._k.device:
        raise GatherValueError(f"query is on {query.device} but the cache is on {cache._k.device}")


def sparse_decode(
    query: torch.Tensor,
    cache: PagedKVCache,
    budget: int = 2048,
    page_size: int | None = None,
    share_selection: bool = True,
    return_lse: bool = False,
    return_selection: bool = False,
    *,
    scale: float | None = None,
    group_score: str = "max",
    backend: str = "auto",
):
    """Decode attention over the `budget` tokens whose pages score highest.

    query:     (B, Hq, 1, D), Hq a multiple of cache.kv_heads (GQA: G = Hq // Hkv per group).
    cache:     the PagedKVCache holding L >= 1 tokens.
    budget:    tokens to read (>= 1). Pages are whole; page 0 and the last page are always read,
               so at least 2 pages are read even for a smaller budget. budget >= L is dense.
    page_size: optional check that the cache uses this page size.
    share_selection: True: the G query heads of a KV group read the same pages (what keeps
               memory traffic at `budget` rows per KV head); False: each query head chooses.
    scale:     logit scale, default 1 / sqrt(D).
    group_score: "max" or "sum" of the group's page bounds, for shared selection.
    backend:   "torch", "triton" (CUDA, or TRITON_INTERPRET=1 on CPU) or "auto" (triton for
               CUDA tensors when triton imports, else torch).
    returns    out (B, Hq, 1, D) in query.dtype; then lse (B, Hq, 1) float32 if return_lse; then a
               PageSelection if return_selection.

    The query is cast to cache.dtype. The torch path gathers into the cache's reusable workspace,
    so run one decode per cache at a time. Gradients flow to the query (the cache is detached).
    """
    _check(query, cache, budget, page_size, group_score, backend)
    B, Hq, _, D = query.shape
    Hkv = cache.kv_heads
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        raise GatherValueError(f"scale must be a finite number > 0 (default 1/sqrt(D)), got {scale!r}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    q = query.to(cache.dtype)  # (B, Hq, 1, D)
    if backend == "auto":
        supported = q.dtype in (torch.float32, torch.bfloat16, torch.float16)
        backend = "triton" if q.is_cuda and supported and _triton_available() else "torch"
    if backend == "triton" and not _triton_available():
        raise GatherValueError("backend = 'triton' but triton does not import; use backend='torch'")
    if backend == "triton" and not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise GatherValueError(f"backend = 'triton' needs CUDA tensors, got {q.device} (or run with "
                               f"TRITON_INTERPRET=1 for Triton's CPU interpreter)")
    if backend == "triton":  # scoring in one kernel too: fewer launches per step on a GPU
        from .triton_decode import triton_select_pages

        pages, bounds = triton_select_pages(q, cache, budget, share_selection, group_score)  # unsorted
    else:
        pages, bounds = select_pages(q, cache, budget, share_selection, group_score)  # (B, Hsel, n), (B, Hsel, N)
    if backend == "triton":
        from .triton_decode import triton_attend_pages

        out, lse = triton_attend_pages(q, cache, pages, scale)  # (B, Hq, 1, D), (B, Hq, 1)
    else:
        Hsel = pages.shape[1]
        k, v = gather_pages(cache, pages, Hq)  # (B, Hsel, n*P, D) each
        valid = pages.shape[-1] * cache.page_size - (cache.num_pages * cache.page_size - cache.length)
        qs = q.view(B, Hsel, Hq // Hsel, D)  # (B, Hsel, R, D)
        out, lse = attend_gathered(qs, k, v, valid, scale)  # (B, Hsel, R, D), (B, Hsel, R)
        out, lse = out.reshape(B, Hq, 1, D), lse.reshape(B, Hq, 1)
    result = [out.to(query.dtype)]
    if return_lse:
        result.append(lse)
    if return_selection:
        result.append(PageSelection(
            pages=pages.sort(dim=-1).values if backend == "triton" else pages, bounds=bounds, lse=lse, page_size=cache.page_size, length=cache.length,
            budget=budget, query_heads=Hq, kv_heads=Hkv, share_selection=share_selection,
            group_score=group_score))
    return result[0] if len(result) == 1 else tuple(result)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True
