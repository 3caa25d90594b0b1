"""Block-sparse prefill inside any Hugging Face model (and the quantized runtime), switched on with one call.

    >>> lm = load("smollm2")                                  # or load("smollm2", quantized=True)
    >>> use_sparse_prefill(lm.model, PrefillConfig(keep_selection=True))
    >>> lm.model(ids)                                         # prefill: each query block gathers its key blocks
    >>> last_prefill_selections(lm.model)[0].blocks.shape     # (B, Hkv, nq, nk): what layer 0 gathered
    >>> use_dense_prefill(lm.model)                           # back to the attention it had

The switch is ONE PrefillConfig (ops/prefill/config.py) referenced by every attention module
(`module.gatherlens_prefill`). A prefill call (more than one query token) of such a module runs
`ops.prefill.prefill_with` on the keys transformers hands it (after RoPE and the cache update:
the cache still stores every key, so decoding is unchanged); anything else runs the attention the
module had. Two doors, through transformers' AttentionInterface (`hf_adapter.register_attention`):
- a model on transformers' attention (SDPA, eager, top-k) switches to "gatherlens_prefill", which
  passes one-token steps to the implementation it replaced;
- a model on sparse decoding ("gatherlens_sparse") keeps it: its prefill path asks
  `sparse_prefill_call` first (models/attention/sparse.py), so the two switches combine in either
  order, and `use_dense_decoding` comes back to "gatherlens_prefill" (`prefill_implementation`).
A call runs densely (the previous path) when its keys are fewer than `config.min_length`, in one of the
first `dense_layers` global layers, on a chunked local layer, or under a mask that is not the plain
causal (and sliding-window) one: a padded batch.
"""
from __future__ import annotations

import weakref

import torch

from gatherlens.errors import GatherTypeError
from gatherlens.models.attention.topk import exact_attention, restore_attention, switch_attention
from gatherlens.models.attention.features import attention_variant, global_rank, module_kind
from gatherlens.models.hf_adapter import (
    attention_function, attn_implementation, grouped_sdpa, register_attention, unwrap,
)
from gatherlens.ops.prefill.attend import prefill_with
from gatherlens.ops.prefill.config import DEFAULT, PrefillConfig

__all__ = ["PREFILL_ATTN_NAME", "PREFILL_ATTR", "use_sparse_prefill", "use_dense_prefill", "prefill_settings",
           "sparse_prefill_call", "prefill_attention_forward", "last_prefill_selections", "prefill_implementation",
           "prefill_selections"]

PREFILL_ATTN_NAME = "gatherlens_prefill"
PREFILL_ATTR = "gatherlens_prefill"                 # a module's PrefillConfig
PREVIOUS_ATTR = "gatherlens_prefill_previous"       # the attention "gatherlens_prefill" passes other calls to
SELECTION_ATTR = "gatherlens_prefill_selection"     # a module's last PrefillSelection (keep_selection)
_REMEMBER = "gatherlens_prefill_previous"           # switch_attention's record on the model
_SPARSE_DECODING = "gatherlens_sparse"              # models/attention/sparse.py's name


def prefill_settings(module) -> PrefillConfig | None:
    """The PrefillConfig a module prefills with (set by use_sparse_prefill), or None."""
    return module.__dict__.get(PREFILL_ATTR)


def prefill_implementation(model) -> str | None:
    """"gatherlens_prefill" while `model` prefills sparsely (what a switch that resets attention returns to), else None."""
    return PREFILL_ATTN_NAME if prefill_settings(unwrap(model)) is not None else None


def _plain_mask(attention_mask, Q: int, L: int, window: int | None) -> bool:
    """True when transformers' mask (None, bool or additive (B, 1|H, Q, >=L)) is the causal (+ window) rule alone.

    Every layer of one forward gets the same mask object (transformers makes it once a forward and never
    writes it): its verdict is kept for the next layer (the check reads all Q x L entries: ~10 ms a layer
    for a chunk of 1,024 queries after 7K tokens).
    """
    if attention_mask is None:
        return True
    key = (tuple(attention_mask.shape), Q, L, window)
    seen = _LAST_MASK[0]
    if seen is not None and seen[0]() is attention_mask and seen[1] == key:
        return seen[2]
    verdict = _is_causal_rule(attention_mask, Q, L, window)
    _LAST_MASK[0] = (weakref.ref(attention_mask), key, verdict)
    return verdict


_LAST_MASK: list = [None]  # (weakref to the last mask checked, (its shape, Q, L, window), its verdict)


def _is_causal_rule(attention_mask, Q: int, L: int, window: int | None) -> bool:
    """_plain_mask's check, entry by entry."""
    m = attention_mask[..., :L]                                                # (B, 1|H, Q, L)
    m = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2       # additive -> bool
    qpos = torch.arange(L - Q, L, device=m.device)[:, None]                    # (Q, 1)
    kpos = torch.arange(L, device=m.device)[None, :]                           # (1, L)
    rule = kpos <= qpos                                                        # (Q, L)
    if window is not None:
        rule &= (qpos - kpos) < window
    return bool((m == rule).all())


def sparse_prefill_call(module, query, key, value, attention_mask, scaling, variant=None):
    """A prefill call of `module` run block-sparsely: (out (B, Q, Hq, Dv), None), or None when it runs densely.

    query (B, Hq, Q, D), key (B, Hkv, L, D), value (B, Hkv, L, Dv) as transformers hands them.
    """
    config = prefill_settings(module)
    Q, L = query.shape[2], key.shape[2]
    # the length is the keys' (a chunk of a long prompt, as generation prefills it, is sparse too)
    if config is None or Q < 2 or Q > L or config.dense_at(L, global_rank(module)):
        return None
    variant = variant if variant is not None else attention_variant(module, where="sparse prefill")
    if module_kind(module).kind == "chunked" or not _plain_mask(attention_mask, Q, L, variant.window):
        return None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out, sel = prefill_with(query, key, value, config, scale, variant, return_selection=True)  # (B, Hq, Q, Dv)
    if config.keep_selection:
        sel.meta["layer"] = getattr(module, "layer_idx", None)
        module.__dict__[SELECTION_ATTR] = sel
    return out.transpose(1, 2).contiguous(), None                              # (B, Q, Hq, Dv)


def prefill_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                              scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The function transformers calls per layer as "gatherlens_prefill": sparse for a prefill, else the previous one."""
    variant = attention_variant(module, kwargs, where="sparse prefill") if query.shape[2] > 1 else None
    done = sparse_prefill_call(module, query, key, value, attention_mask, scaling, variant)
    if done is not None:
        return done
    name = module.__dict__.get(PREVIOUS_ATTR) or "sdpa"
    if name in ("sdpa", "eager"):  # eager is no registered function: SDPA, or the exact softmax for a variant
        variant = variant if variant is not None else attention_variant(module, kwargs, where="sparse prefill")
        if not variant.plain:
            return exact_attention(module, query, key, value, attention_mask, scaling, is_causal, variant)
        name = "sdpa"
    run = grouped_sdpa if name == "sdpa" else attention_function(name)
    return run(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
               **kwargs)


def use_sparse_prefill(model, config: PrefillConfig | None = None):
    """Make every prefill of `model` block-sparse with `config` (default: the measured DEFAULT). Returns the model.

        >>> use_sparse_prefill(model)                                   # antidiagonal scores, mass 0.95
        >>> use_sparse_prefill(model, POOLED.replace(budget=32))        # FlexPrefill-style, at most 32 blocks
    """
    from gatherlens.models.attention.requirements import require_causal_attention

    model = unwrap(model)
    config = DEFAULT if config is None else config
    if not isinstance(config, PrefillConfig):
        raise GatherTypeError(f"config must be a PrefillConfig or None, got {type(config).__name__}")
    require_causal_attention(model, "sparse prefill")
    register_attention(PREFILL_ATTN_NAME, prefill_attention_forward)
    current = attn_implementation(model)
    if current not in (PREFILL_ATTN_NAME, _SPARSE_DECODING):
        switch_attention(model, PREFILL_ATTN_NAME, remember=_REMEMBER, what="sparse prefill")
    for m in model.modules():
        if hasattr(m, "layer_idx") or m is model:
            m.__dict__[PREFILL_ATTR] = config
            if current not in (PREFILL_ATTN_NAME, _SPARSE_DECODING):
                m.__dict__[PREVIOUS_ATTR] = current
    return model


def use_dense_prefill(model):
    """Undo use_sparse_prefill: every prefill dense again, the attention it replaced back. Returns the model."""
    model = unwrap(model)
    for m in model.modules():
        for name in (PREFILL_ATTR, PREVIOUS_ATTR, SELECTION_ATTR):
            m.__dict__.pop(name, None)
    if attn_implementation(model) == PREFILL_ATTN_NAME:
        restore_attention(model, _REMEMBER)
    return model


def last_prefill_selections(model) -> dict:
    """layer index -> the PrefillSelection of its last sparse prefill (needs keep_selection=True)."""
    model = unwrap(model)
    out = {}
    for name, m in model.named_modules():
        sel = m.__dict__.get(SELECTION_ATTR)
        if sel is not None:
            out[getattr(m, "layer_idx", name)] = sel
    return out


def prefill_selections(model, ids, config: PrefillConfig | None = None) -> dict:
    """One sparse prefill of ids (1, S) with `config` (default: DEFAULT from any length): layer -> its
    PrefillSelection. The model's prefill switch is put back as it was.

        >>> prefill_selections(lm.model, ids)[15].blocks.shape      # (1, Hkv, nq, nk)
    """
    model = unwrap(model)
    config = (DEFAULT.replace(min_length=0) if config is None else config).replace(keep_selection=True)
    before = {m: m.__dict__.get(PREFILL_ATTR) for m in model.modules() if PREFILL_ATTR in m.__dict__}
    use_sparse_prefill(model, config)
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        return last_prefill_selections(model)
    finally:
        use_dense_prefill(model)
        if before:
            use_sparse_prefill(model, next(iter(before.values())))
