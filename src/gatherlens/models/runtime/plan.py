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
from gatherlens.models.hf_adapter import class_named, decoder_layers
from gatherlens.models.runtime.head import transposed_head
from gatherlens.ops.layer.plan import Blocks, DecodePlan, LayerPlan, Product
from gatherlens.ops.quant.products.linear import linear_product

__all__ = ["plan_model"]

_SILU_CLASSES = ("SiLU", "SiLUActivation")  # torch's or transformers' SiLU module


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
    planned = [_layer_plan(layer, arch.layer, kind.window) for layer, kind in zip(layers, kinds)]
    refusal = next((why for _, why in planned if why is not None), None)
    if refusal is not None:
        return _refused(refusal, asked)
    norm, rotary, layer_plans = inner.norm, inner.rotary_emb, tuple(p for p, _ in planned)
    return DecodePlan(layer_plans, norm.weight.detach(), float(norm.variance_epsilon), _head(model, transposed),
                      inner.embed_tokens, rotary, _embed_scale(inner.embed_tokens), _rope_type(rotary),
                      getattr(model.config, "final_logit_softcapping", None), None, asked,
                      frozenset().union(*(p.variant.used for p in layer_plans)))


def _refused(why: str, asked: str) -> DecodePlan:
    return DecodePlan((), None, 0.0, None, None, None, refusal=why, asked=asked)


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
    if not hasattr(inner.norm, "variance_epsilon"):
        return f"the final norm is a {type(inner.norm).__name__} (the plan reads Llama's RMSNorm: variance_epsilon)"
    if model.get_output_embeddings() is None:
        return f"{name} has no output projection"
    return None


def _layer_plan(layer, shape: LayerShape, window: int | None) -> tuple[LayerPlan | None, str | None]:
    """(the layer's plan, None) or (None, why the walker cannot describe it)."""
    i = getattr(getattr(layer, "self_attn", None), "layer_idx", None)
    why = _parts_refusal(layer, shape)
    if why is not None:
        return None, f"layer {i}: {why}"
    attn, mlp = layer.self_attn, layer.mlp
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    heads, kv_heads, D = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    qkv = _group(attn, "qkv_proj", ("q_proj", "k_proj", "v_proj"), f"layer {i}")
    gate_up = _group(mlp, "gate_up_proj", ("gate_proj", "up_proj"), f"layer {i}")
    o, down = _product(attn.o_proj, f"layer {i} o_proj"), _product(mlp.down_proj, f"layer {i} down_proj")
    dv = getattr(attn.o_proj, "in_features", heads * D) // heads  # the value width (latent attention: another)
    variant = attention_variant(attn, where="the decode plan")
    return LayerPlan(shape, (n1.weight.detach(), n2.weight.detach()), (float(n1.variance_epsilon),
                     float(n2.variance_epsilon)), qkv, o, gate_up, down, (heads * D, kv_heads * D, kv_heads * dv),
                     heads, kv_heads, D, float(attn.scaling), i, global_rank(attn), window, variant, attn, o.act), None


def _parts_refusal(layer, shape: LayerShape) -> str | None:
    """Why this layer's modules are not what its architecture's row says (fail closed), else None."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    for owner, part in ((attn, "o_proj"), (mlp, "down_proj"), (attn, "head_dim"), (attn, "scaling"), (attn, "config")):
        if getattr(owner, part, None) is None:
            return f"it has no {part}"
    if not all(class_named(n, suffix=("RMSNorm",)) and hasattr(n, "variance_epsilon") for n in norms):
        return f"its norms are {type(norms[0]).__name__} (the plan reads Llama's RMSNorm: variance_epsilon)"
    act = getattr(mlp, "act_fn", None)
    if shape.activation == "silu" and not class_named(act, _SILU_CLASSES):
        return f"its MLP's activation is {type(act).__name__} (its architecture's row says silu)"
    bias = getattr(getattr(attn, "q_proj", None), "bias", None) is not None
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
    """One weight's Product: a QuantizedLinear's blocks through `linear_product` (its table picks the row),
    with the C++ stack's Blocks where it is bias-free on the q8act route; a float module through F.linear."""
    weight = lin.__dict__.get("qweight")
    bias = getattr(lin, "bias", None)
    if weight is None:
        return Product(name, functools.partial(_float_linear, lin))
    run = functools.partial(linear_product, weight=weight) if bias is None else functools.partial(_biased, weight, bias)
    blocks = None
    if weight.route == "q8act" and bias is None:
        blocks = Blocks(weight.tensors[0], weight.qtype, panels=True) if weight.tensors else Blocks(weight.raw,
                                                                                                    weight.qtype)
    return Product(name, run, blocks, weight.activation_dtype)


def _float_linear(lin: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, lin.weight, lin.bias)  # (M, N): the module's parameters as they are now


def _biased(weight, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y = linear_product(x, weight)  # (M, N)
    return y + bias.to(y.dtype)  # (M, N): Qwen2's q/k/v biases


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
    return str(getattr(rotary, "rope_type", "default"))
