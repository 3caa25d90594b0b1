"""Page-selected sparse decoding inside any Hugging Face Llama-family model, switched on with one call.

    >>> lm = load("smollm2")
    >>> use_sparse_decoding(lm.model, budget=1024, page_size=16)   # generate now decodes sparsely
    >>> lm.model.generate(ids, max_new_tokens=32)
    >>> last_page_selections(lm.model)[0].to_svg()                # pages layer 0 read (keep_selection=True)
    >>> use_dense_decoding(lm.model)                               # back to SDPA and DynamicCache

Three pieces, through transformers' public extension points (written against 5.x):
- `SparseKVCache` (models/attention/cache.py), a `transformers.Cache` whose layers store keys and values in
  a `gatherlens.ops.sparse.PagedKVCache` (pages with Quest's per-page key min/max). `use_sparse_
  decoding` makes `generate` build one when the caller passes no cache; any caller may also pass
  `cache=SparseKVCache(config=model.config)`.
- the attention function "gatherlens_sparse" (models/attention/sparse.py): a decode step calls
  `sparse_decode` on that layer's paged cache (score the page summaries, gather the best pages
  within the budget, attend over them exactly; dense in place when the budget buys every page).
  Prefill runs dense SDPA, as Quest does.
- the lean decode step (models/runtime/step.py): Llama-family decoder layers run one-token steps in ~35
  torch calls instead of ~80 (same arithmetic, same parameters), and the output projection of a
  one-token step reads a transposed copy of its weight (models/runtime/head.py: faster on the CPU, see
  docs/benchmarks.md); `lean=False` keeps HF's layers and head.

With another cache (a plain DynamicCache) a decode step builds a temporary PagedKVCache from the
keys it is given: the same answer, without the memory saving.
"""
from __future__ import annotations

import contextlib

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.models.attention.topk import restore_attention, switch_attention
from gatherlens.models.runtime.head import install_lean_head, remove_lean_head
from gatherlens.models.runtime.stack import install_stack, remove_stack
from gatherlens.models.runtime.step import install_lean_step, lean_layers, remove_lean_step
from gatherlens.models.attention.features import layer_kinds
from gatherlens.models.hf_adapter import attn_implementation, default_cache, restore_default_cache, unwrap
from gatherlens.models.attention.sparse import (
    CONFIG_ATTR, SPARSE_ATTN_NAME, SparseCall, SparseSettings, decode_attention, observe_sparse, register_sparse,
    sparse_attention_forward, sparse_settings,
)
from gatherlens.models.attention.cache import PagedLayer, SparseKVCache
from gatherlens.models.attention.prefill import prefill_implementation
from gatherlens.ops.sparse.config import DEFAULT, SparseConfig

__all__ = [
    "SPARSE_ATTN_NAME", "CONFIG_ATTR", "SparseConfig", "SparseSettings", "PagedLayer", "SparseKVCache", "SparseCall",
    "use_sparse_decoding", "use_dense_decoding", "sparse_decoding", "sparse_settings",
    "last_page_selections", "observe_sparse", "register_sparse", "decode_attention",
    "sparse_attention_forward", "lean_layers",
]


# -- switching a model ----------------------------------------------------------------------------
def _config_of(config: SparseConfig | None, **settings) -> SparseConfig:
    """The one SparseConfig of a use_sparse_decoding call: `config`, or one built from the keywords.

    With `config`, a keyword that differs from both the default and the config is an error (which
    of the two was meant is unclear).
    """
    if config is None:
        return SparseConfig(**settings)
    if not isinstance(config, SparseConfig):
        raise GatherTypeError(f"config must be a SparseConfig, got {type(config).__name__}")
    for name, value in settings.items():
        if value != getattr(DEFAULT, name) and value != getattr(config, name):
            raise GatherValueError(f"{name} = {value!r} disagrees with config.{name} = {getattr(config, name)!r}; "
                                   f"give it in one place (the SparseConfig or the keyword)")
    return config


def _sparse_cache_for(model) -> SparseKVCache:
    """generate's default cache while use_sparse_decoding is on: a SparseKVCache of the model's page size."""
    return SparseKVCache(config=model.config, page_size=sparse_settings(model).page_size)


def use_sparse_decoding(model, budget: int | str | None = DEFAULT.budget, page_size: int = DEFAULT.page_size,
                        share_selection: bool = DEFAULT.share_selection, *, group_score: str = DEFAULT.group_score,
                        keep_selection: bool = DEFAULT.keep_selection, dense_layers: int = DEFAULT.dense_layers,
                        recent: int | None = DEFAULT.recent, choose: str = DEFAULT.choose, lean: bool = True,
                        dense_share: float = DEFAULT.dense_share, kv_dtype: str | None = DEFAULT.kv_dtype,
                        mass: float = DEFAULT.mass, min_pages: int = DEFAULT.min_pages,
                        max_pages: int = DEFAULT.max_pages, config: SparseConfig | None = None):
    """Make `model.generate` (and any forward given a SparseKVCache) decode with page-selected attention.

        >>> use_sparse_decoding(model, budget=512)                        # a fixed budget (default "auto")
        >>> use_sparse_decoding(model, config=SparseConfig(512, page_size=16))   # or one configuration

    budget: "auto" (default; pages until their estimated attention mass reaches `mass`, within
        [min_pages, max_pages]: SparseConfig), an int (tokens a step reads per selection head; page 0
        and the newest page always) or None (dense over the same paged cache). page_size: tokens per page.
    share_selection: the query heads of a KV group read the same pages (GQA; what saves memory
        traffic); False lets every query head choose. group_score: "max" or "sum" of the group's bounds.
    keep_selection: keep each layer's last PageSelection (see `last_page_selections`).
    dense_layers: the first this many global (full-attention) decoder layers decode densely (Quest
        keeps its first two layers dense: their attention is spread too evenly for page selection
        to pay). Local layers (sliding window: Mistral, Qwen2, Gemma 2/3, Cohere 2, GPT-OSS;
        chunked: Llama 4) always read their window densely, from a ring of that window.
    recent: the newest `recent` tokens are always read, within the budget (a local window);
        None: a quarter of the budget.
    choose: "bound" (Quest) or "oracle" (pages by true attention mass: reads every key; for evaluation).
    lean: Llama-family layers take the lean decode step (models/runtime/step.py) and a CPU output projection
        reads a transposed copy of its weight (models/runtime/head.py); False keeps HF's layers and head.
    dense_share: a fixed budget of at least this share of the cache decodes densely, in place.
    kv_dtype: how the paged cache stores keys and values: None (the keys' dtype), "float16",
        "bfloat16", "int8" or "float32"; page summaries stay exact for the stored values.
    config: a SparseConfig holding all of the above but `lean` (the keywords then stay unset). The
    keywords build one SparseConfig (its defaults: the best setting of `gatherlens eval-sparse`);
    every module gets a reference to it. Prefill stays dense (SDPA). Returns the model.
    """
    from gatherlens.models.attention.requirements import require_causal_attention

    model = unwrap(model)
    require_causal_attention(model, "sparse decoding")   # Mamba, BERT: one clear error naming the class
    config = _config_of(config, budget=budget, page_size=page_size, share_selection=share_selection,
                        group_score=group_score, keep_selection=keep_selection, recent=recent, choose=choose,
                        dense_share=dense_share, dense_layers=dense_layers, kv_dtype=kv_dtype, mass=mass,
                        min_pages=min_pages, max_pages=max_pages)
    if getattr(model.config, "is_encoder_decoder", False):
        raise GatherValueError(f"{type(model).__name__} is an encoder-decoder; sparse decoding needs a decoder-only LM")
    layer_kinds(model.config)  # any layer type it cannot run: one clear error now, not at the first step
    register_sparse()
    switch_attention(model, SPARSE_ATTN_NAME, remember="gatherlens_sparse_previous", what="sparse decoding")
    for m in model.modules():  # the attention modules (by layer_idx) and the model itself (its cache's page size)
        if hasattr(m, "layer_idx") or hasattr(m, "config"):
            setattr(m, CONFIG_ATTR, config)
    default_cache(model, _sparse_cache_for)
    remove_lean_step(model)
    remove_lean_head(model)
    remove_stack(model)
    if lean:
        install_lean_step(model)
        install_lean_head(model)
        install_stack(model)
    return model


def use_dense_decoding(model, attn_implementation: str | None = None):
    """Undo use_sparse_decoding: the previous attention (SDPA by default) and generate's usual cache."""
    model = unwrap(model)
    # what it replaced (not in config); a model on sparse prefill returns to it (models/attention/prefill.py)
    restore_attention(model, "gatherlens_sparse_previous", attn_implementation or prefill_implementation(model))
    for m in model.modules():
        for name in (CONFIG_ATTR, "gatherlens_page_selection"):
            m.__dict__.pop(name, None)
    restore_default_cache(model)
    remove_lean_step(model)
    remove_lean_head(model)
    remove_stack(model)
    return model


@contextlib.contextmanager
def sparse_decoding(model, budget: int | None = DEFAULT.budget, page_size: int = DEFAULT.page_size,
                    share_selection: bool = DEFAULT.share_selection, **kw):
    """`with sparse_decoding(model, budget=1024): model.generate(...)`, then back to dense."""
    inner = unwrap(model)
    before = attn_implementation(inner)
    use_sparse_decoding(inner, budget, page_size, share_selection, **kw)
    try:
        yield inner
    finally:
        use_dense_decoding(inner, before if before != SPARSE_ATTN_NAME else None)


def last_page_selections(model) -> dict[int, object]:
    """layer index -> the PageSelection of its last decode step (needs keep_selection=True)."""
    model = unwrap(model)
    out = {}
    for name, m in model.named_modules():
        sel = m.__dict__.get("gatherlens_page_selection")
        if sel is not None:
            out[getattr(m, "layer_idx", name)] = sel
    return out
