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

Each layer is the planned loop's own (`planned_layer`, models/runtime/step.py, handed one cache a row),
so each slot's rows go through the same operators as the one-slot step (the C++ stack, the planned loop,
reading the same `DecodePlan`): the products' few-row path is bit-equal to one
row at a time, so a slot's logits equal its solo step's. It needs the model switched to sparse decoding
(`use_sparse_decoding`: the plan installed, the attention modules carrying the config) and every cache
prefilled (its pages made). A model whose plan the planned loop does not run (`step_declarations`) gets
no plan here: its slots step one at a time through the model's forward.
"""
from __future__ import annotations

import torch

from gatherlens.models.attention.cache import SparseKVCache
from gatherlens.models.runtime.step import installed_plan, layer_caches, planned_layer, step_declarations
from gatherlens.ops.attention.variants import capped
from gatherlens.ops.layer import rms_norm_cast
from gatherlens.ops.layer.plan import DecodePlan

__all__ = ["batch_plan", "batched_step"]


def batch_plan(model) -> DecodePlan | None:
    """The model's installed DecodePlan when the planned loop runs its one-token steps, else None."""
    plan = installed_plan(model)
    if plan is None or not plan.layers or plan.head is None or step_declarations(model).get("planned") is not None:
        return None
    return plan


@torch.inference_mode()
def batched_step(model, plan: DecodePlan, tokens: list[int], caches: list[SparseKVCache]) -> torch.Tensor:
    """The logits (N, V) after feeding tokens[i] to sequence i, whose cache is caches[i] (each prefilled;
    the token is appended to it). See the module doc."""
    N = len(tokens)
    ids = torch.tensor(tokens).view(N, 1)  # (N, 1)
    positions = torch.tensor([c.get_seq_length() for c in caches]).view(N, 1)  # (N, 1): each slot its own
    angles = {name: tuple(t.reshape(N, -1).float() for t in table(positions))
              for name, table in plan.angles.items()}  # {table: (N, D) x2}
    x = plan.embed(ids).reshape(N, -1)  # (N, d)
    kvs = [layer_caches(c) for c in caches]  # per slot: its layers' caches
    for layer in plan.layers:  # the planned loop's layer, one cache a row
        x = planned_layer(layer, x, *angles[layer.angles], None, [kv[layer.index] for kv in kvs])  # (N, d)
    h = rms_norm_cast(x, plan.final_norm, plan.final_eps, plan.head.act or x.dtype)  # (N, d)
    return capped(plan.head(h), plan.logit_softcap)  # (N, V)
