"""Page-selected sparse decoding inside any Hugging Face Llama-family model, switched on with one call.

    >>> lm = load("smollm2")
    >>> use_sparse_decoding(lm.model, budget=1024, page_size=16)   # generate now decodes sparsely
    >>> lm.model.generate(ids, max_new_tokens=32)
    >>> last_page_selections(lm.model)[0].to_svg()                # pages layer 0 read (keep_selection=True)
    >>> use_dense_decoding(lm.model)                               # back to SDPA and DynamicCache

Two pieces, both through transformers' public extension points (written against 5.x):
- `SparseKVCache`, a `transformers.Cache` whose layers store keys and values in a
  `gatherlens.ops.sparse.PagedKVCache` (pages of `page_size` tokens with Quest's per-page key
  min/max, kept up to date as tokens arrive). `use_sparse_decoding` makes `generate` build one when
  the caller passes no cache; any caller may also pass `cache=SparseKVCache(config=model.config)`.
- the attention function "gatherlens_sparse" registered with `AttentionInterface`: for a decode
  step (one query token) it calls `sparse_decode` on that layer's paged cache: score the page
  summaries, gather only the `budget` best tokens' pages (page 0 and the newest page always) and
  attend over them exactly. For prefill (more than one query token) it runs dense SDPA, as Quest
  does: selection applies to decoding only, every prompt token attends to its whole prefix.

How the paged cache reaches the attention function: the attention module calls
`cache.update(k, v, layer_idx, kwargs=kwargs)` and then `attention(..., **kwargs)` with the same
dict, so the layer puts its PagedKVCache in that dict under "gatherlens_paged". With another cache
(a plain DynamicCache) a decode step builds a temporary PagedKVCache from the keys it is given:
the same answer, without the memory saving.
"""
from __future__ import annotations

import contextlib
import functools
import math
import types
from dataclasses import dataclass
from typing import Callable

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.models.attention import switch_attention
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.page_choice import GROUP_SCORES

__all__ = [
    "SPARSE_ATTN_NAME", "SparseSettings", "PagedLayer", "SparseKVCache", "SparseCall",
    "use_sparse_decoding", "use_dense_decoding", "sparse_decoding", "sparse_settings",
    "last_page_selections", "observe_sparse", "register_sparse",
]

SPARSE_ATTN_NAME = "gatherlens_sparse"
PAGED_KWARG = "gatherlens_paged"
_observers: list[Callable[["SparseCall"], None]] = []


@dataclass(frozen=True)
class SparseSettings:
    """How decode steps choose pages. budget=None decodes densely (SDPA) over the paged cache."""

    budget: int | None = 1024
    page_size: int = 16
    share_selection: bool = True
    group_score: str = "max"
    keep_selection: bool = False


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


# -- the cache ------------------------------------------------------------------------------------
class PagedLayer(CacheLayerMixin):
    """One layer's keys and values in a PagedKVCache; `update` returns (B, Hkv, L, D) views of it."""

    is_sliding = False
    is_croppable = False

    def __init__(self, page_size: int = 16):
        # CacheLayerMixin.__init__ would assign self.keys / self.values, which are views here
        self.page_size = page_size
        self.paged: PagedKVCache | None = None
        self.is_initialized = False

    def __repr__(self) -> str:
        return f"PagedLayer({self.paged!r})"

    @property
    def keys(self) -> torch.Tensor | None:
        return self.paged.keys if self.paged is not None else None  # (B, Hkv, L, D)

    @property
    def values(self) -> torch.Tensor | None:
        return self.paged.values if self.paged is not None else None  # (B, Hkv, L, D)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, T, D = key_states.shape
        self.device = key_states.device
        self.paged = PagedKVCache(batch=B, kv_heads=H, head_dim=D, page_size=self.page_size,
                                  dtype=key_states.dtype, device=key_states.device, capacity=T)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, kwargs=None, **kw):
        """Append (B, Hkv, T, D) keys/values; return all keys/values so far (views, no copy)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.paged.append(key_states, value_states)
        if isinstance(kwargs, dict):  # the dict the attention function is called with (see module doc)
            kwargs[PAGED_KWARG] = self.paged
        return self.paged.keys, self.paged.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.paged.length if self.paged is not None else 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        if self.paged is not None:
            self.paged.clear()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise GatherValueError(
                f"crop({tokens_to_remove}) is not supported by the paged sparse cache (page summaries "
                f"cannot be shrunk); use a DynamicCache for assisted or speculative decoding")

    def offload(self):
        raise GatherValueError("offloading is not supported by the paged sparse cache")

    def prefetch(self):
        return None

    def _rebuild(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the contents with these (B', Hkv, L, D) keys/values (batch reorder/expand/select)."""
        B, H, L, D = keys.shape
        paged = PagedKVCache(batch=B, kv_heads=H, head_dim=D, page_size=self.page_size,
                             dtype=keys.dtype, device=keys.device, capacity=L)
        paged.append(keys, values)
        self.paged = paged

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            idx = beam_idx.to(self.device)
            self._rebuild(self.keys.index_select(0, idx), self.values.index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._rebuild(self.keys.repeat_interleave(repeats, 0), self.values.repeat_interleave(repeats, 0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._rebuild(self.keys[indices], self.values[indices])


class SparseKVCache(Cache):
    """A transformers Cache of `PagedLayer`s: what sparse decode reads from.

        >>> cache = SparseKVCache(config=model.config, page_size=16)
        >>> model.generate(ids, cache=cache, max_new_tokens=16)     # with use_sparse_decoding on
        >>> cache.paged(0)                                          # layer 0's PagedKVCache

    config: the model's config (one layer per decoder layer; only full-attention layers are
    supported); without it, layers are created as `update` first sees each layer index.
    """

    def __init__(self, config=None, page_size: int = 16):
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise GatherValueError(f"page_size = {page_size!r} must be an int >= 1 (tokens per page)")
        self.page_size = page_size
        if config is None:
            super().__init__(layer_class_to_replicate=functools.partial(PagedLayer, page_size=page_size))
            return
        from transformers.cache_utils import get_layer_types_and_kwargs

        decoder = config.get_text_config(decoder=True)
        layer_types, _ = get_layer_types_and_kwargs(decoder)
        other = sorted({t for t in layer_types if t != "full_attention"})
        if other:
            raise GatherValueError(
                f"{type(config).__name__} has layer types {other}; sparse decoding supports "
                f"full-attention layers only (layer_types must all be 'full_attention')")
        super().__init__(layers=[PagedLayer(page_size) for _ in layer_types])

    def paged(self, layer_idx: int) -> PagedKVCache | None:
        """The PagedKVCache of one layer (None before the layer has seen a token)."""
        return self.layers[layer_idx].paged


# -- the attention function -----------------------------------------------------------------------
def sparse_settings(module: torch.nn.Module) -> SparseSettings | None:
    """The settings a module decodes with (set by use_sparse_decoding), or None."""
    return module.__dict__.get("gatherlens_sparse")


def sparse_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The function transformers calls per layer; returns (output (B, Q, Hq, D), None).

    query (B, Hq, Q, D); key, value (B, Hkv, L, D) after RoPE and the cache update.
    Q > 1 (prefill) or budget None: dense SDPA. Q == 1: sparse_decode on the layer's paged cache.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    paged = kwargs.pop(PAGED_KWARG, None)
    settings = sparse_settings(module)
    if query.shape[2] != 1 or settings is None or settings.budget is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise GatherValueError("attention softcap / sinks are not supported by gatherlens_sparse attention")
    if paged is None or paged.length != key.shape[2]:  # not a SparseKVCache: page the keys we were given
        paged = PagedKVCache(batch=key.shape[0], kv_heads=key.shape[1], head_dim=key.shape[3],
                             page_size=settings.page_size, dtype=key.dtype, device=key.device,
                             capacity=key.shape[2])
        paged.append(key, value)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    mask = _padding_mask(attention_mask, paged.length)  # (B, 1, 1, L) bool or None
    out, lse, sel = sparse_decode(query, paged, budget=settings.budget,
                                  share_selection=settings.share_selection, return_lse=True,
                                  return_selection=True, scale=scale, group_score=settings.group_score,
                                  key_mask=None if mask is None else mask[:, 0, 0])  # (B, Hq, 1, D), (B, Hq, 1)
    if mask is not None:
        sel.meta["padded"] = True
    layer = getattr(module, "layer_idx", None)
    sel.meta.setdefault("layer", layer)
    if settings.keep_selection:
        module.gatherlens_page_selection = sel
    if _observers:
        call = SparseCall(module, layer, query, paged, out, lse, sel, scale, mask)
        for observer in list(_observers):
            observer(call)
    return out.transpose(1, 2).contiguous(), None  # (B, 1, Hq, D)


def _padding_mask(attention_mask, length: int) -> torch.Tensor | None:
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


# -- switching a model ----------------------------------------------------------------------------
def _unwrap(model):
    model = model if hasattr(model, "set_attn_implementation") else getattr(model, "model", model)
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise GatherTypeError(
            f"model must be a transformers PreTrainedModel (or a LoadedModel), got {type(model).__name__}")
    return model


def _check_settings(budget, page_size, share_selection, group_score) -> None:
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise GatherValueError(f"budget = {budget!r} must be an int >= 1 (tokens read per decode step) or None (dense)")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise GatherValueError(f"page_size = {page_size!r} must be an int >= 1 (tokens per page)")
    if not isinstance(share_selection, bool):
        raise GatherTypeError(f"share_selection must be a bool, got {share_selection!r}")
    if group_score not in GROUP_SCORES:
        raise GatherValueError(f"group_score = {group_score!r} must be one of {GROUP_SCORES}")


def _prepare_sparse_cache(self, generation_config, model_kwargs, *args, **kwargs):
    """generate's cache set-up, bound to a model by use_sparse_decoding: a SparseKVCache by default."""
    original = type(self)._prepare_cache_for_generation
    wants_default = (model_kwargs.get("cache") is None and generation_config.use_cache is not False
                     and generation_config.cache_implementation in (None, "dynamic"))
    if not wants_default:
        return original(self, generation_config, model_kwargs, *args, **kwargs)
    model_kwargs["cache"] = SparseKVCache(config=self.config, page_size=self.config.gatherlens_page_size)


def use_sparse_decoding(model, budget: int | None = 1024, page_size: int = 16, share_selection: bool = True,
                        *, group_score: str = "max", keep_selection: bool = False, dense_layers: int = 0):
    """Make `model.generate` (and any forward given a SparseKVCache) decode with page-selected attention.

    budget: tokens each decode step reads per KV head (pages are whole; page 0 and the newest page
        always); None decodes densely over the same paged cache. page_size: tokens per page.
    share_selection: the query heads of a KV group read the same pages (GQA; what saves memory
        traffic); False lets every query head choose. group_score: "max" or "sum" of the group's bounds.
    keep_selection: keep each layer's last PageSelection (see `last_page_selections`).
    dense_layers: the first this many decoder layers decode densely (Quest keeps its first two
        layers dense: their attention is spread too evenly for page selection to pay).
    Prefill stays dense (SDPA). Returns the model.
    """
    model = _unwrap(model)
    _check_settings(budget, page_size, share_selection, group_score)
    if getattr(model.config, "is_encoder_decoder", False):
        raise GatherValueError(f"{type(model).__name__} is an encoder-decoder; sparse decoding needs a decoder-only LM")
    register_sparse()
    switch_attention(model, SPARSE_ATTN_NAME, remember="gatherlens_sparse_previous", what="sparse decoding")
    if isinstance(dense_layers, bool) or not isinstance(dense_layers, int) or dense_layers < 0:
        raise GatherValueError(f"dense_layers = {dense_layers!r} must be an int >= 0 (leading layers kept dense)")
    settings = SparseSettings(budget, page_size, share_selection, group_score, keep_selection)
    dense = SparseSettings(None, page_size, share_selection, group_score, keep_selection)
    model.config.gatherlens_page_size = page_size
    for m in model.modules():
        if hasattr(m, "layer_idx") or hasattr(m, "config"):
            layer = getattr(m, "layer_idx", None)
            m.gatherlens_sparse = dense if isinstance(layer, int) and layer < dense_layers else settings
    if hasattr(model, "_prepare_cache_for_generation"):
        model._prepare_cache_for_generation = types.MethodType(_prepare_sparse_cache, model)
    return model


def use_dense_decoding(model, attn_implementation: str | None = None):
    """Undo use_sparse_decoding: the previous attention (SDPA by default) and generate's usual cache."""
    model = _unwrap(model)
    target = attn_implementation or getattr(model.config, "gatherlens_sparse_previous", None) or "sdpa"
    model.set_attn_implementation(target)
    for m in model.modules():
        for name in ("gatherlens_sparse", "gatherlens_page_selection"):
            m.__dict__.pop(name, None)
    model.__dict__.pop("_prepare_cache_for_generation", None)
    return model


@contextlib.contextmanager
def sparse_decoding(model, budget: int | None = 1024, page_size: int = 16, share_selection: bool = True, **kw):
    """`with sparse_decoding(model, budget=1024): model.generate(...)`, then back to dense."""
    inner = _unwrap(model)
    before = inner.config._attn_implementation
    use_sparse_decoding(inner, budget, page_size, share_selection, **kw)
    try:
        yield inner
    finally:
        use_dense_decoding(inner, before if before != SPARSE_ATTN_NAME else None)


def last_page_selections(model) -> dict[int, object]:
    """layer index -> the PageSelection of its last decode step (needs keep_selection=True)."""
    model = _unwrap(model)
    out = {}
    for name, m in model.named_modules():
        sel = m.__dict__.get("gatherlens_page_selection")
        if sel is not None:
            out[getattr(m, "layer_idx", name)] = sel
    return out


@contextlib.contextmanager
def observe_sparse(observer: Callable[[SparseCall], None]):
    """Call `observer(call)` for every sparse decode step inside the block."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
