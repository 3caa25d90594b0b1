"""One decode step for several sequences, each over its own paged cache: the weights read once for all.

    >>> plan = batch_plan(model)                       # None unless every layer is Llama-shaped
    >>> logits = batched_step(model, plan, [t0, t1, t2], [cache0, cache1, cache2])   # (3, V)

A server's slots each hold a sequence of its own length in its own `SparseKVCache` (batch 1). Decoding
them one after the other reads every weight once per slot; here the products take the slots' rows
together ((N, d) in one `linear_product` call: the quantized kernels meet each weight block once for
all N rows), while what belongs to one sequence runs per slot on that slot's cache: RoPE at its own
position and the append (`rope_append`), attention over its own pages (`decode_attention`, sparse
or dense as the model is switched). Per layer:

    h = rms_norm(x)  (N, d);  q, k, v = h Wq|k|v  (N rows at once)
    for each slot i: rope_append(q_i, k_i, v_i, cos_i, sin_i, pages_i); out_i = decode_attention(q_i, pages_i)
    x, h = x + out Wo, rms_norm(.)  (N rows);  x = x + silu(h Wg) * (h Wu) Wd  (N rows)

Each slot's rows go through the same operators as the one-slot step (`decode_stack`, the lean step): the
products' few-row path is bit-equal to one row at a time, so a slot's logits equal its solo step's.
It needs the model switched to sparse decoding (`use_sparse_decoding`: the attention modules carry the
config) and every cache prefilled (its pages made). A model whose decoder layers are not Llama-shaped
(`supports_lean_step`) gets no plan: its slots step one at a time through the model's forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gatherlens.models.attention.cache import SparseKVCache
from gatherlens.models.attention.features import attention_variant, global_rank
from gatherlens.models.attention.sparse import decode_attention, observed, sparse_settings
from gatherlens.models.hf_adapter import decoder_layers
from gatherlens.models.runtime.step import supports_lean_step
from gatherlens.ops.layer import add_rms_norm_cast, rms_norm_cast, rope_append, silu_mul_cast
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.decode import choice_of_config, decode_pages

__all__ = ["BatchPlan", "batch_plan", "batched_step"]


@dataclass(frozen=True)
class BatchPlan:
    """The model's parts a batched step reads, looked up once: the embedding, the rotary module, each
    layer's modules, the final norm and the head."""

    embed: torch.nn.Module
    rotary: torch.nn.Module
    layers: tuple
    norm: torch.nn.Module
    head: torch.nn.Module


def batch_plan(model) -> BatchPlan | None:
    """The plan of a causal LM whose decoder layers all take the lean step (Llama, Mistral, Qwen2), else None."""
    inner = getattr(model, "model", None)
    layers = decoder_layers(model)
    parts = [getattr(inner, name, None) for name in ("embed_tokens", "rotary_emb", "norm")]
    head = getattr(model, "lm_head", None)
    if not layers or any(p is None for p in parts) or head is None or not all(map(supports_lean_step, layers)):
        return None
    if not hasattr(parts[2], "variance_epsilon"):   # the final norm is a plain RMSNorm, as the layers' are
        return None
    return BatchPlan(parts[0], parts[1], tuple(layers), parts[2], head)


def _act(lin: torch.nn.Module, dtype: torch.dtype) -> torch.dtype:
    """The dtype a product takes: a quantized weight's activation dtype (float32 q8act, bfloat16 int4), else x's."""
    weight = getattr(lin, "qweight", None)
    return dtype if weight is None else weight.activation_dtype


def _qkv(attn, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v of h (N, d): the fused q|k|v product where the model packed one, else three."""
    fused = getattr(attn, "qkv_proj", None)
    if fused is None:
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)  # (N, Hq*D), (N, Hkv*D) x2
    sizes = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)
    return fused(h).split(sizes, dim=-1)  # (N, Hq*D), (N, Hkv*D) x2


def _mlp(mlp, h: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """down(silu(h Wg) * (h Wu)) for h (N, d): the fused gate|up product where the model packed one."""
    fused = getattr(mlp, "gate_up_proj", None)
    gated = silu_mul_cast(fused(h), act) if fused is not None else (F.silu(mlp.gate_proj(h)) * mlp.up_proj(h)).to(act)
    return mlp.down_proj(gated)  # (N, d)


def _attention(attn, q: torch.Tensor, paged) -> torch.Tensor:
    """One slot's attention, q (1, Hq, 1, D) -> (1, Hq, 1, Dv): sparse decode's one entrance (`decode_pages`) with
    the layer's budget for this slot's length, as the one-slot operator calls it; `decode_attention` (its
    checks, its observers) where a selection is kept or observed, or the layer is not paged."""
    config = sparse_settings(attn)
    if config is None or config.keep_selection or observed() or not isinstance(paged, PagedKVCache):
        return decode_attention(attn, q, paged, None, attn.scaling)
    variant = attention_variant(attn, where="gatherlens_sparse attention")  # made once, kept on the module
    budget = config.budget_for(paged.length, global_rank(attn))
    return decode_pages(q, paged, budget, choice_of_config(config), attn.scaling, variant)[2]


def _attend(attn, q, k, v, cos, sin, pages: list, dtype: torch.dtype) -> torch.Tensor:
    """Each slot's RoPE, append and attention over its own pages: q (N, Hq*D) -> out (N, Hq*Dv)."""
    outs = []
    for i, paged in enumerate(pages):
        qi = rope_append(q[i:i + 1], k[i:i + 1], v[i:i + 1], cos[i:i + 1], sin[i:i + 1], paged)  # (1, Hq, D)
        qi = qi.unsqueeze(2) if qi.dtype == paged.dtype else qi.unsqueeze(2).to(paged.dtype)  # (1, Hq, 1, D)
        out = _attention(attn, qi, paged)  # (1, Hq, 1, Dv)
        outs.append(out if out.dtype == dtype else out.to(dtype))
    return torch.cat(outs).reshape(len(pages), -1)  # (N, Hq*Dv)


def _layer(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pages: list) -> torch.Tensor:
    """One decoder layer for N slots: x (N, d) -> (N, d), each slot's keys appended to its own pages."""
    attn, n1, n2 = layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm
    act = _act(attn.o_proj, x.dtype)
    h = rms_norm_cast(x, n1.weight, n1.variance_epsilon, act)  # (N, d)
    q, k, v = _qkv(attn, h)  # (N, Hq*D), (N, Hkv*D) x2
    out = _attend(attn, q, k, v, cos, sin, pages, x.dtype)  # (N, Hq*Dv)
    y = attn.o_proj(out if out.dtype == act else out.to(act))  # (N, d)
    s, h = add_rms_norm_cast(x, y, n2.weight, n2.variance_epsilon, act)  # (N, d) x2: x + attention, its norm
    y = _mlp(layer.mlp, h, act)  # (N, d)
    return (s if s.dtype == x.dtype else s.to(x.dtype)) + y  # (N, d)


@torch.inference_mode()
def batched_step(model, plan: BatchPlan, tokens: list[int], caches: list[SparseKVCache]) -> torch.Tensor:
    """The logits (N, V) after feeding tokens[i] to sequence i, whose cache is caches[i] (each prefilled;
    the token is appended to it). See the module doc."""
    N = len(tokens)
    device = plan.head.weight.device if hasattr(plan.head, "weight") else torch.device("cpu")
    ids = torch.tensor(tokens, device=device).view(N, 1)  # (N, 1)
    positions = torch.tensor([c.get_seq_length() for c in caches], device=device).view(N, 1)  # (N, 1)
    x = plan.embed(ids)  # (N, 1, d)
    cos, sin = plan.rotary(x, positions)  # (N, 1, D) x2: each slot at its own position
    cos, sin = cos.reshape(N, -1), sin.reshape(N, -1)  # (N, D) x2
    x = x.reshape(N, -1)  # (N, d)
    for layer in plan.layers:
        x = _layer(layer, x, cos, sin, [c.paged(layer.self_attn.layer_idx) for c in caches])
    h = rms_norm_cast(x, plan.norm.weight, plan.norm.variance_epsilon, _act(plan.head, x.dtype))  # (N, d)
    return plan.head(h)  # (N, V)
