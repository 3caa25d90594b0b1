"""The native CPU path of sparse decode: scoring, choice and attention in one C++ operator.

    >>> native_fits(q, cache, budget, choice, scale, variant, key_mask=None, want=False)   # None: it runs
    >>> pages, bounds, out, lse = fused_select_attend(q, cache, n, first, choice, scale=0.125)

`torch.ops.gatherlens.paged_decode` (fused_decode.cpp) reads the page summaries and the chosen pages
where they lie in the cache: no gather copy, and one call instead of the ~25 small torch calls the
torch path makes per layer (page_choice.select_pages + torch_decode.attend_pages), which at one
token a step is most of a sparse layer's time. Same choice rule (page_choice.pages_to_read, the
tie and non-finite rules of page_choice.rankable), same attention; results equal the torch path's
up to float rounding (the sums run in another order), tested against naive.py. It runs for caches
read in float32 on the CPU (pages stored in float32, float16, bfloat16 or int8: the operator reads
each page as the cache's `read_pages` does), without key_mask, with choose="bound" (`native_fits`: the
"native" row of decode.SPARSE_DECODE, the one table that decides where sparse decode runs; the row
declares the variant fields it runs: sinks, joined after it, and no soft-capping); anything else takes
the torch path.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gatherlens.ops.native import load_library

from .cache import PagedKVCache
from .geometry import page_count

__all__ = ["kernel_loaded", "native_fits", "native_ready", "fused_select_attend", "fused_dense", "KERNEL",
           "NATIVE_DTYPES"]

KERNEL = Path(__file__).with_name("fused_decode.cpp")
NATIVE_DTYPES = (torch.float32,)  # the query dtypes the operator runs (a cache read in float32)
_STORED = (torch.float32, torch.float16, torch.bfloat16, torch.int8)  # the page dtypes the operator reads
_HALF = (torch.float16, torch.bfloat16)  # pages whose summaries may be stored in their own dtype


def kernel_loaded() -> bool:
    """True once `gatherlens::paged_decode` is registered (built on first use); False: the torch path."""
    return load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::paged_decode", fake_paged_decode)
    torch.library.register_fake("gatherlens::dense_decode", fake_dense_decode)


def fake_dense_decode(q, page_keys, page_values, length, scale, key_scales=None, value_scales=None):
    B, Hq, _ = q.shape
    return q.new_empty(B, Hq, page_values.shape[-1]), q.new_empty(B, Hq)


def fake_paged_decode(q, page_keys, page_values, summaries, length, n, first_recent, scale, per_head, group_sum,
                      key_scales=None, value_scales=None, mass=0.0, min_pages=1):
    B, Hq, D = q.shape
    Hkv, P = page_keys.shape[1], page_keys.shape[3]
    N = page_count(length, P)  # the pages in use (the operator's rule too)
    Hsel, nn = (Hq if per_head else Hkv), min(n, N)
    return (q.new_empty(B, Hq, page_values.shape[-1]), q.new_empty(B, Hq), q.new_empty(B, Hsel, nn, dtype=torch.long),
            q.new_empty(B, Hkv, Hq // Hkv, N))


def native_fits(q: torch.Tensor, cache: PagedKVCache, budget, choice, scale, variant, key_mask,
                want) -> str | None:
    """None when the native operator computes this sparse decode call (the "native" row of
    decode.SPARSE_DECODE's table), else why not: CPU, a cache read in float32 (pages stored in
    float32, float16, bfloat16 or int8) with float32 summaries (or 16-bit ones of 16-bit pages), no
    key_mask, the bound choice, no autograd through the query, and the operator built (the variant
    fields it runs are the row's declaration, checked before)."""
    if not q.is_cpu:
        return f"the query is on {q.device} (the C++ operator runs on the CPU)"
    why = native_cache_fits(cache)
    if why is not None:
        return why
    if key_mask is not None:
        return "key_mask given (the C++ operator does not mask keys; backend='torch' does)"
    if choice.choose != "bound":
        return f"choose = {choice.choose!r} (the C++ operator ranks pages by their bound only)"
    if q.requires_grad and torch.is_grad_enabled():
        return "the query needs a gradient (the C++ operator has no backward)"
    return native_ready()


def native_cache_fits(cache: PagedKVCache) -> str | None:
    """None when the operator reads this cache: on the CPU, read in float32, pages stored in float32,
    float16, bfloat16 or int8, float32 summaries (or 16-bit ones of 16-bit pages); else why not."""
    if cache.device.type != "cpu":
        return f"the cache is on {cache.device} (the C++ operator runs on the CPU)"
    summaries = (torch.float32, cache.kv_dtype) if cache.kv_dtype in _HALF else (torch.float32,)
    if cache.dtype != torch.float32 or cache.summary_dtype not in summaries or cache.kv_dtype not in _STORED:
        return (f"the cache is {cache.dtype} (pages {cache.kv_dtype}) with {cache.summary_dtype} summaries (the C++ "
                f"operator runs caches read in float32, pages stored in float32, float16, bfloat16 or int8)")
    return None


def native_ready() -> str | None:
    """None once `gatherlens::paged_decode` is registered, else why the native row cannot run here."""
    return None if kernel_loaded() else "its C++ operator did not build (see the warning)"


def fused_select_attend(q: torch.Tensor, cache: PagedKVCache, n: int, first: int, choice, scale: float,
                        want_selection: bool = False):
    """pages (B, Hsel, n) ascending (the auto budget, choice.mass not None: each head's own, then -1),
    bounds (B, Hsel, N) float32 (None unless want_selection), out (B, Hq, 1, Dv) float32, lse (B, Hq, 1)
    float32, for q (B, Hq, 1, D) in the cache's dtype; n, first: `pages_to_read` of the step (fewer
    pages than the cache holds)."""
    B, Hq, _, D = q.shape
    keys, values, summaries = cache.writable(0)  # the whole storage: the operator reads its first pages
    key_scales, value_scales = cache.scale_storage()  # (B, Hkv, cap, D | P) float32 for int8 pages, else None
    per_head = not choice.share_selection
    out, lse, pages, bounds = torch.ops.gatherlens.paged_decode(
        q.reshape(B, Hq, D).contiguous(), keys, values, summaries, cache.length, n,
        first, scale, per_head, choice.group_score == "sum", key_scales, value_scales,
        choice.mass or 0.0, choice.min_pages)  # (B, Hq, Dv), (B, Hq), (B, Hsel, n), (B, Hkv, G, N)
    out, lse = out.view(B, Hq, 1, -1), lse.view(B, Hq, 1)  # (B, Hq, 1, Dv), (B, Hq, 1)
    if not want_selection:
        return pages, None, out, lse
    if per_head:
        scores = bounds.reshape(B, Hq, -1)  # (B, Hq, N)
    else:
        scores = bounds.amax(dim=2) if choice.group_score == "max" else bounds.sum(dim=2)  # (B, Hkv, N)
    return pages, scores, out, lse


def fused_dense(q: torch.Tensor, cache: PagedKVCache, scale: float):
    """Dense attention of q (B, Hq, 1, D) over every cached token, in place, on the operator: out
    (B, Hq, 1, Dv), lse (B, Hq, 1) float32. Each KV group's G query heads read a key row once, and
    the rows split in chunks over the threads (PyTorch's flash kernel splits by head only)."""
    B, Hq, _, D = q.shape
    keys, values, _ = cache.writable(0)  # the whole storage: rows are contiguous across its pages
    key_scales, value_scales = cache.scale_storage()  # (B, Hkv, cap, D | P) float32 for int8 pages, else None
    out, lse = torch.ops.gatherlens.dense_decode(q.reshape(B, Hq, D).contiguous(), keys, values, cache.length,
                                                 scale, key_scales, value_scales)  # (B, Hq, Dv), (B, Hq)
    return out.view(B, Hq, 1, -1), lse.view(B, Hq, 1)
