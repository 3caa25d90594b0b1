"""What a decoder's attention needs beyond Llama's, and the one rule for what gatherlens supports.

    >>> [k.kind for k in layer_kinds(gemma3_config)][:6]      # one LayerKind per decoder layer
    ['sliding', 'sliding', 'sliding', 'sliding', 'sliding', 'full']
    >>> global_rank(attn_module)                    # this layer's index among the global layers
    >>> attention_variant(attn_module, kwargs)      # soft-capping, sinks, window: one object, made once
    AttentionVariant(softcap=50.0, sinks=None, window=None)
    >>> raise unsupported("layer type 'linear_attention'", "sparse decoding")

Layer kinds come from transformers' own rule (`cache_utils.get_layer_types_and_kwargs`, the one
DynamicCache uses): "full" (global) layers, and "sliding" / "chunked" (local) layers with their
window (Mistral, Qwen2, Gemma 2/3, Cohere 2, GPT-OSS: `sliding_window`; Llama 4:
`attention_chunk_size`). Soft-capping (Gemma 2: `softcap` / `attn_logit_softcapping`) and sinks
(GPT-OSS: `s_aux` / `module.sinks`) come from the attention call's kwargs, else the module; with the
layer's window they make its `AttentionVariant` (ops/attention/variants.py), built once per module
and passed down into the ops as one argument (`variant=`).
Anything else is refused with `unsupported(feature, where)`: one message naming the feature.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.hf_adapter import layer_types
from gatherlens.ops.attention.checks import check_softcap
from gatherlens.ops.attention.variants import PLAIN, AttentionVariant
from gatherlens.ops.layer.plan import LayerHandle

__all__ = ["LayerKind", "AttentionVariant", "LOCAL_TYPES", "VARIANT_ATTR", "layer_kinds", "module_kind",
           "global_rank", "attention_variant", "unsupported"]

LOCAL_TYPES = {"sliding_attention": "sliding", "chunked_attention": "chunked"}  # transformers' name -> ours
UNSUPPORTED_KWARGS = {"position_bias": "an additive position bias (T5 / ALiBi style)"}
VARIANT_ATTR = "gatherlens_variant"  # where attention_variant keeps a module's variant (made once)
_layouts: dict[int, tuple] = {}  # id(config) -> (its weak reference, its kinds, each layer's global rank)


@dataclass(frozen=True)
class LayerKind:
    """One decoder layer's attention: "full" (global), "sliding" or "chunked" (local, `window` tokens)."""

    kind: str = "full"
    window: int | None = None

    @property
    def local(self) -> bool:
        return self.kind != "full"


_FULL = LayerKind()  # a global layer


def unsupported(feature: str, where: str) -> GatherValueError:
    """The one error for a feature gatherlens cannot run (raise it): names the feature and the place."""
    return GatherValueError(f"{feature} is not supported by {where}; the README's 'Architectures' section "
                            f"lists what is (full, sliding-window and chunked layers, soft-capping, sinks, "
                            f"keys and values of different widths)")


def layer_kinds(config, where: str = "sparse decoding") -> tuple[LayerKind, ...]:
    """One LayerKind per decoder layer of a model config (a clear error for any other layer type)."""
    return _layout(config, where)[0]


def _layout(config, where: str = "sparse decoding") -> tuple[tuple[LayerKind, ...], tuple[int, ...]]:
    """(kinds, global ranks) of a config's decoder layers, worked out once per config object."""
    held = _layouts.get(id(config))
    if held is not None and held[0]() is config:
        return held[1], held[2]
    types, per_layer = layer_types(config.get_text_config(decoder=True))
    kinds = []
    for i, (name, kw) in enumerate(zip(types, per_layer)):
        if name == "full_attention":
            kinds.append(_FULL)
        elif name in LOCAL_TYPES:
            kinds.append(LayerKind(LOCAL_TYPES[name], int(kw["sliding_window"])))
        else:
            raise unsupported(f"layer type {name!r} (layer {i} of {type(config).__name__})", where)
    ranks = tuple(sum(1 for k in kinds[:i] if not k.local) for i in range(len(kinds)))
    _layouts[id(config)] = (weakref.ref(config), tuple(kinds), ranks)
    return tuple(kinds), ranks


def module_kind(module) -> LayerKind:
    """The LayerKind of an attention module (by its config and layer_idx); "full" when it has neither."""
    config, layer = getattr(module, "config", None), getattr(module, "layer_idx", None)
    if config is None or not isinstance(layer, int) or not hasattr(config, "get_text_config"):
        return _FULL
    kinds = layer_kinds(config)
    return kinds[layer] if layer < len(kinds) else _FULL


def global_rank(module) -> int | None:
    """The module's index among the model's global (full-attention) layers: what `dense_layers` counts.

    Equals `layer_idx` when every layer is global; None for a module without a layer index. A LayerHandle
    states it.
    """
    if isinstance(module, LayerHandle):
        return module.rank
    config, layer = getattr(module, "config", None), getattr(module, "layer_idx", None)
    if not isinstance(layer, int) or config is None or not hasattr(config, "get_text_config"):
        return layer
    ranks = _layout(config)[1]
    return ranks[layer] if layer < len(ranks) else layer


def attention_variant(module, kwargs: dict | None = None, where: str = "gatherlens attention") -> AttentionVariant:
    """The AttentionVariant of one attention call: soft-capping and sinks from its kwargs
    (transformers' attention interface), else the module's own attributes (the planned decode step passes
    none), and the module's window; refuses what cannot run. Made once per module and kept on it
    (`VARIANT_ATTR`): a later call reuses it while the kwargs agree (a decode step asks every layer)."""
    if kwargs:
        for name, what in UNSUPPORTED_KWARGS.items():
            if kwargs.get(name) is not None:
                raise unsupported(f"{what} (attention argument {name!r})", where)
    held = module.__dict__.get(VARIANT_ATTR)
    if held is not None and _agrees(held, kwargs):
        return held
    kwargs = kwargs or {}
    softcap = kwargs["softcap"] if "softcap" in kwargs else getattr(module, "attn_logit_softcapping", None)
    sinks = kwargs["s_aux"] if "s_aux" in kwargs else getattr(module, "sinks", None)
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        raise unsupported(f"attention sinks of type {type(sinks).__name__} (expected a (Hq,) tensor)", where)
    window = module_kind(module).window
    softcap = check_softcap(softcap)
    variant = PLAIN if softcap is None and sinks is None and window is None else AttentionVariant(softcap, sinks, window)
    module.__dict__[VARIANT_ATTR] = variant
    return variant


def _agrees(held: AttentionVariant, kwargs: dict | None) -> bool:
    """True when a call's kwargs name the same softcap and sinks as the kept variant (or none)."""
    if not kwargs:
        return True
    return kwargs.get("softcap", held.softcap) == held.softcap and kwargs.get("s_aux", held.sinks) is held.sinks
