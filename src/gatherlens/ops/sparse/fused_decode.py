"""The native CPU path of sparse decode: scoring, choice and attention in one C++ operator.

    >>> if fused_fits(q, cache, key_mask=None, choose="bound") and kernel_loaded():
    ...     pages, bounds, out, lse = fused_select_attend(q, cache, budget=512, how=how, scale=0.125)

`torch.ops.gatherlens.paged_decode` (fused_decode.cpp) reads the page summaries and the chosen pages
where they lie in the cache: no gather copy, and one call instead of the ~25 small torch calls the
torch path makes per layer (page_choice.select_pages + torch_decode.attend_pages), which at one
token a step is most of a sparse layer's time. Same choice rule (page_choice.pages_to_read, the
tie and non-finite rules of page_choice.rankable), same attention; results equal the torch path's
up to float rounding (the sums run in another order), tested against naive.py. It runs for float32
caches on the CPU, without key_mask, with choose="bound"; anything else takes the torch path.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gatherlens.ops.native import load_library

from .cache import PagedKVCache
from .geometry import page_count
from .page_choice import pages_to_read

__all__ = ["kernel_loaded", "fused_fits", "fused_select_attend", "fused_dense", "fused_decode_step", "KERNEL"]

KERNEL = Path(__file__).with_name("fused_decode.cpp")


def kernel_loaded() -> bool:
    """True once `gatherlens::paged_decode` is registered (built on first use); False: the torch path."""
    return load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::paged_decode", fake_paged_decode)
    torch.library.register_fake("gatherlens::dense_decode", fake_dense_decode)


def fake_dense_decode(q, page_keys, page_values, length, scale):
    B, Hq, _ = q.shape
    return q.new_empty(B, Hq, page_values.shape[-1]), q.new_empty(B, Hq)


def fake_paged_decode(q, page_keys, page_values, summaries, length, n, first_recent, scale, per_head, group_sum):
    B, Hq, D = q.shape
    Hkv, P = page_keys.shape[1], page_keys.shape[3]
    N = page_count(length, P)  # the pages in use (the operator's rule too)
    Hsel, nn = (Hq if per_head else Hkv), min(n, N)
    return (q.new_empty(B, Hq, page_values.shape[-1]), q.new_empty(B, Hq), q.new_empty(B, Hsel, nn, dtype=torch.long),
            q.new_empty(B, Hkv, Hq // Hkv, N))


def fused_fits(q: torch.Tensor, cache: PagedKVCache, key_mask, choose: str) -> bool:
    """True when the native operator computes this call: CPU, float32 keys, values and summaries,
    no key_mask, the bound choice, no autograd through the query."""
    return (q.device.type == "cpu" and cache.dtype == torch.float32 and cache.summary_dtype == torch.float32
            and key_mask is None and choose == "bound" and not (q.requires_grad and torch.is_grad_enabled()))


def fused_select_attend(q: torch.Tensor, cache: PagedKVCache, budget: int, how: dict, scale: float,
                        want_selection: bool = False):
    """pages (B, Hsel, n) ascending, bounds (B, Hsel, N) float32 (None unless want_selection),
    out (B, Hq, 1, Dv) float32, lse (B, Hq, 1) float32, for q (B, Hq, 1, D) in the cache's dtype."""
    B, Hq, _, D = q.shape
    Dv = cache.page_values.shape[-1]
    n, first = pages_to_read(cache.length, cache.page_size, budget, how["recent"])
    per_head = not how["share_selection"]
    out, lse, pages, bounds = torch.ops.gatherlens.paged_decode(
        q.reshape(B, Hq, D).contiguous(), cache.page_keys, cache.page_values, cache.summaries, cache.length, n,
        first, scale, per_head, how["group_score"] == "sum")  # (B, Hq, D), (B, Hq), (B, Hsel, n), (B, Hkv, G, N)
    if not want_selection:
        return pages, None, out.view(B, Hq, 1, Dv), lse.view(B, Hq, 1)
    if per_head:
        scores = bounds.reshape(B, Hq, -1)  # (B, Hq, N)
    else:
        scores = bounds.amax(dim=2) if how["group_score"] == "max" else bounds.sum(dim=2)  # (B, Hkv, N)
    return pages, scores, out.view(B, Hq, 1, Dv), lse.view(B, Hq, 1)


def fused_dense(q: torch.Tensor, cache: PagedKVCache, scale: float):
    """Dense attention of q (B, Hq, 1, D) over every cached token, in place, on the operator: out
    (B, Hq, 1, Dv), lse (B, Hq, 1) float32. Each KV group's G query heads read a key row once, and
    the rows split in chunks over the threads (PyTorch's flash kernel splits by head only)."""
    B, Hq, _, D = q.shape
    keys, values, _ = cache.writable(0)  # the whole storage: rows are contiguous across its pages
    out, lse = torch.ops.gatherlens.dense_decode(q.reshape(B, Hq, D).contiguous(), keys, values, cache.length,
                                                 scale)  # (B, Hq, Dv), (B, Hq)
    return out.view(B, Hq, 1, -1), lse.view(B, Hq, 1)


def fused_decode_step(query: torch.Tensor, cache, budget: int, config, scale: float):
    """One sparse decode step of a model's layer straight on the operator, or None where it does not
    apply (then the caller runs `sparse_decode`): query (B, Hq, 1, D) float32 -> out (B, Hq, 1, Dv).

    For the adapter's own calls (models/sparse_attention.decode_attention), whose query and cache it
    made itself: `sparse_decode`'s argument checks and dispatch cost more than the operator at one
    token a step (~90 us against ~20 us a layer), so this path does only the checks that pick it:
    a float32 CPU PagedKVCache, the bound choice, no autograd. Same choice rule (`pages_to_read`,
    the config's recent window) and operators as backend="native": `fused_dense` when the budget
    buys every page, else `paged_decode`.
    """
    if (type(cache) is not PagedKVCache or query.dtype != torch.float32
            or not fused_fits(query, cache, None, config.choose) or not kernel_loaded()):
        return None  # the operator's one rule (fused_fits), plus a float32 query: no cast on this path
    n, first = pages_to_read(cache.length, cache.page_size, budget, config.recent_window())
    if n >= cache.num_pages:
        return fused_dense(query, cache, scale)[0]  # (B, Hq, 1, Dv)
    B, Hq, _, D = query.shape
    keys, values, summaries = cache.writable(0)  # the whole storage: the operator reads its first pages
    out = torch.ops.gatherlens.paged_decode(query.reshape(B, Hq, D).contiguous(), keys, values, summaries,
                                            cache.length, n, first, scale, not config.share_selection,
                                            config.group_score == "sum")[0]  # (B, Hq, Dv)
    return out.view(B, Hq, 1, -1)
