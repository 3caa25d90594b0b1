"""The one walker: a causal LM's decode plan (ops/layer/plan.py's `DecodePlan`), read from its modules once.

    >>> plan = plan_model(model)        # use_sparse_decoding does this, through install_step
    >>> plan.layers[0].shape            # LayerShape(): Llama's layer (models/gguf/arch.py's row of the model)
    >>> plan.layers[0].qkv              # (Product('layer 0 qkv_proj'),): q|k|v packed as one weight
    >>> plan.refusal                    # None: every part found; else what the walker could not describe

The layer's shape comes from the architecture table (`arch.of_model`: the row whose causal-LM class the
model is), not from class-name lists: a class without a row gets no shape, and each way of running a
step (models/runtime/step.py) refuses a plan without one. The walker then checks the modules against
the row (fail closed: a Llama whose config asks for another activation, a norm of another kind, a bias
the row does not list), and any disagreement becomes the plan's refusal.

Each weight becomes one `Product`, decided here once: how Python multiplies it (a QuantizedLinear's
`linear_product` on its blocks, an nn.Linear's `F.linear`, the head's transposed copy: head.py), and
the GGUF blocks the C++ stack multiplies where it can (a bias-free weight on the q8act route; its
8-row panels where the route repacked them). Whether q|k|v (gate|up) is one packed weight is decided
here once too (`_group`): the model's packed module where it has one, else one product per part.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from gatherlens.models.attention.features import attention_variant, global_rank, layer_kinds
from gatherlens.models.gguf.arch import LayerShape, of_model
from gatherlens.models.hf_adapter import class_named, decoder_layers, layer_type_names, rotary_angles
from gatherlens.models.runtime.head import transposed_head
from gatherlens.ops.layer.plan import DecodePlan, LayerPlan, Product

__all__ = ["plan_model"]

# the gated MLP's activation a row names (LayerShape.activation) -> the module classes that compute it
_ACTIVATION_CLASSES = {"silu": ("SiLU", "SiLUActivation"), "gelu_tanh": ("GELUTanh", "PytorchGELUTanh")}


def plan_model(model, asked: str = "auto", transposed: bool = True) -> DecodePlan:
    """The DecodePlan of a causal LM (see the module doc); a plan with `refusal` set where the walker
    could not describe it (then only transformers' own forward runs its steps). asked: the fastest row
    its steps may take (use_sparse_decoding's `step`). transposed: a CPU float head multiplies by its
    transposed copy (head.py); False keeps F.linear (bench generate's ablation)."""
    layers, inner = decoder_layers(model), getattr(model, "model", None)
    arch = of_model(type(model).__name__)
    refusal = _model_refusal(model, layers, inner, arch)
    if refusal is not None:
        return _refused(refusal, asked)
    kinds = layer_kinds(model.config, "the decode plan")  # use_sparse_decoding refused any other layer type
    names = layer_type_names(model.config)
    planned = [_layer_plan(layer, arch.layer, kind.window, name) for layer, kind, name in zip(layers, kinds, names)]
    refusal = next((why for _, why in planned if why is not None), None)
    if refusal is not None:
        return _refused(refusal, asked)
    norm, rotary, layer_plans = inner.norm, inner.rotary_emb, tuple(p for p, _ in planned)
    factor, eps = _norm(norm, arch.layer)
    angles = {p.angles: rotary_angles(rotary, p.angles) for p in layer_plans}
    return DecodePlan(layer_plans, factor, eps, _head(model, transposed), inner.embed_tokens, angles,
                      _embed_scale(inner.embed_tokens), _rope_type(rotary),
                      getattr(model.config, "final_logit_softcapping", None), None, asked,
                      frozenset().union(*(p.variant.used for p in layer_plans)))


def _refused(why: str, asked: str) -> DecodePlan:
    return DecodePlan((), None, 0.0, None, None, refusal=why, asked=asked)


def _model_refusal(model, layers, inner, arch) -> str | None:
    """Why the walker cannot describe this model at all (no layers, no final norm, ...), else None."""
    name = type(model).__name__
    if arch is None:
        return f"{name} has no row in the architecture table (models/gguf/arch.py: the layer shape comes from it)"
    if not layers or inner is None:
        return f"{name} has no decoder layers at model.layers"
    for part in ("embed_tokens", "rotary_emb", "norm"):
        if getattr(inner, part, None) is None:
            return f"{name}.model has no {part}"
    if _norm_refusal(inner.norm) is not None:
        return f"the final norm: {_norm_refusal(inner.norm)}"
    if model.get_output_embeddings() is None:
        return f"{name} has no output projection"
    return None


def _layer_plan(layer, shape: LayerShape, window: int | None, kind: str) -> tuple[LayerPlan | None, str | None]:
    """(the layer's plan, None) or (None, why the walker cannot describe it). kind: its layer type's name
    (the key of the rotary angles it reads)."""
    i = getattr(getattr(layer, "self_attn", None), "layer_idx", None)
    why = _parts_refusal(layer, shape)
    if why is not None:
        return None, f"layer {i}: {why}"
    attn, mlp = layer.self_attn, layer.mlp
    (n1, e1), (n2, e2) = _norm(layer.input_layernorm, shape), _norm(_pre_mlp_norm(layer, shape), shape)
    heads, kv_heads, D = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    qkv = _group(attn, "qkv_proj", ("q_proj", "k_proj", "v_proj"), f"layer {i}")
    gate_up = _group(mlp, "gate_up_proj", ("gate_proj", "up_proj"), f"layer {i}")
    o, down = _product(attn.o_proj, f"layer {i} o_proj"), _product(mlp.down_proj, f"layer {i} down_proj")
    dv = getattr(attn.o_proj, "in_features", heads * D) // heads  # the value width (latent attention: another)
    variant = attention_variant(attn, where="the decode plan")
    qk = _pair(attn, ("q_norm", "k_norm"), shape) if shape.qk_norm else (None, (0.0, 0.0))
    sandwich = _pair(layer, ("post_attention_layernorm", "post_feedforward_layernorm"), shape) \
        if shape.sandwich_norms else (None, (0.0, 0.0))
    return LayerPlan(shape, (n1, n2), (e1, e2), qkv, o, gate_up, down, (heads * D, kv_heads * D, kv_heads * dv),
                     heads, kv_heads, D, float(attn.scaling), i, global_rank(attn), window, variant, attn, o.act,
                     qk[0], qk[1][0], sandwich[0], sandwich[1], shape.activation, kind), None


def _pre_mlp_norm(layer, shape: LayerShape):
    """The norm before the MLP: Llama's post_attention_layernorm; Gemma's pre_feedforward_layernorm (its
    post_attention_layernorm is the sandwich norm of the attention's output)."""
    return layer.pre_feedforward_layernorm if shape.sandwich_norms else layer.post_attention_layernorm


def _norm(module, shape: LayerShape) -> tuple[torch.Tensor, float]:
    """(the factor an RMSNorm module multiplies by, its epsilon): its weight, plus the row's offset (Gemma: 1 +
    w, as its RMSNorm computes it)."""
    weight = module.weight.detach().float()  # (d,)
    eps = getattr(module, "variance_epsilon", None)
    return (weight + shape.norm_offset if shape.norm_offset else weight), float(eps if eps is not None else module.eps)


def _pair(owner, names: tuple[str, str], shape: LayerShape) -> tuple[tuple, tuple[float, float]]:
    """((factor, factor), (eps, eps)) of two norms of `owner`."""
    (a, ea), (b, eb) = (_norm(getattr(owner, n), shape) for n in names)
    return (a, b), (ea, eb)


def _norm_refusal(module) -> str | None:
    """Why `module` is not an RMSNorm the plan reads (a weight and Llama's variance_epsilon or Gemma's eps)."""
    if class_named(module, suffix=("RMSNorm",)) and getattr(module, "weight", None) is not None and (
            hasattr(module, "variance_epsilon") or hasattr(module, "eps")):
        return None
    return f"it is a {type(module).__name__} (the plan reads RMSNorms: a weight and its epsilon)"


def _parts_refusal(layer, shape: LayerShape) -> str | None:
    """Why this layer's modules are not what its architecture's row says (fail closed), else None."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    for owner, part in ((attn, "o_proj"), (mlp, "down_proj"), (attn, "head_dim"), (attn, "scaling"), (attn, "config")):
        if getattr(owner, part, None) is None:
            return f"it has no {part}"
    norms = ["input_layernorm", "post_attention_layernorm"] + (
        ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if shape.sandwich_norms else [])
    for name in norms:
        why = _norm_refusal(getattr(layer, name, None))
        if why is not None:
            return f"its {name}: {why}"
    act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    if not class_named(act, _ACTIVATION_CLASSES.get(shape.activation, ())):
        return f"its MLP's activation is {type(act).__name__} (its architecture's row says {shape.activation})"
    bias = getattr(getattr(attn, "q_proj", getattr(attn, "qkv_proj", None)), "bias", None) is not None
    if bias != shape.qkv_bias:
        return f"q_proj {'has' if bias else 'lacks'} a bias (its architecture's row says qkv_bias={shape.qkv_bias})"
    if (hasattr(attn, "q_norm") or hasattr(attn, "k_norm")) != shape.qk_norm:
        return f"its q/k norms do not match its architecture's row (qk_norm={shape.qk_norm})"
    return None


def _group(parent, packed: str, names: tuple[str, ...], where: str) -> tuple[Product, ...]:
    """THE packing decision: the model's packed module (q|k|v as `qkv_proj`, gate|up as `gate_up_proj`)
    where it has one, as (one Product,); else one Product per part."""
    module = getattr(parent, packed, None)
    if module is not None:
        return (_product(module, f"{where} {packed}"),)
    return tuple(_product(getattr(parent, n), f"{where} {n}") for n in names)


def _product(lin, name: str) -> Product:
    """One weight's Product: a QuantizedLinear's through `Product.of_weight` (the one rule: its blocks where
    the C++ stack multiplies them), a float module through F.linear."""
    weight = lin.__dict__.get("qweight")
    if weight is None:
        return Product(name, functools.partial(_float_linear, lin))
    return Product.of_weight(name, weight, getattr(lin, "bias", None))


def _float_linear(lin: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, lin.weight, lin.bias)  # (M, N): the module's parameters as they are now


def _head(model, transposed: bool) -> Product:
    """The output projection's Product: a plain CPU nn.Linear by its transposed copy (head.py), else as
    any other weight."""
    head = model.get_output_embeddings()
    if transposed and type(head) is torch.nn.Linear and head.weight.device.type == "cpu":
        return Product("the head", transposed_head(head))
    return _product(head, "the head")


def _embed_scale(embed) -> float | None:
    """What the embedding module multiplies its rows by (Gemma's scaled embedding), None: nothing."""
    scale = getattr(embed, "embed_scale", None)
    return None if scale is None else float(scale)


def _rope_type(rotary) -> str:
    """The rotary module's kind of angles; a module with one kind per layer type (transformers 5's Gemma 3:
    {"full_attention": ..., "sliding_attention": ...}) gives its kinds, comma-separated and sorted."""
    kind = getattr(rotary, "rope_type", "default")
    return ",".join(sorted(set(map(str, kind.values())))) if isinstance(kind, dict) else str(kind)
