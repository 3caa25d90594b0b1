"""Readable references for the pieces of one decoder-layer step (what ops/layer/fused.py must equal).

    >>> h = rms_norm_cast_reference(x, w, 1e-5, torch.bfloat16)       # x (R, d) float32 -> (R, d)
    >>> s, h = add_rms_norm_cast_reference(x, y, w, 1e-5, torch.bfloat16)
    >>> a = silu_mul_cast_reference(gu, torch.bfloat16)               # gu (R, 2I) -> (R, I)
    >>> a = gelu_mul_cast_reference(gu, torch.float32)                # GeGLU (Gemma's MLP)
    >>> q = rope_append_reference(q, k, v, cos, sin, cache)           # q (B, Hq*D) -> (B, Hq, D)

Plain torch, in float32, as transformers' Llama layer computes them: RMSNorm (x / rms(x) times the
weight), the residual sum, SiLU(gate) * up (GELU-tanh(gate) * up: Gemma's), the rotary embedding (x cos + rotate_half(x) sin) and
the paged cache's `append` of the rotated key and the value.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["rms_norm_cast_reference", "add_rms_norm_cast_reference", "silu_mul_cast_reference", "gelu_mul_cast_reference",
           "rope_reference", "rope_append_reference"]


def rms_norm_cast_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dim, in float32, then cast to `dtype`."""
    x = x.float()  # (..., d)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # (..., d)
    return (weight.float() * h).to(dtype)


def add_rms_norm_cast_reference(x, y, weight, eps: float, dtype: torch.dtype):
    """(x + y in float32, its rms_norm_cast): the residual sum and the next norm."""
    s = x.float() + y.float()  # (..., d)
    return s, rms_norm_cast_reference(s, weight, eps, dtype)


def silu_mul_cast_reference(gu: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """silu(gate) * up for gu = [gate | up] (..., 2I), in float32, cast to `dtype`: (..., I)."""
    gate, up = gu.float().chunk(2, dim=-1)  # (..., I) x2
    return (F.silu(gate) * up).to(dtype)


def gelu_mul_cast_reference(gu: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """gelu_tanh(gate) * up for gu = [gate | up] (..., 2I), in float32, cast to `dtype`: (..., I) (Gemma's GeGLU,
    transformers' GELUTanh: F.gelu(approximate="tanh"))."""
    gate, up = gu.float().chunk(2, dim=-1)  # (..., I) x2
    return (F.gelu(gate, approximate="tanh") * up).to(dtype)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as transformers' Llama applies it: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (..., D)
    return x * cos + rotated * sin


def rope_append_reference(q, k, v, cos, sin, cache) -> torch.Tensor:
    """q (B, Hq*D), k (B, Hkv*D), v (B, Hkv*Dv), cos/sin (B, D): append RoPE(k), v to `cache`
    (a PagedKVCache: its `append` rounds them to 16-bit or int8 pages by the cache's rule); return
    RoPE(q) as (B, Hq, D) float32."""
    B, D, Dv = q.shape[0], cache.head_dim, cache.value_dim
    c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)  # (B, 1, D)
    qr = rope_reference(q.float().view(B, -1, D), c, s)  # (B, Hq, D)
    kr = rope_reference(k.float().view(B, -1, D), c, s)  # (B, Hkv, D)
    cache.append(kr.unsqueeze(2).to(cache.dtype), v.float().view(B, -1, 1, Dv).to(cache.dtype))  # one token
    return qr
