"""The attention function "gatherlens_sparse": one decode step of one layer over its paged cache.

    >>> register_sparse()                      # AttentionInterface name "gatherlens_sparse"
    >>> out = decode_attention(module, q, paged, attention_mask, scale)   # (B, Hq, 1, D)
    >>> with observe_sparse(print): model.generate(...)                   # every sparse step

transformers calls `sparse_attention_forward` per layer. For a decode step (one query token) it
calls `decode_attention`: `decode_pages` (the op's one entrance that picks where it runs, without
`sparse_decode`'s argument checks; `sparse_decode` when a step's selection is observed) on that
layer's PagedKVCache with the model's one
`SparseConfig` (the module's only setting: `module.gatherlens_sparse`, a reference to it; the
layer's rank among the global layers (`features.global_rank`) and `config.dense_layers` say
whether this layer is dense; the budget the step runs with, `config.budget_for(length, rank)`, is
passed to the op as an argument). A budget that buys every page (or budget None) is dense
attention over the cache in place, with the KV group's query heads folded: no scoring, no
gather, no copy. A local layer (sliding window, chunked) reads its window densely from its ring
(`sparse_window.window_decode`); observers see only the global layers' steps. Soft-capping and
sinks (the layer's `AttentionVariant`, `features.attention_variant`) reach every path. Prefill
(more than one query token) is dense, as in Quest: SDPA, or top-k attention at k = every key where SDPA lacks soft-capping or
sinks. The planned decode step (`models/runtime/step.py`) calls `decode_attention` too, so observers
see both paths alike.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch

from gatherlens.models.attention.topk import exact_attention
from gatherlens.models.attention.features import AttentionVariant, attention_variant, global_rank
from gatherlens.models.hf_adapter import grouped_sdpa, handed_over, register_attention
from gatherlens.models.attention.kv import WindowKV, paged_cache_of, window_decode
from gatherlens.models.attention.prefill import sparse_prefill_call
from gatherlens.ops.backends import EVERY_VARIANT, Impl, Operator
from gatherlens.ops.sparse.cache import STORAGE, PagedKVCache
from gatherlens.ops.sparse.config import SparseConfig
from gatherlens.ops.sparse.decode import decode_pages, sparse_decode
from gatherlens.ops.sparse.dense_runs import note_step, step_budget

__all__ = ["SPARSE_ATTN_NAME", "CONFIG_ATTR", "SparseSettings", "SparseCall", "sparse_settings", "decode_attention",
           "observed", "meter_pages", "metered", "metering", "DECODE_ATTENTION",
           "sparse_attention_forward", "register_sparse", "observe_sparse", "padding_mask", "stored_as_configured"]

SPARSE_ATTN_NAME = "gatherlens_sparse"
CONFIG_ATTR = "gatherlens_sparse"  # the one attribute use_sparse_decoding sets on a module: its SparseConfig
SparseSettings = SparseConfig  # the adapter's old name for the one configuration
_DENSE = SparseConfig(budget=None)  # a module without a configuration decodes densely
_observers: list[Callable[["SparseCall"], None]] = []
_meters: list[Callable[[int, torch.Tensor, bool], None]] = []  # meter(layer, counts (Hsel,), chose)


@dataclass
class SparseCall:
    """One sparse decode step of one layer, as observers see it."""

    module: torch.nn.Module
    layer: int | None
    query: torch.Tensor        # (B, Hq, 1, D)
    cache: PagedKVCache        # the layer's paged cache, holding L tokens (this step's included)
    output: torch.Tensor       # (B, Hq, 1, Dv)
    lse: torch.Tensor          # (B, Hq, 1) float32
    selection: object          # PageSelection
    scale: float
    mask: torch.Tensor | None  # (B, 1, 1, L) bool, True = attend; None when nothing is padded


def sparse_settings(module: torch.nn.Module) -> SparseConfig | None:
    """The configuration a module decodes with (set by use_sparse_decoding), or None."""
    return module.__dict__.get(CONFIG_ATTR)


def stored_as_configured(config: SparseConfig | None, paged) -> None:
    """Re-store a layer's PagedKVCache in the config's kv_dtype when it differs (once: later calls
    find it stored so; None or a local layer's window: nothing to do)."""
    if config is not None and config.kv_dtype is not None and isinstance(paged, PagedKVCache):
        if paged.kv_dtype != STORAGE[config.kv_dtype]:
            paged.store_as(config.kv_dtype)


def decode_attention(module, query: torch.Tensor, paged: PagedKVCache | WindowKV, attention_mask, scale: float,
                     variant: AttentionVariant | None = None):
    """One decode step of `module` over its cache: query (B, Hq, 1, D) -> out (B, Hq, 1, Dv).

    A local layer's WindowKV: dense over its window. A PagedKVCache: dense (budget None, one of
    the first `dense_layers` global layers, or a budget of dense_share of the cache or more: every
    page in place) or sparse; with observers or keep_selection, a sparse-layer step also returns
    its PageSelection (every page when it ran densely). attention_mask: transformers' decode mask
    or None. variant: soft-capping and sinks (default: the module's own, `attention_variant`).
    Which of the three runs is DECODE_ATTENTION's choice (rows window, pages, selection).
    """
    variant = variant if variant is not None else attention_variant(module, where="gatherlens_sparse attention")
    mask = padding_mask(attention_mask, paged.length)  # (B, 1, 1, L) bool or None
    return DECODE_ATTENTION(module, query, paged, mask, scale, variant)  # (B, Hq, 1, Dv)


def _window_fits(module, query, paged, mask, scale, variant) -> str | None:
    return None if isinstance(paged, WindowKV) else "a paged cache (a global layer)"


def _window_run(module, query, paged, mask, scale, variant):
    return window_decode(query, paged, mask, scale, variant)  # (B, Hq, 1, Dv): dense over its ring


def _pages_fits(module, query, paged, mask, scale, variant) -> str | None:
    if not isinstance(paged, PagedKVCache):
        return f"the layer's cache is a {type(paged).__name__}"
    config = sparse_settings(module) or _DENSE
    if config.dense_at(global_rank(module)) or not (config.keep_selection or _observers):
        return None
    return "an observer or kept selections want this layer's PageSelection"


def _pages_run(module, query, paged, mask, scale, variant):
    """The op's one entrance, unchecked (this adapter made the query and the cache); dense in place when
    the budget buys every page."""
    config = sparse_settings(module) or _DENSE
    stored_as_configured(config, paged)  # pages in the config's kv_dtype
    key_mask = None if mask is None else mask[:, 0, 0]  # (B, L)
    budget = step_budget(config, paged, paged.length, global_rank(module))  # dense during a dense run
    q = query if query.dtype == paged.dtype else query.to(paged.dtype)  # (B, Hq, 1, D)
    pages, _, out, _ = decode_pages(q, paged, budget, config.choice, scale, variant, key_mask)
    note_step(config, paged, budget, pages)  # a sparse step: dense next when it needed nearly every page
    if _meters:
        _meter(module, pages, paged, query.shape[1] if not config.share_selection else paged.kv_heads)
    return out if out.dtype == query.dtype else out.to(query.dtype)  # (B, Hq, 1, Dv)


def _selection_fits(module, query, paged, mask, scale, variant) -> str | None:
    return None if isinstance(paged, PagedKVCache) else f"the layer's cache is a {type(paged).__name__}"


def _selection_run(module, query, paged, mask, scale, variant):
    """sparse_decode (checked) with its PageSelection, kept on the module and handed to every observer."""
    config = sparse_settings(module) or _DENSE
    stored_as_configured(config, paged)  # pages in the config's kv_dtype
    key_mask = None if mask is None else mask[:, 0, 0]  # (B, L)
    budget = step_budget(config, paged, paged.length, global_rank(module))  # dense during a dense run
    out, lse, sel = sparse_decode(query, paged, budget, return_lse=True, return_selection=True, scale=scale,
                                  key_mask=key_mask, config=config, variant=variant)
    note_step(config, paged, budget, sel.pages)
    if _meters:
        _meter(module, sel.pages, paged, sel.pages.shape[1])
    if mask is not None:
        sel.meta["padded"] = True
    layer = getattr(module, "layer_idx", None)
    sel.meta.setdefault("layer", layer)
    if config.keep_selection:
        module.gatherlens_page_selection = sel
    call = SparseCall(module, layer, query, paged, out, lse, sel, scale, mask)
    for observer in list(_observers):
        observer(call)
    return out


# one decode step of one layer: its window ring, its pages through sparse decode's one entrance, or (an
# observer or kept selections want it) sparse_decode with the step's PageSelection. The paged rows hand the
# variant to sparse decode's own table, which refuses what its rows lack; the window row applies it itself.
DECODE_ATTENTION = Operator("decode_attention", [
    Impl("window", _window_fits, _window_run, variant=frozenset({"softcap", "sinks", "window"})),
    Impl("pages", _pages_fits, _pages_run, variant=EVERY_VARIANT),
    Impl("selection", _selection_fits, _selection_run, variant=EVERY_VARIANT),
], facts=lambda module, query, paged, mask, scale, variant: (variant, None))


def sparse_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The function transformers calls per layer; returns (output (B, Q, Hq, Dv), None).

    query (B, Hq, Q, D); key (B, Hkv, L, D), value (B, Hkv, L, Dv) after RoPE and the cache update.
    Q > 1 (prefill) or no settings: dense (`prefill_attention`). Q == 1: `decode_attention` on the
    layer's cache, or, when the keys are not that cache's (another Cache; a model that expands a
    latent cache, as DeepSeek-V3), on a window / temporary paged cache of the keys it was given.
    """
    kv = handed_over(key)  # the layer's PagedKVCache / WindowKV when its cache holds exactly these keys
    variant = attention_variant(module, kwargs, where="gatherlens_sparse attention")
    stored_as_configured(sparse_settings(module), kv)  # prefill: the layer's pages as configured from the start
    if query.shape[2] != 1 or sparse_settings(module) is None:
        return prefill_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, variant,
                                 **kwargs)
    if kv is None:
        kv = WindowKV(key, value) if variant.window is not None else _paged_copy(module, key, value)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out = decode_attention(module, query, kv, attention_mask, scale, variant)  # (B, Hq, 1, Dv)
    return out.transpose(1, 2).contiguous(), None  # (B, 1, Hq, Dv)


def _paged_copy(module, key: torch.Tensor, value: torch.Tensor) -> PagedKVCache:
    """A temporary PagedKVCache of the keys (B, Hkv, L, D) and values (B, Hkv, L, Dv) a step was given."""
    config = sparse_settings(module)
    paged = paged_cache_of(key, value, config.page_size, key.shape[2], config.kv_dtype)
    paged.append(key, value)
    return paged


def prefill_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                      variant: AttentionVariant, **kwargs):
    """Dense attention of a prefill (or of a module without settings): SDPA, or, for soft-capping or
    sinks (which SDPA lacks), top-k attention keeping every key (the exact softmax). A module on
    sparse prefill (models/attention/prefill.py) gathers its key blocks instead, where it can."""
    done = sparse_prefill_call(module, query, key, value, attention_mask, scaling, variant)
    if done is not None:
        return done
    if variant.plain:
        return grouped_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
    return exact_attention(module, query, key, value, attention_mask, scaling, is_causal, variant)


def padding_mask(attention_mask, length: int) -> torch.Tensor | None:
    """The decode step's mask as (B, 1, 1, L) bool (True = attend), or None if nothing is masked."""
    if attention_mask is None:
        return None
    m = attention_mask[..., -1:, :length]  # (B, 1|H, 1, L)
    m = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2  # additive float -> bool
    m = m[:, :1]  # (B, 1, 1, L)
    return None if bool(m.all()) else m


def register_sparse() -> None:
    """Register "gatherlens_sparse" with transformers' attention and mask interfaces (idempotent)."""
    register_attention(SPARSE_ATTN_NAME, sparse_attention_forward)


def _meter(module, pages: torch.Tensor | None, paged: PagedKVCache, heads: int) -> None:
    """Tell every meter the pages each selection head of batch 0 read (pages None, or every page: densely)."""
    if pages is None or pages.shape[-1] >= paged.num_pages:
        counts, chose = torch.full((heads,), paged.num_pages, dtype=torch.long), False
    else:
        counts, chose = (pages[0] >= 0).sum(-1), True  # (Hsel,)
    for meter in list(_meters):
        meter(getattr(module, "layer_idx", -1), counts, chose)


def metered() -> bool:
    """True while a `meter_pages` block counts the pages every decode step reads."""
    return bool(_meters)


def metering(layer: int, counts: torch.Tensor, chose: bool) -> None:
    """Tell every meter what one layer read (the one-operator step reports its layers through this)."""
    for meter in list(_meters):
        meter(layer, counts, chose)


@contextlib.contextmanager
def meter_pages(meter: Callable[[int, torch.Tensor, bool], None]):
    """Call `meter(layer, counts, chose)` for every global layer's decode step inside the block: counts
    (Hsel,) int64 the pages each selection head read (batch 0), chose False where the layer read every
    page without choosing. Cheap (one small sum a layer) and, unlike `observe_sparse`, it keeps the
    fast paths (the one-operator step reports its counts too)."""
    _meters.append(meter)
    try:
        yield
    finally:
        _meters.remove(meter)


def observed() -> bool:
    """True while an `observe_sparse` block wants every sparse step (each layer's PageSelection)."""
    return bool(_observers)


@contextlib.contextmanager
def observe_sparse(observer: Callable[[SparseCall], None]):
    """Call `observer(call)` for every sparse decode step inside the block."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
