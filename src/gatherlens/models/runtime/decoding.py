"""Page-selected sparse decoding inside any Hugging Face Llama-family model, switched on with one call.

    >>> lm = load("smollm2")
    >>> use_sparse_decoding(lm.model, budget=1024, page_size=16)   # generate now decodes sparsely
    >>> use_sparse_decoding(lm.model, config=SparseConfig(512))    # or one configuration (keywords override it)
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
- the decode step (models/runtime/step.py): the model's forward becomes one backend table, `DECODE_STEP`,
  over the model's plan (plan.py: norms, products, head, ranks, variants, read once): the C++ stack
  (every layer and the head in one operator), the planned loop (the same operators from Python: ~12
  calls a layer instead of transformers' ~80) or transformers' own forward (prefill, anything else);
  `backends.describe()` says which ran and why the others did not. `step="hf"` keeps transformers' layers.

With another cache (a plain DynamicCache) a decode step builds a temporary PagedKVCache from the
keys it is given: the same answer, without the memory saving.
"""
from __future__ import annotations

import contextlib

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.models.attention.topk import restore_attention, switch_attention
from gatherlens.models.runtime.step import install_step, installed_plan, remove_step, step_plan
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
    "sparse_attention_forward", "installed_plan",
]


# -- switching a model ----------------------------------------------------------------------------
def config_of(config: SparseConfig | None = None, **overrides) -> SparseConfig:
    """The one SparseConfig of a call: `config` (DEFAULT when None) with `overrides`, each checked against
    SparseConfig's settings (an unknown name, or a bad value, is an error naming it).

        >>> config_of(budget=512).budget, config_of(SparseConfig(64), page_size=4).page_size
        (512, 4)
    """
    if config is None:
        config = DEFAULT
    elif not isinstance(config, SparseConfig):
        raise GatherTypeError(f"config must be a SparseConfig (settings go as keywords: budget=512, ...), got "
                              f"{type(config).__name__} {config!r}")
    return config.replace(**overrides) if overrides else config


def _sparse_cache_for(model) -> SparseKVCache:
    """generate's default cache while use_sparse_decoding is on: a SparseKVCache of the model's page size."""
    return SparseKVCache(config=model.config, page_size=sparse_settings(model).page_size)


def use_sparse_decoding(model, config: SparseConfig | None = None, *, step: str = "auto", **overrides):
    """Make `model.generate` (and any forward given a SparseKVCache) decode with page-selected attention.

        >>> use_sparse_decoding(model, budget=512)                        # a fixed budget (default "auto")
        >>> use_sparse_decoding(model, config=SparseConfig(512, page_size=16))   # or one configuration
        >>> use_sparse_decoding(model, config=QUEST, budget=256)          # a preset, one setting changed

    config: a SparseConfig (ops/sparse/config.py: budget ("auto", the default: pages until their estimated
        attention mass reaches `mass`, within [min_pages, max_pages]; an int: tokens a step reads per
        selection head; None: dense over the same paged cache), page_size, share_selection, group_score,
        keep_selection, recent, choose, dense_share, dense_layers, kv_dtype, mass, min_pages, max_pages;
        its defaults are the best setting of `gatherlens eval-sparse`); None: DEFAULT.
    overrides: any of those settings as keywords, applied to `config` and checked like it (an unknown
        name is an error listing the settings).
    step: the fastest way the model's decode steps may run (models/runtime/step.py's DECODE_STEP):
        "auto" (the C++ stack where it runs the model, else the planned loop, else transformers'
        layers), "stack", "planned" (a row named that cannot run the model is an error naming why) or
        "hf" (transformers' own layers and head: the old lean=False).
    The configuration is one SparseConfig; every module gets a reference to it, nothing else.
    Prefill stays dense (SDPA). Returns the model.
    """
    from gatherlens.models.attention.requirements import require_causal_attention

    model = unwrap(model)
    require_causal_attention(model, "sparse decoding")   # Mamba, BERT: one clear error naming the class
    config = config_of(config, **overrides)
    if getattr(model.config, "is_encoder_decoder", False):
        raise GatherValueError(f"{type(model).__name__} is an encoder-decoder; sparse decoding needs a decoder-only LM")
    layer_kinds(model.config)  # any layer type it cannot run: one clear error now, not at the first step
    plan = step_plan(model, step)  # the decode plan, read once (a `step` that cannot run: an error, nothing switched)
    register_sparse()
    switch_attention(model, SPARSE_ATTN_NAME, remember="gatherlens_sparse_previous", what="sparse decoding")
    for m in model.modules():  # the attention modules (by layer_idx) and the model itself (its cache's page size)
        if hasattr(m, "layer_idx") or hasattr(m, "config"):
            setattr(m, CONFIG_ATTR, config)
    default_cache(model, _sparse_cache_for)
    install_step(model, plan)  # the decode-step table over the plan as the model's forward
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
    remove_step(model)
    return model


@contextlib.contextmanager
def sparse_decoding(model, config: SparseConfig | None = None, **overrides):
    """`with sparse_decoding(model, budget=1024): model.generate(...)`, then back to dense."""
    inner = unwrap(model)
    before = attn_implementation(inner)
    use_sparse_decoding(inner, config, **overrides)
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
