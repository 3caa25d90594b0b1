"""What a decoder's attention needs beyond Llama's, and the one rule for what gatherlens supports.

    >>> [k.kind for k in layer_kinds(gemma3_config)][:6]      # one LayerKind per decoder layer
    ['sliding', 'sliding', 'sliding', 'sliding', 'sliding', 'full']
    >>> global_rank(attn_module)                    # this layer's index among the global layers
    >>> attention_extras(attn_module, kwargs)       # (softcap, sinks) the layer's softmax takes
    AttentionExtras(softcap=50.0, sinks=None)
    >>> raise unsupported("layer type 'linear_attention'", "sparse decoding")

Layer kinds come from transformers' own rule (`cache_utils.get_layer_types_and_kwargs`, the one
DynamicCache uses): "full" (global) layers, and "sliding" / "chunked" (local) layers with their
window (Mistral, Qwen2, Gemma 2/3, Cohere 2, GPT-OSS: `sliding_window`; Llama 4:
`attention_chunk_size`). Soft-capping (Gemma 2: `softcap` / `attn_logit_softcapping`) and sinks
(GPT-OSS: `s_aux` / `module.sinks`) come from the attention call's kwargs, else the module.
Anything else is refused with `unsupported(feature, where)`: one message naming the feature.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from gatherlens.errors import GatherValueError

__all__ = ["LayerKind", "AttentionExtras", "LOCAL_TYPES", "layer_kinds", "module_kind", "global_rank",
           "attention_extras", "unsupported"]

LOCAL_TYPES = {"sliding_attention": "sliding", "chunked_attention": "chunked"}  # transformers' name -> ours
UNSUPPORTED_KWARGS = {"position_bias": "an additive position bias (T5 / ALiBi style)"}
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


@dataclass(frozen=True)
class AttentionExtras:
    """The softmax rules of one attention call beyond scale and mask (None: not used)."""

    softcap: float | None = None
    sinks: torch.Tensor | None = None  # (Hq,) logits that join every softmax


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
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, per_layer = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
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

    Equals `layer_idx` when every layer is global; None for a module without a layer index.
    """
    config, layer = getattr(module, "config", None), getattr(module, "layer_idx", None)
    if not isinstance(layer, int) or config is None or not hasattr(config, "get_text_config"):
        return layer
    ranks = _layout(config)[1]
    return ranks[layer] if layer < len(ranks) else layer


def attention_extras(module, kwargs: dict | None = None, where: str = "gatherlens attention") -> AttentionExtras:
    """Soft-capping and sinks of one attention call: its kwargs (transformers' attention interface), else
    the module's own attributes (the lean decode step passes none); refuses what cannot run."""
    kwargs = kwargs or {}
    for name, what in UNSUPPORTED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise unsupported(f"{what} (attention argument {name!r})", where)
    softcap = kwargs["softcap"] if "softcap" in kwargs else getattr(module, "attn_logit_softcapping", None)
    sinks = kwargs["s_aux"] if "s_aux" in kwargs else getattr(module, "sinks", None)
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        raise unsupported(f"attention sinks of type {type(sinks).__name__} (expected a (Hq,) tensor)", where)
    return AttentionExtras(softcap=softcap, sinks=sinks)
