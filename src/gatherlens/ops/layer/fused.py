"""The pieces of one decoder-layer step as C++ operators (layer_ops.cpp), each beside its reference.

    >>> h = rms_norm_cast(x, w, 1e-5, torch.bfloat16)         # x (..., d) float32 -> (..., d) bf16
    >>> x2, h = add_rms_norm_cast(x, y, w, 1e-5, torch.bfloat16)
    >>> a = silu_mul_cast(gu, torch.bfloat16)                  # (..., 2I) -> (..., I)
    >>> a = glu_cast(gu, "gelu_tanh", torch.float32)           # the gated MLP's activation by name (GeGLU)
    >>> q = rope_append(q, k, v, cos, sin, cache)              # (B, Hq, D); k, v in the cache

A decode step moves one token through a layer: each of these is a few thousand floats, and what
they cost in torch is the calls (a few microseconds of dispatch each, ~60 a layer). One operator
each does the same float32 arithmetic as naive.py (equal up to the order of a sum, tested);
`rope_append` also writes the rotated key and the value into a PagedKVCache in place, with its
page summary, through the cache's public `writable` / `advance`. Where each call runs is decided by
one backend table per operator (ops/backends.py: `RMS_NORM_CAST`, `ADD_RMS_NORM_CAST`, `SILU_MUL_CAST`,
`GELU_MUL_CAST`, `ROPE_APPEND`), rows "native" (the C++ operator, where it fits: CPU, float32 inputs, no autograd, an
output dtype it writes, the operator built) and "torch" (the reference, every call): no silent
fallback, `backends.describe()` says which ran and why the native row did not.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gatherlens.ops.backends import Impl, Operator
from gatherlens.ops.native import load_library

from . import naive

__all__ = ["kernel_loaded", "kernel_ready", "rms_norm_cast", "add_rms_norm_cast", "silu_mul_cast", "gelu_mul_cast",
           "glu_cast", "rope_append", "KERNEL", "RMS_NORM_CAST", "ADD_RMS_NORM_CAST", "SILU_MUL_CAST", "GELU_MUL_CAST",
           "ROPE_APPEND", "ACTIVATIONS"]

KERNEL = Path(__file__).with_name("layer_ops.cpp")
_OUT = (torch.float32, torch.bfloat16)
_PAGES = (torch.float32, torch.float16, torch.bfloat16, torch.int8)  # the page dtypes rope_append writes


def kernel_loaded() -> bool:
    """True once the operators are registered (built on first use); False: the tables take the references."""
    return load_library(KERNEL, on_load=register_fakes)


def kernel_ready() -> str | None:
    """None once the operators are registered, else why the native rows cannot run here."""
    return None if kernel_loaded() else "its C++ operators (layer_ops.cpp) did not build (see the warning)"


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::rms_norm_cast", _fake_norm)
    torch.library.register_fake("gatherlens::add_rms_norm_cast", _fake_add_norm)
    torch.library.register_fake("gatherlens::silu_mul_cast", _fake_silu)
    torch.library.register_fake("gatherlens::gelu_mul_cast", _fake_silu)
    torch.library.register_fake("gatherlens::rope_append", _fake_rope)


def _fake_norm(x, w, eps, bf16):
    return x.new_empty(x.shape, dtype=torch.bfloat16 if bf16 else torch.float32)


def _fake_add_norm(x, y, w, eps, bf16):
    return x.new_empty(x.shape), _fake_norm(x, w, eps, bf16)


def _fake_silu(gu, bf16):
    return gu.new_empty(gu.shape[0], gu.shape[1] // 2, dtype=torch.bfloat16 if bf16 else torch.float32)


def _fake_rope(q, k, v, cos, sin, keys, values, summaries, position, key_scales=None, value_scales=None):
    D = keys.shape[-1]
    return summaries.new_empty(q.shape[0], q.shape[1] // D, D, dtype=torch.float32)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # (R, d)


def _fits(*xs, dtype=torch.float32) -> str | None:
    """None for CPU tensors without autograd, an output dtype the operators write and the operators built,
    else why not (a loop, not a generator: this runs ~5 times a layer a decode step)."""
    if dtype not in _OUT:
        return f"the output dtype is {dtype} (the operators write float32 or bfloat16)"
    for x in xs:
        if x.requires_grad or x.device.type != "cpu":
            return "an input needs a gradient or is not on the CPU (the operators have no backward, run on the CPU)"
    return None if kernel_loaded() else "its C++ operators (layer_ops.cpp) did not build"


def _norm_fits(x, weight, eps, dtype) -> str | None:
    if not (x.dtype == weight.dtype == torch.float32 and weight.is_contiguous()):
        return f"x is {x.dtype}, the weight {weight.dtype} (the operator takes float32, a contiguous weight)"
    return _fits(x, weight, dtype=dtype)


def _norm_run(x, weight, eps, dtype):
    h = torch.ops.gatherlens.rms_norm_cast(_rows(x).contiguous(), weight, eps, dtype == torch.bfloat16)
    return h if x.dim() == 2 else h.view(x.shape)  # (..., d)


def _add_norm_fits(x, y, weight, eps, dtype) -> str | None:
    if not (x.dtype == weight.dtype == torch.float32 and y.dtype in _OUT and y.shape == x.shape
            and weight.is_contiguous()):
        return (f"x {x.dtype} {tuple(x.shape)}, y {y.dtype} {tuple(y.shape)}, the weight {weight.dtype} (the "
                f"operator takes float32 x and weight, y float32 or bfloat16 of x's shape)")
    return _fits(x, y, weight, dtype=dtype)


def _add_norm_run(x, y, weight, eps, dtype):
    s, h = torch.ops.gatherlens.add_rms_norm_cast(_rows(x).contiguous(), _rows(y), weight, eps,
                                                  dtype == torch.bfloat16)  # (R, d) x2
    return (s, h) if x.dim() == 2 else (s.view(x.shape), h.view(x.shape))


def _silu_fits(gu, dtype) -> str | None:
    if gu.dtype not in _OUT or gu.shape[-1] % 2:
        return f"gu is {gu.dtype} of width {gu.shape[-1]} (the operator takes float32 or bfloat16, an even width)"
    return _fits(gu, dtype=dtype)


def _glu_run(op):
    def run(gu, dtype):
        a = op(_rows(gu), dtype == torch.bfloat16)  # (R, I)
        return a if gu.dim() == 2 else a.view(*gu.shape[:-1], gu.shape[-1] // 2)
    return run


def _rope_fits(q, k, v, cos, sin, cache) -> str | None:
    if not (q.dtype in _OUT and k.dtype == v.dtype == q.dtype and q.dim() == k.dim() == v.dim() == 2
            and all(t.stride(-1) == 1 for t in (q, k, v))):
        return "q, k, v are not rows of one dtype (float32 or bfloat16) with contiguous last dims"
    if not (cache.dtype == torch.float32 and cache.kv_dtype in _PAGES and cache.device.type == "cpu"
            and cache.summary_dtype in (torch.float32, cache.kv_dtype)):
        return (f"the cache is read in {cache.dtype}, pages {cache.kv_dtype} on {cache.device} (the operator "
                f"writes CPU caches read in float32, pages in float32, float16, bfloat16 or int8)")
    return _fits(q, k, v, cos, sin)


def _rope_run(q, k, v, cos, sin, cache):
    keys, values, summaries = cache.writable(1)
    key_scales, value_scales = cache.scale_storage()  # (B, Hkv, cap, D | P) float32 for int8 pages, else None
    out = torch.ops.gatherlens.rope_append(q, k, v, cos.float().contiguous(), sin.float().contiguous(), keys,
                                           values, summaries, cache.length, key_scales, value_scales)  # (B, Hq, D)
    cache.advance(1)
    return out


def _any(*args) -> None:
    return None  # the reference: every call


RMS_NORM_CAST = Operator("rms_norm_cast", [Impl("native", _norm_fits, _norm_run, ready=kernel_ready),
                                           Impl("torch", _any, naive.rms_norm_cast_reference)])
ADD_RMS_NORM_CAST = Operator("add_rms_norm_cast", [Impl("native", _add_norm_fits, _add_norm_run, ready=kernel_ready),
                                                   Impl("torch", _any, naive.add_rms_norm_cast_reference)])
SILU_MUL_CAST = Operator("silu_mul_cast", [
    Impl("native", _silu_fits, _glu_run(lambda *a: torch.ops.gatherlens.silu_mul_cast(*a)), ready=kernel_ready),
    Impl("torch", _any, naive.silu_mul_cast_reference)])
GELU_MUL_CAST = Operator("gelu_mul_cast", [
    Impl("native", _silu_fits, _glu_run(lambda *a: torch.ops.gatherlens.gelu_mul_cast(*a)), ready=kernel_ready),
    Impl("torch", _any, naive.gelu_mul_cast_reference)])
ROPE_APPEND = Operator("rope_append", [Impl("native", _rope_fits, _rope_run, ready=kernel_ready),
                                       Impl("torch", _any, naive.rope_append_reference)])


def rms_norm_cast(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """weight * x / rms(x) in float32, as `dtype` (float32 or bfloat16): x (..., d) -> (..., d)."""
    return RMS_NORM_CAST(x, weight, eps, dtype)


def add_rms_norm_cast(x, y, weight, eps: float, dtype: torch.dtype):
    """(x + y, rms_norm_cast of it): x (..., d) float32, y (..., d) float32 or bfloat16."""
    return ADD_RMS_NORM_CAST(x, y, weight, eps, dtype)


def silu_mul_cast(gu: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """silu(gate) * up of gu = [gate | up] (..., 2I), in float32, as `dtype`: (..., I)."""
    return SILU_MUL_CAST(gu, dtype)


def gelu_mul_cast(gu: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """gelu_tanh(gate) * up of gu = [gate | up] (..., 2I), in float32, as `dtype`: (..., I) (GeGLU)."""
    return GELU_MUL_CAST(gu, dtype)


# the gated MLP's activation (LayerShape.activation) -> its operator; the C++ stack numbers them in this order
ACTIVATIONS = {"silu": silu_mul_cast, "gelu_tanh": gelu_mul_cast}


def glu_cast(gu: torch.Tensor, activation: str, dtype: torch.dtype) -> torch.Tensor:
    """act(gate) * up of gu = [gate | up] (..., 2I) for an activation of ACTIVATIONS ("silu", "gelu_tanh")."""
    return ACTIVATIONS[activation](gu, dtype)


def rope_append(q, k, v, cos, sin, cache) -> torch.Tensor:
    """RoPE of q (B, Hq*D) -> (B, Hq, D) float32; RoPE(k) (B, Hkv*D) and v (B, Hkv*Dv) appended to
    `cache` (a PagedKVCache read in float32, pages stored in float32, float16, bfloat16 or int8: the
    rounding and int8 scale rule of ops/sparse/cache.py) as one token. cos, sin: (B, D). q, k, v
    float32 or bfloat16."""
    return ROPE_APPEND(q, k, v, cos, sin, cache)
