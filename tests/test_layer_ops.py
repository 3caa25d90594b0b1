"""The decoder-layer pieces as C++ operators (ops/layer) against their torch references: the same
values up to the order of a sum, the paged cache written exactly as `append` writes it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from native_helpers import needs_native

from gatherlens.ops.layer import fused, naive
from gatherlens.ops.sparse import PagedKVCache

pytestmark = needs_native(fused)
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}


def close_as(dtype, a, b):
    """Equal up to one rounding of `dtype` (the sums run in another order before it)."""
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 576), (3, 7), (2, 1, 33), (1, 1)], ids=str)
def test_rms_norm_cast(shape, dtype):
    x, w = torch.randn(shape) * 3, torch.randn(shape[-1])
    close_as(dtype, fused.rms_norm_cast(x, w, 1e-5, dtype), naive.rms_norm_cast_reference(x, w, 1e-5, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ydtype", DTYPES, ids=lambda d: f"y-{d}")
@pytest.mark.parametrize("shape", [(1, 576), (3, 7), (2, 1, 33)], ids=str)
def test_add_rms_norm_cast(shape, dtype, ydtype):
    x, y, w = torch.randn(shape), torch.randn(shape).to(ydtype), torch.randn(shape[-1])
    s, h = fused.add_rms_norm_cast(x, y, w, 1e-6, dtype)
    s2, h2 = naive.add_rms_norm_cast_reference(x, y, w, 1e-6, dtype)
    assert torch.equal(s, s2)  # one float32 add per element: exact
    close_as(dtype, h, h2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gdtype", DTYPES, ids=lambda d: f"in-{d}")
@pytest.mark.parametrize("shape", [(1, 3072), (2, 6), (2, 1, 10)], ids=str)
def test_silu_mul_cast(shape, dtype, gdtype):
    gu = (torch.randn(shape) * 4).to(gdtype)
    close_as(dtype, fused.silu_mul_cast(gu, dtype), naive.silu_mul_cast_reference(gu, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gdtype", DTYPES, ids=lambda d: f"in-{d}")
@pytest.mark.parametrize("shape", [(1, 4096), (2, 6), (2, 1, 10)], ids=str)
def test_gelu_mul_cast(shape, dtype, gdtype):
    """GeGLU (Gemma's MLP) against torch's gelu(approximate="tanh"), through the activation table too."""
    gu = (torch.randn(shape) * 4).to(gdtype)
    close_as(dtype, fused.glu_cast(gu, "gelu_tanh", dtype), naive.gelu_mul_cast_reference(gu, dtype))
    assert fused.glu_cast(gu, "silu", dtype).equal(fused.silu_mul_cast(gu, dtype))


def rope_inputs(B, Hq, Hkv, D, Dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, (Hq + Hkv) * D + Hkv * Dv, generator=g).to(dtype)  # (B, q|k|v) as a fused matmul gives
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * Dv], dim=-1)  # row-strided views
    angle = torch.rand(B, D // 2, generator=g) * 6
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)  # (B, D)
    return q, k, v, cos, sin


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,Hq,Hkv,D,Dv,P,L0", [(1, 9, 3, 64, 64, 8, 4095), (2, 4, 2, 6, 6, 4, 0),
                                                (1, 2, 1, 8, 3, 3, 5), (3, 6, 3, 4, 4, 1, 2)], ids=str)
def test_rope_append_writes_the_cache_as_append_does(B, Hq, Hkv, D, Dv, P, L0, dtype):
    caches = [PagedKVCache(B, Hkv, D, page_size=P, value_dim=Dv) for _ in range(2)]
    prefix_k, prefix_v = torch.randn(B, Hkv, L0, D), torch.randn(B, Hkv, L0, Dv)
    for c in caches:
        c.append(prefix_k, prefix_v)
    for step in range(P + 2):  # through a page boundary: a new page's box, then running max / min
        q, k, v, cos, sin = rope_inputs(B, Hq, Hkv, D, Dv, dtype, seed=step)
        out = fused.rope_append(q, k, v, cos, sin, caches[0])
        ref = naive.rope_append_reference(q, k, v, cos, sin, caches[1])
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    a, b = caches
    assert a.length == b.length == L0 + P + 2
    torch.testing.assert_close(a.keys, b.keys, atol=1e-6, rtol=1e-6)
    assert torch.equal(a.values, b.values)
    hi = torch.stack([a.keys[:, :, s:s + P].amax(2) for s in range(0, a.length, P)], 2)  # (B, Hkv, N, D)
    lo = torch.stack([a.keys[:, :, s:s + P].amin(2) for s in range(0, a.length, P)], 2)
    assert torch.equal(a.key_max, hi) and torch.equal(a.key_min, lo)  # exact boxes of the stored keys


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), Hkv=st.integers(1, 3), G=st.integers(1, 3), half=st.integers(1, 8),
       P=st.integers(1, 9), L0=st.integers(0, 30), seed=st.integers(0, 1000))
def test_rope_append_any_shape(B, Hkv, G, half, P, L0, seed):
    D = 2 * half
    a, b = PagedKVCache(B, Hkv, D, page_size=P), PagedKVCache(B, Hkv, D, page_size=P)
    for c in (a, b):
        c.append(torch.ones(B, Hkv, L0, D), torch.ones(B, Hkv, L0, D))
    q, k, v, cos, sin = rope_inputs(B, G * Hkv, Hkv, D, D, torch.float32, seed)
    torch.testing.assert_close(fused.rope_append(q, k, v, cos, sin, a), naive.rope_append_reference(q, k, v, cos, sin, b),
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(a.summaries, b.summaries, atol=1e-6, rtol=1e-6)


def test_inputs_the_operators_do_not_take_run_the_reference(monkeypatch):
    x, w = torch.randn(2, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    assert torch.equal(fused.rms_norm_cast(x, w, 1e-5, torch.float32), naive.rms_norm_cast_reference(x, w, 1e-5, torch.float32))
    monkeypatch.setattr(fused, "kernel_loaded", lambda: False)
    gu = torch.randn(2, 6)
    assert torch.equal(fused.silu_mul_cast(gu, torch.float32), naive.silu_mul_cast_reference(gu, torch.float32))


def test_the_operators_pass_opcheck():
    x, y, w = torch.randn(2, 16), torch.randn(2, 16), torch.randn(16)
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.gatherlens.rms_norm_cast.default, (x, w, 1e-5, True), test_utils=checks)
    torch.library.opcheck(torch.ops.gatherlens.add_rms_norm_cast.default, (x, y, w, 1e-5, False), test_utils=checks)
    torch.library.opcheck(torch.ops.gatherlens.silu_mul_cast.default, (x, True), test_utils=checks)
    cache = PagedKVCache(1, 2, 4, page_size=4)
    cache.append(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    q, k, v, cos, sin = rope_inputs(1, 4, 2, 4, 4, torch.float32)
    keys, values, summaries = cache.writable(1)
    torch.library.opcheck(torch.ops.gatherlens.rope_append.default,
                          (q.contiguous(), k.contiguous(), v.contiguous(), cos, sin, keys, values, summaries, 3),
                          test_utils=checks)


def test_a_position_outside_the_storage_is_refused():
    cache = PagedKVCache(1, 1, 4, page_size=4, capacity=4)
    q, k, v, cos, sin = rope_inputs(1, 1, 1, 4, 4, torch.float32)
    keys, values, summaries = cache.writable(1)
    with pytest.raises(RuntimeError, match="outside the cache"):
        torch.ops.gatherlens.rope_append(q, k, v, cos, sin, keys, values, summaries, 10 ** 6)
    with pytest.raises(Exception, match="advance"):
        cache.advance(10 ** 6)
