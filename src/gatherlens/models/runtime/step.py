"""A lean decode step for Llama-family decoder layers over the paged cache.

    >>> install_lean_step(model)        # use_sparse_decoding does this; generate is unchanged
    >>> lean_layers(model)              # how many decoder layers take the lean path
    >>> remove_lean_step(model)         # use_dense_decoding does this

A decode step of transformers' `LlamaDecoderLayer` runs ~80 small torch calls through five module
calls (two RMSNorms, attention, MLP, the layer), keyword plumbing and the attention interface.
At one token per step the weights' matmuls are fixed; what is left is that overhead, 30 layers
a step. The lean step does the same arithmetic with the layer's own parameters in ~10 calls, the
elementwise ones as C++ operators (gatherlens.ops.layer, each beside its torch reference):

    h = rms_norm(x);  q, k, v = h Wq, h Wk, h Wv;  rope_append (RoPE(q, k), k and v into the page)
    out = decode_attention;  x, h = x + out Wo, rms_norm(x + out Wo);  x = x + silu_mul(h Wg|u) Wd

With a quantized model (QuantizedLinear) the norms and SiLU write the dtype its products take
(`QuantizedWeight.activation_dtype`: float32 for the q8act route, bfloat16 for int4), so no product
converts its input again.
It is installed as the forward of each supported decoder layer (same class names and parts as
Llama: input/post-attention RMSNorm, q/k/v/o projections, gate/up/down SiLU MLP, no q/k norms)
and runs only for one-token steps with a `SparseKVCache`; anything else (prefill, training,
another cache, other kwargs) goes to the layer's own forward. Results equal the HF layer's to
float rounding (the sums of the norms run in another order).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from gatherlens.models.hf_adapter import class_named, decoder_layers, forward_replaced, replace_forward, restore_forward
from gatherlens.models.attention.sparse import decode_attention
from gatherlens.models.attention.cache import SparseKVCache
from gatherlens.ops.layer import add_rms_norm_cast, rms_norm_cast, rope_append, silu_mul_cast
from gatherlens.ops.quant.products.linear import linear_product
from gatherlens.ops.sparse.cache import PagedKVCache

__all__ = ["LEAN_LAYER_CLASSES", "install_lean_step", "remove_lean_step", "lean_layers", "supports_lean_step"]

LEAN_LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")
_SILU_CLASSES = ("SiLU", "SiLUActivation")  # torch's or HF's
_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
          "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def supports_lean_step(layer: torch.nn.Module) -> bool:
    """True for a Llama-shaped decoder layer the lean step computes exactly (see module doc)."""
    if not class_named(layer, LEAN_LAYER_CLASSES):
        return False
    try:
        parts = [layer.get_submodule(p) for p in _PARTS]
    except AttributeError:
        return False
    attn = layer.self_attn
    plain_norms = all(class_named(n, suffix=("RMSNorm",)) and hasattr(n, "variance_epsilon") for n in parts[:2])
    no_qk_norm = not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")
    silu = class_named(getattr(layer.mlp, "act_fn", None), _SILU_CLASSES)
    return plain_norms and no_qk_norm and silu and all(hasattr(attn, a) for a in ("head_dim", "scaling", "layer_idx"))


def install_lean_step(model) -> int:
    """Give every supported decoder layer the lean decode step; returns how many took it."""
    count = 0
    for layer in decoder_layers(model):
        if supports_lean_step(layer):
            replace_forward(layer, lean_forward)
            layer.__dict__[_PLAN] = lean_plan(layer)
            count += 1
    return count


def remove_lean_step(model) -> None:
    """Give every decoder layer its class's forward back."""
    for layer in decoder_layers(model):
        restore_forward(layer)
        layer.__dict__.pop(_PLAN, None)


def lean_layers(model) -> int:
    """How many decoder layers run the lean decode step."""
    return sum(1 for layer in decoder_layers(model) if forward_replaced(layer))


def lean_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                 position_embeddings=None, **kwargs):
    """A decoder layer's forward: the lean step for one-token steps over a SparseKVCache."""
    cache = cache if cache is not None else kwargs.pop("past_key_values", None)
    lean = (hidden_states.shape[1] == 1 and isinstance(cache, SparseKVCache) and position_embeddings is not None
            and not (self.training and torch.is_grad_enabled()) and not kwargs.get("output_attentions")
            and isinstance(_paged(cache, self.self_attn.layer_idx), PagedKVCache))
    if not lean:
        return type(self).forward(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                  cache=cache, use_cache=use_cache, position_embeddings=position_embeddings,
                                  **kwargs)
    plan = self.__dict__.get(_PLAN)
    if plan is None:  # a forward replaced without install_lean_step: the reference, as it was
        return lean_step(self, hidden_states, position_embeddings, attention_mask, cache)
    return planned_step(plan, hidden_states, position_embeddings, attention_mask, cache)


def lean_step(layer, x: torch.Tensor, position_embeddings, attention_mask, cache: SparseKVCache) -> torch.Tensor:
    """x (B, 1, d) -> (B, 1, d): one decoder layer, one token, appending its keys to `cache`."""
    attn, mlp = layer.self_attn, layer.mlp
    B, D, d = x.shape[0], attn.head_dim, x.shape[-1]
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    act = _activation_dtype(attn.o_proj, x.dtype)  # what the products take: bf16 for int4 blocks
    paged = _paged(cache, attn.layer_idx)  # this layer's PagedKVCache
    h = rms_norm_cast(x.view(B, d), n1.weight, n1.variance_epsilon, act)  # (B, d)
    q, k, v = _qkv(h, attn)  # (B, Hq*D), (B, Hkv*D) x2
    cos, sin = (t.reshape(B, D) for t in position_embeddings)  # (B, D): this token's angles
    q = rope_append(q, k, v, cos, sin, paged)  # (B, Hq, D); RoPE(k) and v now in the paged cache
    out = decode_attention(attn, q.unsqueeze(2).to(x.dtype), paged, attention_mask, attn.scaling)  # (B, Hq, 1, D)
    y = _linear(out.reshape(B, -1).to(act), attn.o_proj)  # (B, d)
    s, h = add_rms_norm_cast(x.view(B, d), y, n2.weight, n2.variance_epsilon, act)  # (B, d) x2: x + attn, norm
    y = _linear(_gate_up(h, mlp, act), mlp.down_proj)  # (B, d)
    return (s.to(x.dtype) + y).view(B, 1, d)  # (B, 1, d)


def _paged(cache: SparseKVCache, layer_idx: int):
    """The layer's PagedKVCache once the prefill made it (None before, or for a layer kept otherwise)."""
    layers = cache.layers
    return getattr(layers[layer_idx], "paged", None) if layer_idx < len(layers) else None


def _activation_dtype(lin: torch.nn.Module, dtype: torch.dtype) -> torch.dtype:
    """bfloat16 for a QuantizedLinear whose route computes in it (no conversion inside), else the
    model's dtype."""
    weight = lin.__dict__.get("qweight")
    return dtype if weight is None else weight.activation_dtype


def _qkv(h: torch.Tensor, attn) -> tuple[torch.Tensor, ...]:
    """q, k, v of h (B, d): one fused product where the model packed q|k|v as one weight
    (a quantized model's `qkv_proj`), else three."""
    fused = getattr(attn, "qkv_proj", None)
    if fused is None:
        return _linear(h, attn.q_proj), _linear(h, attn.k_proj), _linear(h, attn.v_proj)
    sizes = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)
    return _linear(h, fused).split(sizes, dim=-1)  # (B, Hq*D), (B, Hkv*D) x2


def _gate_up(h: torch.Tensor, mlp, act: torch.dtype) -> torch.Tensor:
    """silu(h Wg) * (h Wu) for h (B, d), as `act`: one fused product where the model packed gate|up."""
    fused = getattr(mlp, "gate_up_proj", None)
    if fused is None:
        return (F.silu(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj)).to(act)  # (B, I)
    return silu_mul_cast(_linear(h, fused), act)  # (B, I)


def _linear(x: torch.Tensor, lin: torch.nn.Module) -> torch.Tensor:
    """lin(x) for x (B, K) without the module call (its hooks and dispatch): F.linear on its own
    parameters, or a QuantizedLinear's product from its blocks through the product's one entrance
    (`linear_product`: its table picks q8act / packed / dequant; checks done at load)."""
    weight = lin.__dict__.get("qweight")
    if weight is None:
        return F.linear(x, lin.weight, lin.bias)
    y = linear_product(x, weight)  # (B, N)
    return y if lin.bias is None else y + lin.bias.to(y.dtype)  # (B, N): Qwen2's q/k/v biases


# -- the planned step: lean_step with every lookup made once, at install_lean_step --------------------
_PLAN = "gatherlens_lean_plan"  # a layer's LeanPlan, in its __dict__ while the lean step is installed


@dataclass(frozen=True)
class LeanPlan:
    """What one layer's lean step reads, looked up once when the lean step is installed (a decode step
    otherwise makes ~20 module attribute lookups a layer): norms, products, sizes.

        >>> planned_step(lean_plan(layer), x, position_embeddings, None, cache)   # == lean_step(layer, ...)

    act: the dtype the products take (QuantizedWeight.activation_dtype), None: x's dtype. The
    products are `_linear` of the layer's modules (a bias-free QuantizedLinear: `linear_product` on its
    weight directly, the same call); a parameter or module replaced later is seen at the next
    use_sparse_decoding (which installs the step again).
    """

    norm1: torch.Tensor
    eps1: float
    norm2: torch.Tensor
    eps2: float
    act: torch.dtype | None
    qkv: Callable       # h (B, d) -> q (B, Hq*D), k, v (B, Hkv*D)
    o: Callable         # (B, Hq*Dv) -> (B, d)
    gate_up: Callable   # h (B, d), act -> silu(h Wg) * (h Wu) (B, I) as act
    down: Callable      # (B, I) -> (B, d)
    attn: torch.nn.Module
    head_dim: int
    layer_idx: int
    scaling: float


def lean_plan(layer) -> LeanPlan:
    """The LeanPlan of a layer that supports_lean_step."""
    attn, mlp = layer.self_attn, layer.mlp
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    quantized = attn.o_proj.__dict__.get("qweight")
    return LeanPlan(n1.weight, n1.variance_epsilon, n2.weight, n2.variance_epsilon,
                    None if quantized is None else quantized.activation_dtype, _qkv_product(attn),
                    _product(attn.o_proj), _gate_up_product(mlp), _product(mlp.down_proj), attn, attn.head_dim,
                    attn.layer_idx, attn.scaling)


def _product(lin: torch.nn.Module) -> Callable:
    """x -> _linear(x, lin); for a bias-free QuantizedLinear, its one entrance on the weight directly."""
    weight = lin.__dict__.get("qweight")
    if weight is not None and lin.__dict__.get("bias", True) is None:
        return functools.partial(linear_product, weight=weight)
    return functools.partial(_linear, lin=lin)


def _qkv_product(attn) -> Callable:
    """_qkv's products as one callable (the fused qkv_proj where the model packed it)."""
    fused = getattr(attn, "qkv_proj", None)
    if fused is None:
        q, k, v = _product(attn.q_proj), _product(attn.k_proj), _product(attn.v_proj)
        return lambda h: (q(h), k(h), v(h))
    sizes, product = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features), _product(fused)
    return lambda h: product(h).split(sizes, dim=-1)  # (B, Hq*D), (B, Hkv*D) x2


def _gate_up_product(mlp) -> Callable:
    """_gate_up's products as one callable (h, act) -> (B, I)."""
    fused = getattr(mlp, "gate_up_proj", None)
    if fused is None:
        gate, up = _product(mlp.gate_proj), _product(mlp.up_proj)
        return lambda h, act: (F.silu(gate(h)) * up(h)).to(act)  # (B, I)
    product = _product(fused)
    return lambda h, act: silu_mul_cast(product(h), act)  # (B, I)


def planned_step(plan: LeanPlan, x: torch.Tensor, position_embeddings, attention_mask,
                 cache: SparseKVCache) -> torch.Tensor:
    """lean_step's arithmetic from the layer's LeanPlan: x (B, 1, d) -> (B, 1, d), the same calls on
    the same tensors (bit-equal, tested), fewer Python lookups and no conversion to a dtype x has."""
    B, d = x.shape[0], x.shape[-1]
    act = plan.act or x.dtype
    paged = _paged(cache, plan.layer_idx)  # this layer's PagedKVCache
    x2 = x.view(B, d)  # (B, d)
    h = rms_norm_cast(x2, plan.norm1, plan.eps1, act)  # (B, d)
    q, k, v = plan.qkv(h)  # (B, Hq*D), (B, Hkv*D) x2
    cos, sin = (t.reshape(B, plan.head_dim) for t in position_embeddings)  # (B, D)
    q = rope_append(q, k, v, cos, sin, paged).unsqueeze(2)  # (B, Hq, 1, D); RoPE(k), v in the cache
    out = decode_attention(plan.attn, _as(q, x.dtype), paged, attention_mask, plan.scaling)  # (B, Hq, 1, Dv)
    y = plan.o(_as(out.reshape(B, -1), act))  # (B, d)
    s, h = add_rms_norm_cast(x2, y, plan.norm2, plan.eps2, act)  # (B, d) x2: x + attn, its norm
    y = plan.down(plan.gate_up(h, act))  # (B, d)
    return (_as(s, x.dtype) + y).view(B, 1, d)  # (B, 1, d)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)
