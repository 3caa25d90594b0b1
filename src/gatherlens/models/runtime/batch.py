"""One decode step for several sequences, each over its own paged cache: the weights read once for all.

    >>> plan = batch_plan(model)                       # the installed DecodePlan, None where the planned loop refuses it
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

Each slot's rows go through the same operators as the one-slot step (the C++ stack, the planned loop,
reading the same `DecodePlan`: models/runtime/step.py): the products' few-row path is bit-equal to one
row at a time, so a slot's logits equal its solo step's. It needs the model switched to sparse decoding
(`use_sparse_decoding`: the plan installed, the attention modules carrying the config) and every cache
prefilled (its pages made). A model whose plan the planned loop does not run (`step_declarations`) gets
no plan here: its slots step one at a time through the model's forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.models.attention.cache import SparseKVCache
from gatherlens.models.attention.sparse import decode_attention, observed, sparse_settings
from gatherlens.models.runtime.step import installed_plan, step_declarations
from gatherlens.ops.layer import add_rms_norm_cast, rms_norm_cast, rope_append, silu_mul_cast
from gatherlens.ops.layer.plan import DecodePlan, LayerPlan
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.decode import decode_pages

__all__ = ["batch_plan", "batched_step"]


def batch_plan(model) -> DecodePlan | None:
    """The model's installed DecodePlan when the planned loop runs its one-token steps, else None."""
    plan = installed_plan(model)
    if plan is None or not plan.layers or plan.head is None or step_declarations(model).get("planned") is not None:
        return None
    return plan


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _attention(layer: LayerPlan, q: torch.Tensor, paged) -> torch.Tensor:
    """One slot's attention, q (1, Hq, 1, D) -> (1, Hq, 1, Dv): sparse decode's one entrance (`decode_pages`) with
    the layer's budget for this slot's length, as the one-slot operator calls it; `decode_attention` (its
    checks, its observers) where a selection is kept or observed, or the layer is not paged."""
    config = sparse_settings(layer.attention)
    if config is None or config.keep_selection or observed() or not isinstance(paged, PagedKVCache):
        return decode_attention(layer.attention, q, paged, None, layer.scaling, layer.variant)
    budget = config.budget_for(paged.length, layer.rank)
    return decode_pages(q, paged, budget, config.choice, layer.scaling, layer.variant)[2]


def _attend(layer: LayerPlan, q, k, v, cos, sin, pages: list, dtype: torch.dtype) -> torch.Tensor:
    """Each slot's RoPE, append and attention over its own pages: q (N, Hq*D) -> out (N, Hq*Dv)."""
    outs = []
    for i, paged in enumerate(pages):
        qi = rope_append(q[i:i + 1], k[i:i + 1], v[i:i + 1], cos[i:i + 1], sin[i:i + 1], paged)  # (1, Hq, D)
        out = _attention(layer, _as(qi.unsqueeze(2), dtype), paged)  # (1, Hq, 1, Dv)
        outs.append(_as(out, dtype))
    return torch.cat(outs).reshape(len(pages), -1)  # (N, Hq*Dv)


def _layer(layer: LayerPlan, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pages: list) -> torch.Tensor:
    """One decoder layer for N slots: x (N, d) -> (N, d), each slot's keys appended to its own pages (the
    planned loop's arithmetic, models/runtime/step.planned_layer, with attention per slot)."""
    act = layer.act or x.dtype  # what the products take (bf16 for int4 blocks)
    h = rms_norm_cast(x, layer.norms[0], layer.eps[0], act)  # (N, d)
    if len(layer.qkv) == 1:
        q, k, v = layer.qkv[0](h).split(layer.qkv_sizes, dim=-1)  # (N, Hq*D), (N, Hkv*D), (N, Hkv*Dv)
    else:
        q, k, v = (p(h) for p in layer.qkv)  # (N, Hq*D), (N, Hkv*D), (N, Hkv*Dv)
    out = _attend(layer, q, k, v, cos, sin, pages, x.dtype)  # (N, Hq*Dv)
    y = layer.o(_as(out, act))  # (N, d)
    s, h = add_rms_norm_cast(x, y, layer.norms[1], layer.eps[1], act)  # (N, d) x2: x + attention, its norm
    if len(layer.gate_up) == 1:
        a = silu_mul_cast(layer.gate_up[0](h), act)  # (N, I)
    else:
        a = (F.silu(layer.gate_up[0](h)) * layer.gate_up[1](h)).to(act)  # (N, I)
    return _as(s, x.dtype) + layer.down(a)  # (N, d)


@torch.inference_mode()
def batched_step(model, plan: DecodePlan, tokens: list[int], caches: list[SparseKVCache]) -> torch.Tensor:
    """The logits (N, V) after feeding tokens[i] to sequence i, whose cache is caches[i] (each prefilled;
    the token is appended to it). See the module doc."""
    N = len(tokens)
    ids = torch.tensor(tokens).view(N, 1)  # (N, 1)
    positions = torch.tensor([c.get_seq_length() for c in caches]).view(N, 1)  # (N, 1)
    x = plan.embed(ids)  # (N, 1, d)
    cos, sin = plan.rotary(x, positions)  # (N, 1, D) x2: each slot at its own position
    cos, sin = cos.reshape(N, -1), sin.reshape(N, -1)  # (N, D) x2
    x = x.reshape(N, -1)  # (N, d)
    for layer in plan.layers:
        x = _layer(layer, x, cos, sin, [c.paged(layer.index) for c in caches])
    h = rms_norm_cast(x, plan.final_norm, plan.final_eps, plan.head.act or x.dtype)  # (N, d)
    return plan.head(h)  # (N, V)
