"""Page-selected sparse decoding inside any Hugging Face Llama-family model, switched on with one call.

    >>> lm = load("smollm2")
    >>> use_sparse_decoding(lm.model, budget=1024, page_size=16)   # generate now decodes sparsely
    >>> lm.model.generate(ids, max_new_tokens=32)
    >>> last_page_selections(lm.model)[0].to_svg()                # pages layer 0 read (keep_selection=True)
    >>> use_dense_decoding(lm.model)                               # back to SDPA and DynamicCache

Three pieces, through transformers' public extension points (written against 5.x):
- `SparseKVCache` (sparse_cache.py), a `transformers.Cache` whose layers store keys and values in
  a `gatherlens.ops.sparse.PagedKVCache` (pages with Quest's per-page key min/max). `use_sparse_
  decoding` makes `generate` build one when the caller passes no cache; any caller may also pass
  `cache=SparseKVCache(config=model.config)`.
- the attention function "gatherlens_sparse" (sparse_attention.py): a decode step calls
  `sparse_decode` on that layer's paged cache (score the page summaries, gather the best pages
  within the budget, attend over them exactly; dense in place when the budget buys every page).
  Prefill runs dense SDPA, as Quest does.
- the lean decode step (decode_step.py): Llama-family decoder layers run one-token steps in ~35
  torch calls instead of ~80 (same arithmetic, same parameters), and the output projection of a
  one-token step reads a transposed copy of its weight (decode_head.py: about twice as fast on the
  CPU); `lean=False` keeps HF's layers and head.

With another cache (a plain DynamicCache) a decode step builds a temporary PagedKVCache from the
keys it is given: the same answer, without the memory saving.
"""
from __future__ import annotations

import contextlib
import dataclasses
import types

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.models.attention import switch_attention
from gatherlens.models.decode_head import install_lean_head, remove_lean_head
from gatherlens.models.decode_step import install_lean_step, lean_layers, remove_lean_step
from gatherlens.models.sparse_attention import (
    SPARSE_ATTN_NAME, SparseCall, SparseSettings, decode_attention, observe_sparse, register_sparse,
    sparse_attention_forward, sparse_settings,
)
from gatherlens.models.sparse_cache import PAGED_KWARG, PagedLayer, SparseKVCache
from gatherlens.models.sparse_defaults import DEFAULTS, recent_for
from gatherlens.ops.sparse.page_choice import CHOOSERS, GROUP_SCORES

__all__ = [
    "SPARSE_ATTN_NAME", "SparseSettings", "PagedLayer", "SparseKVCache", "SparseCall",
    "use_sparse_decoding", "use_dense_decoding", "sparse_decoding", "sparse_settings",
    "last_page_selections", "observe_sparse", "register_sparse", "decode_attention",
    "sparse_attention_forward", "lean_layers", "PAGED_KWARG", "DEFAULTS",
]


# -- switching a model ----------------------------------------------------------------------------
def _unwrap(model):
    model = model if hasattr(model, "set_attn_implementation") else getattr(model, "model", model)
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise GatherTypeError(
            f"model must be a transformers PreTrainedModel (or a LoadedModel), got {type(model).__name__}")
    return model


def _check_settings(settings: SparseSettings, dense_layers) -> None:
    budget, page_size = settings.budget, settings.page_size
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise GatherValueError(f"budget = {budget!r} must be an int >= 1 (tokens read per decode step) or None (dense)")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise GatherValueError(f"page_size = {page_size!r} must be an int >= 1 (tokens per page)")
    if not isinstance(settings.share_selection, bool):
        raise GatherTypeError(f"share_selection must be a bool, got {settings.share_selection!r}")
    if settings.group_score not in GROUP_SCORES:
        raise GatherValueError(f"group_score = {settings.group_score!r} must be one of {GROUP_SCORES}")
    if isinstance(settings.recent, bool) or not isinstance(settings.recent, int) or settings.recent < 0:
        raise GatherValueError(f"recent = {settings.recent!r} must be an int >= 0 (newest tokens always read)")
    if isinstance(settings.dense_share, bool) or not isinstance(settings.dense_share, (int, float)) \
            or not settings.dense_share > 0:
        raise GatherValueError(f"dense_share = {settings.dense_share!r} must be a number > 0 (share of the cache)")
    if settings.choose not in CHOOSERS:
        raise GatherValueError(f"choose = {settings.choose!r} must be one of {CHOOSERS}")
    if isinstance(dense_layers, bool) or not isinstance(dense_layers, int) or dense_layers < 0:
        raise GatherValueError(f"dense_layers = {dense_layers!r} must be an int >= 0 (leading layers kept dense)")


def _prepare_sparse_cache(self, generation_config, model_kwargs, *args, **kwargs):
    """generate's cache set-up, bound to a model by use_sparse_decoding: a SparseKVCache by default."""
    original = type(self)._prepare_cache_for_generation
    wants_default = (model_kwargs.get("cache") is None and generation_config.use_cache is not False
                     and generation_config.cache_implementation in (None, "dynamic"))
    if not wants_default:
        return original(self, generation_config, model_kwargs, *args, **kwargs)
    model_kwargs["cache"] = SparseKVCache(config=self.config, page_size=self.config.gatherlens_page_size)


def use_sparse_decoding(model, budget: int | None = DEFAULTS["budget"], page_size: int = DEFAULTS["page_size"],
                        share_selection: bool = DEFAULTS["share_selection"], *, group_score: str = DEFAULTS["group_score"],
                        keep_selection: bool = False, dense_layers: int = DEFAULTS["dense_layers"],
                        recent: int | None = DEFAULTS["recent"], choose: str = "bound", lean: bool = True,
                        dense_share: float = DEFAULTS["dense_share"]):
    """Make `model.generate` (and any forward given a SparseKVCache) decode with page-selected attention.

    budget: tokens each decode step reads per KV head (pages are whole; page 0 and the newest page
        always); None decodes densely over the same paged cache. page_size: tokens per page.
    share_selection: the query heads of a KV group read the same pages (GQA; what saves memory
        traffic); False lets every query head choose. group_score: "max" or "sum" of the group's bounds.
    keep_selection: keep each layer's last PageSelection (see `last_page_selections`).
    dense_layers: the first this many decoder layers decode densely (Quest keeps its first two
        layers dense: their attention is spread too evenly for page selection to pay).
    recent: the newest `recent` tokens are always read, within the budget (a local window);
        None: a quarter of the budget.
    choose: "bound" (Quest) or "oracle" (pages by true attention mass: reads every key; for evaluation).
    lean: Llama-family layers take the lean decode step (decode_step.py) and a CPU output projection
        reads a transposed copy of its weight for one-row steps (decode_head.py: V x d more memory,
        113 MB for SmolLM2); False keeps HF's layers and head.
    dense_share: a budget of at least this share of the cache decodes densely, in place (scoring
        and gathering would cost more than they save); 1.0: only a budget that covers the cache.
    The defaults are the best setting of `gatherlens eval-sparse` (DEFAULTS). Prefill stays dense
    (SDPA). Returns the model.
    """
    model = _unwrap(model)
    recent = recent_for(budget, recent)
    settings = SparseSettings(budget, page_size, share_selection, group_score, keep_selection, recent, choose,
                              dense_share)
    _check_settings(settings, dense_layers)
    if getattr(model.config, "is_encoder_decoder", False):
        raise GatherValueError(f"{type(model).__name__} is an encoder-decoder; sparse decoding needs a decoder-only LM")
    register_sparse()
    switch_attention(model, SPARSE_ATTN_NAME, remember="gatherlens_sparse_previous", what="sparse decoding")
    dense = dataclasses.replace(settings, budget=None)
    model.config.gatherlens_page_size = page_size
    for m in model.modules():
        if hasattr(m, "layer_idx") or hasattr(m, "config"):
            layer = getattr(m, "layer_idx", None)
            m.gatherlens_sparse = dense if isinstance(layer, int) and layer < dense_layers else settings
    if hasattr(model, "_prepare_cache_for_generation"):
        model._prepare_cache_for_generation = types.MethodType(_prepare_sparse_cache, model)
    remove_lean_step(model)
    remove_lean_head(model)
    if lean:
        install_lean_step(model)
        install_lean_head(model)
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
    remove_lean_step(model)
    remove_lean_head(model)
    return model


@contextlib.contextmanager
def sparse_decoding(model, budget: int | None = DEFAULTS["budget"], page_size: int = DEFAULTS["page_size"],
                    share_selection: bool = DEFAULTS["share_selection"], **kw):
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
