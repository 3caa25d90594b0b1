"""A quantized Llama-family model's whole decode step as one native operator (ops/layer's decode_stack).

    >>> install_stack(model)      # use_sparse_decoding does this where it can run; generate is unchanged
    >>> stack_active(model)       # True while one-token steps over a SparseKVCache take it
    >>> remove_stack(model)       # use_dense_decoding does this

The lean step (models/runtime/step.py) made each layer ~12 operator calls; what was left of a one-token step
was Python: ~12 calls a layer plus the model's own forward around them (~150 us a layer, 30 layers).
Here the causal LM's forward, for a one-token step of batch 1 over a SparseKVCache, is: the
embedding row and the rotary angles (the model's own modules), then every layer, the final norm and
the head inside `gatherlens::decode_stack`, which calls the same operators the lean step calls, in
the same order, from C++. The logits equal the lean path's up to the final norm's rounding (the
layers are bit-equal, tested). Anything else (prefill, batch > 1, padding, a layer kind or product
the operator lacks, observers or kept selections that want each layer's PageSelection) runs the
model's own forward, with the lean step in its layers.

It runs where every decoder layer is Llama-shaped (decode_step.supports_lean_step) and every product
is a bias-free QuantizedLinear on the "q8act" route (its blocks multiplied as stored by a kernel of
`q8act.KERNEL_OF`), the head too.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from gatherlens.models.runtime.step import supports_lean_step
from gatherlens.models.attention.features import global_rank
from gatherlens.models.hf_adapter import causal_lm_output, decoder_layers, replace_forward, restore_forward
from gatherlens.models.attention.sparse import metered, metering, observed, sparse_settings
from gatherlens.models.attention.cache import SparseKVCache
from gatherlens.ops.layer.stack import Product, StackCaches, StackWeights, decode_stack, stack_fits
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.decode import choice_of_config
from gatherlens.ops.sparse.fused_decode import native_cache_fits

__all__ = ["stack_weights", "install_stack", "remove_stack", "stack_active"]

_STACK = "gatherlens_decode_stack"  # the model's Stack while installed
ANGLES = 256  # positions of rotary angles made at once (the model's own rotary module), then read a row a step


@dataclass
class Stack:
    """What a model's one-operator step reads, made at install: the weights, each layer's rank among
    the global layers (what `SparseConfig.dense_layers` counts) and the logit scale; and what steps keep
    from one to the next: the last cache's StackCaches (held weakly), which ranks decode densely under
    the current SparseConfig, and a window of rotary angles (ANGLES positions from `first`)."""

    weights: StackWeights
    ranks: tuple
    scale: float
    last: tuple = (None, None)      # (weakref to a SparseKVCache, its StackCaches)
    dense: tuple = (None, ())       # (SparseConfig, per layer: dense_at(rank))
    angles: tuple = (-1, None, None)  # (first position, cos (ANGLES, D), sin (ANGLES, D))


def _product(lin) -> Product | None:
    """A bias-free q8act QuantizedLinear's blocks (its panels where the route packed them) as a Product, else None."""
    weight = lin.__dict__.get("qweight") if lin is not None else None
    if weight is None or weight.route != "q8act" or getattr(lin, "bias", None) is not None:
        return None
    return Product(weight.tensors[0], weight.qtype, panels=True) if weight.tensors else Product(weight.raw, weight.qtype)


def _group(parent, fused: str, names: tuple[str, ...]) -> tuple | None:
    """A group's products: (the packed one, None, ...) where the model packed them, else one each."""
    packed = getattr(parent, fused, None)
    if packed is not None:
        p = _product(packed)
        return None if p is None else (p,) + (None,) * (len(names) - 1)
    parts = tuple(_product(getattr(parent, n, None)) for n in names)
    return None if any(p is None for p in parts) else parts


def _layer_products(layer) -> tuple | None:
    attn, mlp = layer.self_attn, layer.mlp
    qkv = _group(attn, "qkv_proj", ("q_proj", "k_proj", "v_proj"))
    gate_up = _group(mlp, "gate_up_proj", ("gate_proj", "up_proj"))
    o, down = _product(attn.o_proj), _product(mlp.down_proj)
    if qkv is None or gate_up is None or o is None or down is None:
        return None
    return qkv + (o,) + gate_up + (down,)


def stack_weights(model) -> StackWeights | None:
    """The StackWeights of a causal LM the operator can run (see the module doc), else None."""
    layers, inner = decoder_layers(model), getattr(model, "model", None)
    head, norm = getattr(model, "lm_head", None), getattr(inner, "norm", None)
    if not layers or not all(supports_lean_step(layer) for layer in layers) or not hasattr(norm, "variance_epsilon"):
        return None
    products = [_layer_products(layer) for layer in layers]
    head_product = _product(head)
    if any(p is None for p in products) or head_product is None:
        return None
    norms = [t for layer in layers for t in (layer.input_layernorm, layer.post_attention_layernorm)]
    weights = StackWeights(layers[0].self_attn.config.num_attention_heads, tuple(n.weight.detach() for n in norms),
                           tuple(float(n.variance_epsilon) for n in norms), tuple(products), norm.weight.detach(),
                           float(norm.variance_epsilon), head_product)
    return weights if stack_fits(weights) is None else None


def install_stack(model) -> bool:
    """Give the model the one-operator decode step where it can run; False where it cannot."""
    weights = stack_weights(model)
    if weights is None:
        return False
    layers = decoder_layers(model)
    model.__dict__[_STACK] = Stack(weights, tuple(global_rank(layer.self_attn) for layer in layers),
                                   float(layers[0].self_attn.scaling))
    replace_forward(model, stack_forward)
    return True


def remove_stack(model) -> None:
    """The model's class forward back."""
    if model.__dict__.pop(_STACK, None) is not None:
        restore_forward(model)


def stack_active(model) -> bool:
    return _STACK in model.__dict__


def _view(stack: Stack, cache) -> StackCaches | None:
    """The StackCaches of `cache` when every layer is paged, batch 1, equally long and read natively
    (checked when a view is made; kept while current), else None."""
    if not isinstance(cache, SparseKVCache) or len(cache.layers) != len(stack.ranks):
        return None
    caches = [getattr(layer, "paged", None) for layer in cache.layers]
    ref, old = stack.last
    if ref is not None and ref() is cache and old.caches == caches:
        view = StackCaches.of(caches, old)
        if view is old:
            return view
    if any(not isinstance(c, PagedKVCache) or c.batch != 1 or c.length != caches[0].length or native_cache_fits(c)
           for c in caches):
        return None
    view = StackCaches.of(caches)
    stack.last = (weakref.ref(cache), view)
    return view


def _runs(model, input_ids, kwargs: dict) -> StackCaches | None:
    """The caches of a step the operator runs (see the module doc), else None."""
    if input_ids is None or input_ids.shape != (1, 1) or observed() or kwargs.get("inputs_embeds") is not None:
        return None
    if kwargs.get("output_attentions") or kwargs.get("output_hidden_states") or torch.is_grad_enabled():
        return None
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        return None
    config = sparse_settings(model)
    if config is None or config.keep_selection or config.choose != "bound":  # the operator ranks by the bound only
        return None
    return _view(model.__dict__[_STACK], kwargs.get("cache", kwargs.get("past_key_values")))


def _budgets(stack: Stack, config, length: int) -> list:
    """Each layer's budget for a step over `length` tokens: every one (dense) for the first dense_layers
    ranks, else config.budget_for's."""
    if stack.dense[0] is not config:
        stack.dense = (config, tuple(config.dense_at(rank) for rank in stack.ranks))
    budget = config.budget_for(length)  # a layer not among the dense ones
    return [length if dense else budget for dense in stack.dense[1]]


def _counts(stack: Stack, config, model) -> torch.Tensor:
    """(layers, selection heads) int64 for the operator to fill with the pages each head read."""
    heads = stack.weights.heads if not config.share_selection else model.config.num_key_value_heads
    return torch.empty(len(stack.ranks), heads, dtype=torch.long)


def _angles(stack: Stack, rotary, x: torch.Tensor, position: int) -> tuple:
    """cos, sin (1, D) of `position` from the model's rotary module, ANGLES positions made at a time (the
    same products as one position's: each angle is one inv_freq x position)."""
    first, cos, sin = stack.angles
    if cos is None or not first <= position < first + ANGLES:
        cos, sin = rotary(x, torch.arange(position, position + ANGLES)[None])  # (1, ANGLES, D) x2
        first, cos, sin = position, cos[0], sin[0]
        stack.angles = (first, cos, sin)
    return cos[position - first:position - first + 1], sin[position - first:position - first + 1]  # (1, D) x2


def stack_forward(self, input_ids=None, **kwargs):
    """The causal LM's forward: a one-token step on the operator when it can run, else the class's."""
    view = _runs(self, input_ids, kwargs)
    if view is None:
        return type(self).forward(self, input_ids=input_ids, **kwargs)
    stack, config, inner = self.__dict__[_STACK], sparse_settings(self), self.model
    position = view.caches[0].length
    x = inner.embed_tokens(input_ids)  # (1, 1, d)
    cos, sin = _angles(stack, inner.rotary_emb, x, position)  # (1, D) x2
    budgets, counts = _budgets(stack, config, position + 1), _counts(stack, config, self) if metered() else None
    logits = decode_stack(x.view(1, -1).float(), cos, sin, stack.weights, view, budgets, choice_of_config(config),
                          stack.scale, counts)  # (1, V)
    for layer, row in enumerate(counts if counts is not None else ()):  # (Hsel,) per layer
        metering(layer, row, budgets[layer] < position + 1)
    return causal_lm_output(logits.view(1, 1, -1), kwargs.get("cache", kwargs.get("past_key_values")))
