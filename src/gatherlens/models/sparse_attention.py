"""The attention function "gatherlens_sparse": one decode step of one layer over its paged cache.

    >>> register_sparse()                      # AttentionInterface name "gatherlens_sparse"
    >>> out = decode_attention(module, q, paged, attention_mask, scale)   # (B, Hq, 1, D)
    >>> with observe_sparse(print): model.generate(...)                   # every sparse step

transformers calls `sparse_attention_forward` per layer. For a decode step (one query token) it
calls `decode_attention`: `sparse_decode` on that layer's PagedKVCache with the model's one
`SparseConfig` (the module's only setting: `module.gatherlens_sparse`, a reference to it; the
layer index and `config.dense_layers` say whether this layer is dense; the budget the step runs
with, `config.budget_for(length, layer)`, is passed to the op as an argument). A budget that buys every page (or budget None) is dense attention over the
cache in place, with the KV group's query heads folded: no scoring, no gather, no copy. Prefill
(more than one query token) is dense SDPA, as in Quest. The lean decode step
(`models/decode_step.py`) calls `decode_attention` too, so observers see both paths alike.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.sparse_cache import PAGED_KWARG
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.config import SparseConfig
from gatherlens.ops.sparse.decode import sparse_decode

__all__ = ["SPARSE_ATTN_NAME", "CONFIG_ATTR", "SparseSettings", "SparseCall", "sparse_settings", "decode_attention",
           "sparse_attention_forward", "register_sparse", "observe_sparse", "padding_mask"]

SPARSE_ATTN_NAME = "gatherlens_sparse"
CONFIG_ATTR = "gatherlens_sparse"  # the one attribute use_sparse_decoding sets on a module: its SparseConfig
SparseSettings = SparseConfig  # the adapter's old name for the one configuration
_DENSE = SparseConfig(budget=None)  # a module without a configuration decodes densely
_observers: list[Callable[["SparseCall"], None]] = []


@dataclass
class SparseCall:
    """One sparse decode step of one layer, as observers see it."""

    module: torch.nn.Module
    layer: int | None
    query: torch.Tensor        # (B, Hq, 1, D)
    cache: PagedKVCache        # the layer's paged cache, holding L tokens (this step's included)
    output: torch.Tensor       # (B, Hq, 1, D)
    lse: torch.Tensor          # (B, Hq, 1) float32
    selection: object          # PageSelection
    scale: float
    mask: torch.Tensor | None  # (B, 1, 1, L) bool, True = attend; None when nothing is padded


def sparse_settings(module: torch.nn.Module) -> SparseConfig | None:
    """The configuration a module decodes with (set by use_sparse_decoding), or None."""
    return module.__dict__.get(CONFIG_ATTR)


def decode_attention(module, query: torch.Tensor, paged: PagedKVCache, attention_mask, scale: float):
    """One decode step of `module` over its paged cache: query (B, Hq, 1, D) -> out (B, Hq, 1, D).

    Dense (budget None, one of the first `dense_layers`, or a budget of dense_share of the cache or
    more: every page in place) or sparse; with observers or keep_selection, a sparse-layer step
    also returns its PageSelection (every page when it ran densely). attention_mask:
    transformers' decode mask or None.
    """
    config = sparse_settings(module) or _DENSE
    layer = getattr(module, "layer_idx", None)
    mask = padding_mask(attention_mask, paged.length)  # (B, 1, 1, L) bool or None
    key_mask = None if mask is None else mask[:, 0, 0]  # (B, L)
    budget = config.budget_for(paged.length, layer)
    if config.dense_at(layer) or not (config.keep_selection or _observers):
        # sparse_decode is dense in place when the budget buys every page
        return sparse_decode(query, paged, budget, scale=scale, key_mask=key_mask, config=config)  # (B, Hq, 1, D)
    out, lse, sel = sparse_decode(query, paged, budget, return_lse=True, return_selection=True, scale=scale,
                                  key_mask=key_mask, config=config)  # (B, Hq, 1, D), (B, Hq, 1)
    if mask is not None:
        sel.meta["padded"] = True
    sel.meta.setdefault("layer", layer)
    if config.keep_selection:
        module.gatherlens_page_selection = sel
    call = SparseCall(module, layer, query, paged, out, lse, sel, scale, mask)
    for observer in list(_observers):
        observer(call)
    return out


def sparse_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The function transformers calls per layer; returns (output (B, Q, Hq, D), None).

    query (B, Hq, Q, D); key, value (B, Hkv, L, D) after RoPE and the cache update.
    Q > 1 (prefill) or no settings: dense SDPA. Q == 1: `decode_attention` on the layer's paged cache.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    paged = kwargs.pop(PAGED_KWARG, None)
    if query.shape[2] != 1 or sparse_settings(module) is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise GatherValueError("attention softcap / sinks are not supported by gatherlens_sparse attention")
    if paged is None or paged.length != key.shape[2]:  # not a SparseKVCache: page the keys we were given
        paged = PagedKVCache(batch=key.shape[0], kv_heads=key.shape[1], head_dim=key.shape[3],
                             page_size=sparse_settings(module).page_size, dtype=key.dtype, device=key.device,
                             capacity=key.shape[2])
        paged.append(key, value)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out = decode_attention(module, query, paged, attention_mask, scale)  # (B, Hq, 1, D)
    return out.transpose(1, 2).contiguous(), None  # (B, 1, Hq, D)


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
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SPARSE_ATTN_NAME, sparse_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SPARSE_ATTN_NAME, sdpa_mask)


@contextlib.contextmanager
def observe_sparse(observer: Callable[[SparseCall], None]):
    """Call `observer(call)` for every sparse decode step inside the block."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
