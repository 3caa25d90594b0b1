"""Top-k attention inside any Hugging Face model, through transformers' attention interface.

    >>> lm = load("smollm2")
    >>> use_topk_attention(lm.model, top_k=32)          # every layer now gathers 32 keys per query
    >>> lm.model.generate(ids, max_new_tokens=8)
    >>> use_dense_attention(lm.model)                   # back to SDPA
    >>> AutoModel.from_pretrained(path, attn_implementation="gatherlens_topk")  # after register()

The function registered as "gatherlens_topk" receives what transformers gives every attention
kernel: query (B, Hq, Q, D), key/value (B, Hkv, L, D) (after RoPE and the KV cache) and the mask
built by transformers' SDPA mask function: None (plain causal, or no padding) or a 4-D bool mask
(True = attend) holding causality and padding together. It calls `gatherlens.ops.attention.
topk_attention` with the same rules SDPA would get, so with top_k >= L its logits match SDPA's.

Observers (`observe_attention`) see every call with its tensors and selection: the eval metrics
and the tracer use them; no observer, no extra cost.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.models.attention.features import AttentionVariant, attention_variant
from gatherlens.models.hf_adapter import attn_implementation, register_attention, set_attn_implementation, unwrap

__all__ = [
    "ATTN_NAME", "register", "use_topk_attention", "use_dense_attention", "topk_settings",
    "AttentionCall", "observe_attention", "last_selections", "switch_attention", "restore_attention",
    "attention_restored", "set_config", "sdpa_rules", "exact_attention",
]

ATTN_NAME = "gatherlens_topk"
DEFAULT_TOP_K = 32
SWITCHES = "gatherlens_switches"   # the model's own attribute: what each switch replaced (see switch_attention)
_ABSENT = object()
_DENSE = "dense_attention"          # what use_topk_attention replaced, for use_dense_attention
_observers: list[Callable[["AttentionCall"], None]] = []


@dataclass
class AttentionCall:
    """One attention call inside a model, as the observers see it."""

    module: torch.nn.Module
    layer: int | None        # module.layer_idx when the model has one
    query: torch.Tensor      # (B, Hq, Q, D)
    key: torch.Tensor        # (B, Hkv, L, D)
    value: torch.Tensor      # (B, Hkv, L, Dv)
    mask: torch.Tensor | None  # (B|1, 1|H, Q, L) bool (True = attend) / additive float, or None
    is_causal: bool          # top-left causal rule, used only when mask is None
    scale: float | None
    top_k: int
    output: torch.Tensor     # (B, Hq, Q, Dv)
    selection: object | None  # AttentionSelection when one was asked for


def _topk_kernel():
    """The project's top-k attention (gatherlens.ops.attention.topk_attention)."""
    from gatherlens.ops.attention import topk_attention

    return topk_attention


def topk_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                           scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """The function transformers calls per layer; returns (output (B, Q, Hq, Dv), None).

    `dropout` is not applied (top-k attention is for inference and analysis); no attention
    weights are returned (output_attentions gets None, as with SDPA). Soft-capping (Gemma 2) and
    sinks (GPT-OSS) come from the call's kwargs or the module (`features.attention_variant`).
    """
    variant = attention_variant(module, kwargs, where="gatherlens_topk attention")
    top_k = topk_settings(module)["top_k"]
    key, value, attention_mask, is_causal = sdpa_rules(module, query, key, value, attention_mask, is_causal)
    tracing = _tracing()
    want_sel = topk_settings(module)["keep_selection"] or bool(_observers) or tracing
    with _pause_tracer() if tracing else contextlib.nullcontext():  # one event, not its internals
        result = _topk_kernel()(
            query, key, value, top_k, is_causal=is_causal, attn_mask=attention_mask, scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1], return_selection=want_sel, variant=variant,
        )
    out, sel = result if want_sel else (result, None)              # out (B, Hq, Q, Dv)
    if sel is not None:
        _tell(module, sel, AttentionCall(module, getattr(module, "layer_idx", None), query, key, value,
                                         attention_mask, is_causal, scaling, top_k, out, sel), tracing)
    return out.transpose(1, 2).contiguous(), None                  # (B, Q, Hq, Dv)


def sdpa_rules(module, query, key, value, attention_mask, is_causal):
    """(key, value, mask, is_causal) as SDPA gets them from transformers: causal only for a plain
    prefill with no mask; keys past Q unused in a prefill into an empty static cache; the mask
    cut to the keys."""
    Q = query.shape[2]                                             # query (B, Hq, Q, D), key (B, Hkv, L, D)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(Q > 1 and attention_mask is None and is_causal)
    if is_causal and key.shape[2] > Q:  # prefill into an empty static cache: keys past Q are unused
        key, value = key[:, :, :Q], value[:, :, :Q]                # (B, Hkv, Q, D), (B, Hkv, Q, Dv)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-1] > key.shape[2]:
        attention_mask = attention_mask[..., : key.shape[2]]       # (B, 1, Q, L)
    return key, value, attention_mask, is_causal


def exact_attention(module, query, key, value, attention_mask, scaling, is_causal, variant: AttentionVariant):
    """Dense attention with SDPA's rules and the layer's soft-capping / sinks (top-k keeping every
    key: the exact softmax); returns (output (B, Q, Hq, Dv), None) as an attention function does."""
    key, value, attention_mask, is_causal = sdpa_rules(module, query, key, value, attention_mask, is_causal)
    out = _topk_kernel()(query, key, value, key.shape[2], is_causal=is_causal, attn_mask=attention_mask,
                         scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                         variant=variant)                          # (B, Hq, Q, Dv)
    return out.transpose(1, 2).contiguous(), None                  # (B, Q, Hq, Dv)


def _tell(module, sel, call: "AttentionCall", tracing: bool) -> None:
    """Keep / trace / observe one call's selection."""
    sel.meta.setdefault("layer", call.layer)
    if topk_settings(module)["keep_selection"]:
        module.gatherlens_selection = sel
    if tracing:
        from gatherlens.trace import tracer

        tracer.emit_attention_selection(sel, query=call.query, key=call.key, value=call.value, output=call.output)
    for observer in list(_observers):
        observer(call)


def _tracing() -> bool:
    from gatherlens.trace import tracer

    return tracer.is_tracing()


def _pause_tracer():
    from gatherlens.trace import tracer

    return tracer.paused()


def register() -> None:
    """Register "gatherlens_topk" with transformers' attention and mask interfaces (idempotent).

    The mask function is transformers' own SDPA one, so padding, causality and sliding windows
    reach the kernel exactly as they reach SDPA.
    """
    register_attention(ATTN_NAME, topk_attention_forward)


def topk_settings(module: torch.nn.Module) -> dict:
    """The top-k settings an attention module runs with (set by use_topk_attention)."""
    top_k = getattr(module, "gatherlens_top_k", None)
    if top_k is None:
        top_k = getattr(getattr(module, "config", None), "gatherlens_top_k", None) or DEFAULT_TOP_K
    return {"top_k": top_k, "keep_selection": bool(getattr(module, "gatherlens_keep_selection", False))}


def switch_attention(model, name: str, *, remember: str, what: str) -> None:
    """Set a registered attention implementation, keeping the one it replaces under `remember`.

        >>> switch_attention(model, "gatherlens_topk", remember="dense_attention", what="top-k attention")

    What it replaced is kept on the model itself, never in its config: a config saved after
    `restore_attention` is the one loaded, with no gatherlens key.
    """
    previous = attn_implementation(model)
    if previous != name:
        _switches(model).setdefault(remember, {"attention": None, "config": {}})["attention"] = previous or "sdpa"
    set_attn_implementation(model, name)
    if attn_implementation(model) != name:
        raise GatherValueError(
            f"{type(model).__name__} cannot switch its attention implementation (it does not use "
            f"transformers' AttentionInterface), so {what} cannot be plugged in"
        )


def _switches(model) -> dict:
    """{remember: {"attention": what it replaced, "config": {key: value before}}}, on the model."""
    return model.__dict__.setdefault(SWITCHES, {})


def set_config(model, remember: str, key: str, value) -> None:
    """Set `model.config.<key>` while a switch is on; `restore_attention` puts back what was there.

        >>> set_config(model, "dense_attention", "gatherlens_top_k", 8)    # model.config.gatherlens_top_k == 8
    """
    saved = _switches(model).setdefault(remember, {"attention": None, "config": {}})["config"]
    saved.setdefault(key, model.config.__dict__.get(key, _ABSENT))
    setattr(model.config, key, value)


def restore_attention(model, remember: str, attn_implementation: str | None = None,
                      config_keys: tuple[str, ...] = ()) -> None:
    """Undo switch_attention(remember=...): the attention it replaced (or `attn_implementation`;
    SDPA when nothing is remembered, eager for a model without SDPA, as Gemma 2 and GPT-OSS), and
    `config_keys` exactly as they were before it.

        >>> restore_attention(model, "dense_attention", config_keys=("gatherlens_top_k",))
    """
    switches = model.__dict__.get(SWITCHES, {})
    saved = switches.pop(remember, None) or {"attention": None, "config": {}}
    chosen = attn_implementation or saved["attention"]
    try:
        set_attn_implementation(model, chosen or "sdpa")
    except ValueError:  # transformers: this model has no SDPA attention
        if chosen is not None:
            raise
        set_attn_implementation(model, "eager")
    for key in config_keys:
        before = saved["config"].get(key, _ABSENT)
        if before is _ABSENT:
            model.config.__dict__.pop(key, None)
        else:
            setattr(model.config, key, before)
    if not switches:
        model.__dict__.pop(SWITCHES, None)


def use_topk_attention(model, top_k: int = DEFAULT_TOP_K, *, keep_selection: bool = False):
    """Switch every attention layer of `model` to top-k attention with this `top_k`.

    keep_selection: store each layer's last AttentionSelection as `module.gatherlens_selection`
    (see `last_selections(model)`), for pictures. Returns the model.
    """
    from gatherlens.models.attention.requirements import require_attention_layers

    model = unwrap(model)
    require_attention_layers(model, "top-k attention")   # Mamba: one clear error, not a silent no-op
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise GatherTypeError(f"top_k must be a positive int, got {top_k!r} of type {type(top_k).__name__}")
    if top_k < 1:
        raise GatherValueError(f"top_k {top_k} is outside the valid range [1, inf): pick at least one key")
    register()
    switch_attention(model, ATTN_NAME, remember=_DENSE, what="top-k attention")
    set_config(model, _DENSE, "gatherlens_top_k", top_k)
    for m in model.modules():
        if hasattr(m, "config") and m is not model:
            m.gatherlens_top_k = top_k
            m.gatherlens_keep_selection = keep_selection
    return model


def use_dense_attention(model, attn_implementation: str | None = None):
    """Switch `model` back to the attention it had before top-k (SDPA by default). Returns it."""
    model = unwrap(model)
    restore_attention(model, _DENSE, attn_implementation, config_keys=("gatherlens_top_k",))
    for m in model.modules():
        for name in ("gatherlens_top_k", "gatherlens_keep_selection", "gatherlens_selection"):
            if name in m.__dict__:
                delattr(m, name)
    return model


@contextlib.contextmanager
def attention_restored(model):
    """The block may switch attention freely; afterwards the model's attention is what it was before.

        >>> with attention_restored(lm.model) as model:
        ...     use_topk_attention(model, 8); model(ids); use_dense_attention(model, "sdpa"); model(ids)

    The one switch-and-restore: the attention implementation, and the top-k it ran with (a model
    that was on top-k attention gets it back with its k; any other gets its implementation back).
    """
    model = unwrap(model)
    before = attn_implementation(model)
    before_k = getattr(model.config, "gatherlens_top_k", None)
    try:
        yield model
    finally:
        if before == ATTN_NAME and before_k is not None:
            use_topk_attention(model, before_k)
        else:
            use_dense_attention(model, before)


@contextlib.contextmanager
def topk_attention_enabled(model, top_k: int, **kw):
    """`with topk_attention_enabled(model, 32): ...` then back to the previous attention."""
    with attention_restored(model) as model:
        use_topk_attention(model, top_k, **kw)
        yield model


def last_selections(model) -> dict[str, object]:
    """module path -> the AttentionSelection its last call made (needs keep_selection=True)."""
    model = unwrap(model)
    return {name: m.gatherlens_selection for name, m in model.named_modules()
            if "gatherlens_selection" in m.__dict__}


@contextlib.contextmanager
def observe_attention(observer: Callable[[AttentionCall], None]):
    """Call `observer(call)` for every top-k attention call inside the block."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
