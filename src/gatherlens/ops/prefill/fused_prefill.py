"""The native CPU path of block-sparse prefill: block scores and attention as C++ operators, in place.

    >>> native_fits(q, k, v, blocks, 64, 0.125, PLAIN)                      # None: the operator runs this call
    >>> out, lse = native_block_prefill(q, k, v, blocks, 64, 0.125, PLAIN)  # same signature as naive.py
    >>> scores = native_antidiagonal_scores(q, k, 64, 8, 0.125)            # same as rules.antidiagonal_scores

`torch.ops.gatherlens.block_prefill` (fused_prefill.cpp): per (batch row, selection head, query block)
a task on torch's threads reads each kept key block where it lies in k and v (no gather copy), once
for the G query heads of a KV group (their queries stacked into one matrix), a run of consecutive
whole blocks as one product, a partial block (the diagonal, a window's edge) masked, the steps joined
by flash attention's online softmax (common.h's). Same results as blocked.py and naive.py up to float
rounding (the sums run in another order). `torch.ops.gatherlens.antidiagonal_scores`: the
antidiagonal rule (rules.py, its reference) on the tiles causality allows only (half the reference's
product) with each tile row's softmax and block sums fused: the same scores up to float rounding.

Both run float32 (16-bit inputs widened, as the torch paths compute them) on the CPU without autograd;
the attention without soft-capping (sinks join after it, `variants.join_sinks`; a window is its mask's
second rule). `native_fits` and `scores_fit` are the "native" rows of attend.BLOCK_PREFILL and
attend.ANTIDIAGONAL, the tables deciding where each runs.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from gatherlens.ops.attention.variants import PLAIN, AttentionVariant, join_sinks
from gatherlens.ops.dtypes import compute_dtype
from gatherlens.ops.native import load_library
from gatherlens.ops.sparse.geometry import ceil_div

__all__ = ["NATIVE_VARIANT", "NATIVE_DTYPES", "kernel_loaded", "native_fits", "native_ready", "native_block_prefill", "scores_fit",
           "native_antidiagonal_scores", "KERNEL"]

KERNEL = Path(__file__).with_name("fused_prefill.cpp")
NATIVE_VARIANT = frozenset({"sinks", "window"})  # what block_prefill's C++ operator applies (its row's declaration)
NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the input dtypes it reads (computed in float32)


def kernel_loaded() -> bool:
    """True once the two operators are registered (built on first use); False: the torch paths."""
    return load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::block_prefill", fake_block_prefill)
    torch.library.register_fake("gatherlens::antidiagonal_scores", fake_antidiagonal_scores)


def fake_block_prefill(q, k, v, blocks, block_size, scale, window=None):
    B, Hq, Q, _ = q.shape
    return q.new_empty(B, Hq, Q, v.shape[-1]), q.new_empty(B, Hq, Q)


def fake_antidiagonal_scores(q, k, block_size, stride, scale, window, key_len):
    B, Hq, Q, _ = q.shape
    return q.new_empty(B, Hq, ceil_div(Q, block_size), ceil_div(key_len, block_size))


def native_ready() -> str | None:
    """None once the operators are registered, else why the native rows cannot run here."""
    return None if kernel_loaded() else "its C++ operator did not build (see the warning)"


def _float32_cpu(*xs: torch.Tensor) -> str | None:
    """None when every tensor is on the CPU, computed in float32 and needs no gradient, else why not."""
    if not all(x.is_cpu for x in xs):
        return f"the query is on {xs[0].device} (the C++ operators run on the CPU)"
    if compute_dtype(xs[0].dtype) != torch.float32 or any(x.dtype != xs[0].dtype for x in xs):
        return f"the inputs are {' / '.join(str(x.dtype) for x in xs)} (the C++ operators compute float32)"
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return "an input needs a gradient (the C++ operators have no backward)"
    return None


def native_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, block_size: int,
                scale: float | None = None, variant: AttentionVariant = PLAIN) -> str | None:
    """None when `block_prefill` computes this attention, else why not: CPU tensors computed in float32
    (float32, float16, bfloat16), no autograd, the operator built. The variant fields it runs (a window,
    sinks joined after it; no soft-capping) are its row's declaration (attend.BLOCK_PREFILL: NATIVE_VARIANT)."""
    return _float32_cpu(q, k, v) or native_ready()


def scores_fit(q: torch.Tensor, k: torch.Tensor, block_size: int, stride: int, scale: float,
               window: int | None = None) -> str | None:
    """None when `antidiagonal_scores` computes these scores, else why not (as native_fits)."""
    return _float32_cpu(q, k) or native_ready()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x (B, H, N, E) as float32 with its last dim contiguous (a view when it already is)."""
    x = x.float()
    return x if x.stride(-1) == 1 else x.contiguous()                         # (B, H, N, E)


def native_block_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, block_size: int,
                         scale: float | None = None,
                         variant: AttentionVariant = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, Hq, Q, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv), blocks (B, H, nq, nk) bool (H = Hkv or Hq)
    -> out (B, Hq, Q, Dv) in q.dtype, lse (B, Hq, Q) float32: blocked.block_prefill on the C++ operator."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = torch.ops.gatherlens.block_prefill(
        _rows(q), _rows(k), _rows(v), blocks.contiguous(), block_size, scale, variant.window)  # (B, Hq, Q, Dv), (B, Hq, Q)
    out, lse = join_sinks(out, lse, variant.sinks)
    return out.to(q.dtype), lse


def native_antidiagonal_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, stride: int, scale: float,
                               window: int | None = None) -> torch.Tensor:
    """q (B, Hq, Q, D), k (B, Hkv, L, D) -> (B, Hq, nq, nk) float32: rules.antidiagonal_scores on the C++ operator."""
    L = k.shape[2]
    kp, pad = k.float(), ceil_div(L, stride) * stride - L
    if pad:
        kp = torch.nn.functional.pad(kp, (0, 0, 0, pad))                      # (B, Hkv, T, D) zero tiles' rows
    return torch.ops.gatherlens.antidiagonal_scores(_rows(q), kp.contiguous(), block_size, stride, scale, window,
                                                    L)                         # (B, Hq, nq, nk)
