"""A prefill chunk through a decode plan: T prompt tokens of one row through every layer, into the cache.

    >>> logits = chunk_forward(plan, ids, kvs, keep=1)     # ids (1, T); kvs: each layer's PagedKVCache / WindowRing
    >>> logits.shape                                       # (1, keep, V): the last `keep` positions' logits

The native runtime's prefill (`DECODE_STEP`'s "chunk" row, models/runtime/step.py), reading the same
plan as a decode step (ops/layer/plan.py) for T tokens at once: the norms, the residual sums, the
gating and RoPE in transformers' own arithmetic (ops/layer/naive.py's references, vectorized torch on
T rows: a prompt's cache then equals transformers' path's bit for bit where the products do, and the
8-bit rounding of x flips no boundary the other path does not), every product through its own
entrance (`linear_product`, whose table takes its "prefill" row from `prefill_rows` rows on: the
integer GEMM on panels), the layer's angle table, and attention
through SDPA with enable_gqa (no repeated keys) under the causal mask, and a local layer's window:
a global layer appends the chunk's keys and values to its PagedKVCache and attends to every cached
token as stored (16-bit pages rounded, as transformers' path reads them); a local layer's WindowRing
returns its past window and the chunk in position order (`WindowRing.append`). The generation loop
runs a long prompt in chunks of PREFILL_CHUNK tokens, so activations are a chunk's, not the prompt's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.ops.attention.variants import capped
from gatherlens.ops.layer.naive import rms_norm_cast_reference as rms_norm
from gatherlens.ops.layer.naive import rope_reference
from gatherlens.ops.layer.plan import DecodePlan, LayerPlan
from gatherlens.ops.sparse.ring import WindowRing

__all__ = ["chunk_forward", "QUERY_BLOCK"]

# queries a call of SDPA takes: the mask SDPA turns into floats is (QUERY_BLOCK, L), not (T, L): 4 MB less
# at 4K cached tokens, 8 MB at 8K. SmolLM2's 4K prefill took 7.84 / 7.73 s against 8.45 / 7.90 s in one call,
# alternating in one process; blocks of 128 cost 6-9% (8.66-9.06 s against 8.11-8.25 s)
QUERY_BLOCK = 256


@torch.inference_mode()
def chunk_forward(plan: DecodePlan, ids: torch.Tensor, kvs: list, keep: int | None = None) -> torch.Tensor:
    """ids (1, T) at the caches' length -> logits (1, keep, V) of the last `keep` positions (None: all), every
    layer's cache holding the T tokens after."""
    T, start = ids.shape[1], kvs[0].length
    positions = torch.arange(start, start + T)[None]  # (1, T)
    angles = {name: tuple(t[0].float() for t in table(positions)) for name, table in plan.angles.items()}  # (T, D) x2
    x = plan.embed(ids).reshape(T, -1).float()  # (T, d)
    for layer in plan.layers:
        x = _chunk_layer(layer, x, *angles[layer.angles], kvs[layer.index], start)  # (T, d)
    rows = x if keep is None or keep <= 0 else x[-keep:]  # (n, d)
    h = rms_norm(rows, plan.final_norm, plan.final_eps, plan.head.act or torch.float32)  # (n, d)
    return capped(plan.head(h), plan.logit_softcap).view(1, rows.shape[0], -1)  # (1, n, V)


def _chunk_layer(layer: LayerPlan, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv, start: int):
    """One decoder layer over T tokens: x (T, d) -> (T, d), their keys and values in kv."""
    act = layer.act or x.dtype
    h = rms_norm(x, layer.norms[0], layer.eps[0], act)  # (T, d)
    out = _chunk_attention(layer, h, cos, sin, kv, start)  # (T, Hq*Dv)
    y = _sandwich(layer.o(out.to(act) if out.dtype != act else out), layer, 0)  # (T, d)
    s = x + y.float()  # (T, d): the residual
    h = rms_norm(s, layer.norms[1], layer.eps[1], act)  # (T, d)
    gate_up = layer.gate_up[0](h) if len(layer.gate_up) == 1 else torch.cat([p(h) for p in layer.gate_up], dim=-1)
    g, u = gate_up.float().chunk(2, dim=-1)  # (T, I) x2
    a = _activated(g, layer.activation).mul_(u)  # (T, I): a chunk's rows, no third (T, I) temporary
    return s + _sandwich(layer.down(a.to(act)), layer, 1).float()  # (T, d)


def _activated(g: torch.Tensor, activation: str) -> torch.Tensor:
    """silu(g) or gelu-tanh(g) in g's own memory (a view of the chunk's fresh gate|up rows): the values of
    F.silu / F.gelu, bit for bit. At 512 rows Qwen2.5 0.5B's prefill chunk peaked 35 MB lower so."""
    if activation == "silu":
        return F.silu(g, inplace=True)  # (T, I)
    return torch.ops.aten.gelu_(g, approximate="tanh")  # (T, I): F.gelu has no in-place form


def _sandwich(y: torch.Tensor, layer: LayerPlan, which: int) -> torch.Tensor:
    """y normed by the layer's norm after attention (0) or the MLP (1) (Gemma's sandwich), else y."""
    if layer.sandwich is None:
        return y
    return rms_norm(y, layer.sandwich[which], layer.sandwich_eps[which], torch.float32)  # (T, d)


def _chunk_attention(layer: LayerPlan, h: torch.Tensor, cos, sin, kv, start: int) -> torch.Tensor:
    """h (T, d) -> attention's output (T, Hq*Dv), the chunk's keys and values appended to kv."""
    T, Hq, Hkv, D = h.shape[0], layer.heads, layer.kv_heads, layer.head_dim
    if len(layer.qkv) == 1:
        q, k, v = layer.qkv[0](h).split(layer.qkv_sizes, dim=-1)  # (T, Hq*D), (T, Hkv*D), (T, Hkv*Dv)
    else:
        q, k, v = (p(h) for p in layer.qkv)
    q, k = q.float().reshape(T, Hq, D), k.float().reshape(T, Hkv, D)  # (T, H, D)
    if layer.qk_norms is not None:  # each head normed before RoPE (Qwen3, Gemma 3)
        q = rms_norm(q, layer.qk_norms[0], layer.qk_eps, torch.float32)  # (T, Hq, D)
        k = rms_norm(k, layer.qk_norms[1], layer.qk_eps, torch.float32)  # (T, Hkv, D)
    q = rope_reference(q, cos[:, None], sin[:, None]).transpose(0, 1)[None]  # (1, Hq, T, D)
    k = rope_reference(k, cos[:, None], sin[:, None]).transpose(0, 1)[None]  # (1, Hkv, T, D)
    v = v.float().reshape(T, Hkv, -1).transpose(0, 1)[None]  # (1, Hkv, T, Dv)
    if isinstance(kv, WindowRing):
        keys, values = kv.append(k, v)  # (1, Hkv, n + T, D): the past window and the chunk, in position order
    else:
        kv.append(k, v)
        keys, values = kv.keys, kv.values  # (1, Hkv, L, D): every cached token as read
    first, L = start + T - keys.shape[2], keys.shape[2]  # the position of keys' first row, their count
    out = torch.empty(1, Hq, T, values.shape[-1])  # (1, Hq, T, Dv)
    for i in range(0, T, QUERY_BLOCK):  # each query's row is its own: one call's values (SDPA's own rounding)
        n = min(QUERY_BLOCK, T - i)
        mask = _mask(start + i, n, first, L, layer.window)  # (n, L) bool, True: attend
        out[:, :, i:i + n] = F.scaled_dot_product_attention(q[:, :, i:i + n], keys, values, attn_mask=mask,
                                                            scale=layer.scaling, enable_gqa=Hq != Hkv)  # (1, Hq, n, Dv)
    return out[0].transpose(0, 1).reshape(T, -1)  # (T, Hq*Dv)


def _mask(start: int, T: int, first: int, L: int, window: int | None) -> torch.Tensor:
    """(T, L) bool: query start + i attends key first + j when it is not later, and (a local layer) within
    the window (the query itself included)."""
    qpos = torch.arange(start, start + T)[:, None]  # (T, 1)
    kpos = torch.arange(first, first + L)[None]  # (1, L)
    allowed = kpos <= qpos  # (T, L)
    return allowed if window is None else allowed & (kpos > qpos - window)
