"""A lean decode step for Llama-family decoder layers over the paged cache.

    >>> install_lean_step(model)        # use_sparse_decoding does this; generate is unchanged
    >>> lean_layers(model)              # how many decoder layers take the lean path
    >>> remove_lean_step(model)         # use_dense_decoding does this

A decode step of transformers' `LlamaDecoderLayer` runs ~80 small torch calls through five module
calls (two RMSNorms, attention, MLP, the layer), keyword plumbing and the attention interface.
At one token per step the weights' matmuls are fixed; what is left is that overhead, 30 layers
a step. The lean step does the same arithmetic with the layer's own parameters in ~35 calls:

    h = rms_norm(x);  q, k, v = h Wq, h Wk, h Wv;  RoPE(q, k);  paged append;  decode_attention
    x = x + out Wo;   h = rms_norm(x);  x = x + (silu(h Wg) * (h Wu)) Wd

It is installed as the forward of each supported decoder layer (same class names and parts as
Llama: input/post-attention RMSNorm, q/k/v/o projections, gate/up/down SiLU MLP, no q/k norms)
and runs only for one-token steps with a `SparseKVCache`; anything else (prefill, training,
another cache, other kwargs) goes to the layer's own forward. Results equal the HF layer's to
float rounding (F.rms_norm computes the same normalisation in one call).
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from gatherlens.models.sparse_attention import decode_attention
from gatherlens.models.sparse_cache import SparseKVCache
from gatherlens.ops.quant import quantized_linear

__all__ = ["LEAN_LAYER_CLASSES", "install_lean_step", "remove_lean_step", "lean_layers", "supports_lean_step"]

LEAN_LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")
_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
          "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def supports_lean_step(layer: torch.nn.Module) -> bool:
    """True for a Llama-shaped decoder layer the lean step computes exactly (see module doc)."""
    if type(layer).__name__ not in LEAN_LAYER_CLASSES:
        return False
    try:
        parts = [layer.get_submodule(p) for p in _PARTS]
    except AttributeError:
        return False
    attn = layer.self_attn
    plain_norms = all(type(n).__name__.endswith("RMSNorm") and hasattr(n, "variance_epsilon") for n in parts[:2])
    no_qk_norm = not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")
    silu = type(getattr(layer.mlp, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")  # torch's or HF's
    return plain_norms and no_qk_norm and silu and all(hasattr(attn, a) for a in ("head_dim", "scaling", "layer_idx"))


def _decoder_layers(model) -> list:
    inner = getattr(model, "model", model)
    return list(getattr(inner, "layers", []))


def install_lean_step(model) -> int:
    """Give every supported decoder layer the lean decode step; returns how many took it."""
    count = 0
    for layer in _decoder_layers(model):
        if supports_lean_step(layer):
            layer.forward = types.MethodType(lean_forward, layer)
            count += 1
    return count


def remove_lean_step(model) -> None:
    """Give every decoder layer its class's forward back."""
    for layer in _decoder_layers(model):
        layer.__dict__.pop("forward", None)


def lean_layers(model) -> int:
    """How many decoder layers run the lean decode step."""
    return sum(1 for layer in _decoder_layers(model) if "forward" in layer.__dict__)


def lean_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                 position_embeddings=None, **kwargs):
    """A decoder layer's forward: the lean step for one-token steps over a SparseKVCache."""
    cache = cache if cache is not None else kwargs.pop("past_key_values", None)
    lean = (hidden_states.shape[1] == 1 and isinstance(cache, SparseKVCache) and position_embeddings is not None
            and not (self.training and torch.is_grad_enabled()) and not kwargs.get("output_attentions"))
    if not lean:
        return type(self).forward(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                  cache=cache, use_cache=use_cache, position_embeddings=position_embeddings,
                                  **kwargs)
    return lean_step(self, hidden_states, position_embeddings, attention_mask, cache)


def lean_step(layer, x: torch.Tensor, position_embeddings, attention_mask, cache: SparseKVCache) -> torch.Tensor:
    """x (B, 1, d) -> (B, 1, d): one decoder layer, one token, appending its keys to `cache`."""
    attn, mlp = layer.self_attn, layer.mlp
    B, D = x.shape[0], attn.head_dim
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    h = F.rms_norm(x, x.shape[-1:], n1.weight, n1.variance_epsilon)  # (B, 1, d)
    q, k, v = _qkv(h, attn)  # (B, 1, Hq*D), (B, 1, Hkv*D) x2
    q, k, v = q.view(B, -1, 1, D), k.view(B, -1, 1, D), v.view(B, -1, 1, D)  # (B, H, 1, D): one token
    cos, sin = (t.unsqueeze(1) for t in position_embeddings)  # (B, 1, 1, D)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    paged = cache.layers[attn.layer_idx].append(k, v)  # the layer's PagedKVCache, this token included
    out = decode_attention(attn, q, paged, attention_mask, attn.scaling)  # (B, Hq, 1, D)
    x = x + _linear(out.to(x.dtype).view(B, 1, -1), attn.o_proj)  # (B, 1, d)
    h = F.rms_norm(x, x.shape[-1:], n2.weight, n2.variance_epsilon)  # (B, 1, d)
    return x + _linear(_gate_up(h, mlp), mlp.down_proj)  # (B, 1, d)


def _qkv(h: torch.Tensor, attn) -> tuple[torch.Tensor, ...]:
    """q, k, v of h (B, 1, d): one fused product where the model packed q|k|v as one weight
    (a quantized model's `qkv_proj`), else three."""
    fused = getattr(attn, "qkv_proj", None)
    if fused is None:
        return _linear(h, attn.q_proj), _linear(h, attn.k_proj), _linear(h, attn.v_proj)
    sizes = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)
    return _linear(h, fused).split(sizes, dim=-1)  # (B, 1, Hq*D), (B, 1, Hkv*D) x2


def _gate_up(h: torch.Tensor, mlp) -> torch.Tensor:
    """silu(h Wg) * (h Wu) for h (B, 1, d): one fused product where the model packed gate|up."""
    fused = getattr(mlp, "gate_up_proj", None)
    if fused is None:
        return F.silu(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj)  # (B, 1, I)
    gate, up = _linear(h, fused).chunk(2, dim=-1)  # (B, 1, I) x2
    return F.silu(gate) * up  # (B, 1, I)


def _linear(x: torch.Tensor, lin: torch.nn.Module) -> torch.Tensor:
    """lin(x) without the module call (its hooks and dispatch): F.linear on its own parameters, or
    a QuantizedLinear's product from its packed blocks."""
    weight = lin.__dict__.get("qweight")
    if weight is not None:
        return quantized_linear(x, weight)  # (..., N)
    return F.linear(x, lin.weight, lin.bias)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as transformers' Llama applies it: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (..., D)
    return torch.addcmul(x * cos, rotated, sin)
