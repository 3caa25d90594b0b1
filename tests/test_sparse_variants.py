"""sparse_decode's variants of today's decoders: soft-capping (Gemma 2), attention sinks (GPT-OSS)
and a paged cache whose values are narrower or wider than its keys (latent attention). Full budget
equals dense attention (transformers' eager attention where it imports); any budget equals the
float64 reference over the chosen pages; the pages are those of the plain call (the cap is
monotonic, the sink does not rank). The Triton kernel runs under TRITON_INTERPRET=1 in a child."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from triton_helpers import interpreted_results
import torch
from hypothesis import given
from hypothesis import strategies as st

from native_helpers import require_native

from gatherlens.errors import GatherLensError, GatherTypeError, GatherValueError
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.fused_decode import kernel_loaded as native_loaded
from gatherlens.ops.sparse.naive import dense_decode_reference, sparse_attention_reference

BACKENDS = ["auto", "torch", "native"]


def make(B=1, Hq=4, Hkv=2, L=37, D=8, Dv=None, P=4, dtype=torch.float32, chunks=None, seed=0, spread=2.0):
    """q (B, Hq, 1, D), keys (B, Hkv, L, D), values (B, Hkv, L, Dv), sinks (Hq,) and a cache of them
    appended in `chunks` (default: one append)."""
    Dv = Dv or D
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(B, Hkv, L, D, generator=g) * spread).to(dtype)  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, Dv, generator=g).to(dtype)            # (B, Hkv, L, Dv)
    q = (torch.randn(B, Hq, 1, D, generator=g) * spread).to(dtype)   # (B, Hq, 1, D)
    sinks = torch.randn(Hq, generator=g).to(dtype)                    # (Hq,)
    cache = PagedKVCache(B, Hkv, D, page_size=P, dtype=dtype, value_dim=Dv)
    s = 0
    for t in chunks or [L]:
        cache.append(k[:, :, s:s + t], v[:, :, s:s + t])
        s += t
    assert s == L
    return q, k, v, sinks, cache


def require_backend(backend):
    if backend == "native":
        require_native(None if native_loaded() else "fused_decode.cpp did not build")


CASES = [
    # (B, Hq, Hkv, L, D, Dv, P)
    (1, 4, 2, 37, 8, 8, 4),
    (2, 6, 2, 45, 8, 5, 4),       # values narrower than keys
    (1, 3, 1, 33, 7, 12, 32),     # wider, one partial page
    (2, 8, 8, 16, 16, 16, 16),
    (1, 16, 2, 300, 24, 16, 16),  # a DeepSeek-like 3:2 key/value width
]
IDS = ["B{}-H{}x{}-L{}-D{}-Dv{}-P{}".format(*c) for c in CASES]


# -- full budget: dense attention --------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("softcap,sinks", [(None, True), (3.0, False), (30.0, True)],
                         ids=["sinks", "softcap3", "softcap30+sinks"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_full_budget_is_dense_attention(case, softcap, sinks, backend):
    require_backend(backend)
    B, Hq, Hkv, L, D, Dv, P = case
    q, k, v, s, cache = make(B, Hq, Hkv, L, D, Dv, P)
    s = s if sinks else None
    call = lambda: sparse_decode(q, cache, budget=L, return_lse=True, softcap=softcap, sinks=s,  # noqa: E731
                                 backend=backend)
    if backend == "native" and softcap is not None:
        with pytest.raises(GatherValueError, match="backend = 'native' cannot run this sparse_decode call: the attention variant sets softcap"):
            call()
        return
    out, lse = call()
    ref, ref_lse = dense_decode_reference(q, k, v, softcap=softcap, sinks=s)
    assert out.shape == (B, Hq, 1, Dv) and out.dtype == q.dtype
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_full_budget_equals_transformers_eager(case):
    """Gemma 2's and GPT-OSS's eager attention (one decode query), where transformers imports."""
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    B, Hq, Hkv, L, D, Dv, P = case
    q, k, v, sinks, cache = make(B, Hq, Hkv, L, D, Dv, P, dtype=torch.float64)
    module = types.SimpleNamespace(num_key_value_groups=Hq // Hkv, head_dim=D, training=False, sinks=sinks)
    ref, _ = gemma2.eager_attention_forward(module, q, k, v, None, scaling=D ** -0.5, softcap=5.0)
    out = sparse_decode(q, cache, budget=L, softcap=5.0)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=2e-6, rtol=2e-6)  # eager: float32 softmax
    ref, _ = gpt_oss.eager_attention_forward(module, q, k, v, None, scaling=D ** -0.5)
    out = sparse_decode(q, cache, budget=L, sinks=sinks)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-6, rtol=1e-6)  # lse is float32


# -- any budget: the reference over the chosen pages, and the same pages -----------------------

@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-head"])
@pytest.mark.parametrize("budget", [1, 12, 40], ids=lambda b: f"budget{b}")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_sparse_budget_matches_reference_on_the_plain_pages(case, budget, share):
    B, Hq, Hkv, L, D, Dv, P = case
    q, k, v, sinks, cache = make(B, Hq, Hkv, L, D, Dv, P, dtype=torch.float64)
    _, plain = sparse_decode(q, cache, budget, share_selection=share, return_selection=True)
    for softcap in (None, 0.5, 4.0):
        out, lse, sel = sparse_decode(q, cache, budget, share_selection=share, return_lse=True,
                                      return_selection=True, softcap=softcap, sinks=sinks)
        assert torch.equal(sel.pages, plain.pages) and torch.equal(sel.bounds, plain.bounds)
        ref, ref_lse = sparse_attention_reference(q, k, v, sel.pages, P, softcap=softcap, sinks=sinks)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse, ref_lse)
        torch.testing.assert_close(sel.lse, lse)


@given(
    B=st.integers(1, 2), Hkv=st.integers(1, 2), G=st.sampled_from([1, 2, 3]), L=st.integers(1, 50),
    D=st.integers(1, 9), Dv=st.integers(1, 9), P=st.sampled_from([1, 3, 4, 16]), budget=st.integers(1, 60),
    softcap=st.sampled_from([None, 0.3, 2.0, 50.0]), use_sinks=st.booleans(), share=st.booleans(),
    chunks=st.lists(st.integers(1, 20), min_size=1, max_size=4), seed=st.integers(0, 999),
)
def test_property_any_shape_matches_reference(B, Hkv, G, L, D, Dv, P, budget, softcap, use_sinks, share, chunks,
                                              seed):
    chunks = [c for c in chunks if c] or [L]
    L = sum(chunks)
    q, k, v, sinks, cache = make(B, Hkv * G, Hkv, L, D, Dv, P, dtype=torch.float64, chunks=chunks, seed=seed)
    sinks = sinks if use_sinks else None
    out, lse, sel = sparse_decode(q, cache, budget, share_selection=share, return_lse=True, return_selection=True,
                                  softcap=softcap, sinks=sinks)
    assert out.shape == (B, Hkv * G, 1, Dv)
    ref, ref_lse = sparse_attention_reference(q, k, v, sel.pages, P, softcap=softcap, sinks=sinks)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, ref_lse)
    if budget >= L:
        dense, _ = dense_decode_reference(q, k, v, softcap=softcap, sinks=sinks)
        torch.testing.assert_close(out, dense, atol=1e-12, rtol=1e-12)


def test_key_mask_with_softcap_sinks_and_narrow_values():
    """Masked keys inside the chosen pages get no weight; the cap and the sink apply as without a mask."""
    q, k, v, sinks, cache = make(2, 4, 2, 41, 8, 6, 4, dtype=torch.float64)
    mask = torch.ones(2, 41, dtype=torch.bool)
    mask[1, :9] = False                                         # a left-padded second sequence
    out, sel = sparse_decode(q, cache, budget=16, key_mask=mask, softcap=2.0, sinks=sinks, return_selection=True)
    G = 2
    logits = q @ k.repeat_interleave(G, 1).transpose(-1, -2) / math.sqrt(8)  # (B, Hq, 1, L)
    logits = 2.0 * torch.tanh(logits / 2.0)
    read = torch.zeros(2, 2, 41, dtype=torch.bool)              # (B, Hkv, L) tokens of the chosen pages
    for b in range(2):
        for h in range(2):
            for p in sel.pages[b, h].tolist():
                read[b, h, p * 4:(p + 1) * 4] = True
    keep = read.repeat_interleave(G, 1) & mask[:, None, :]      # (B, Hq, L)
    logits = logits.masked_fill(~keep.unsqueeze(2), -math.inf)
    cols = torch.cat([logits, sinks.view(1, 4, 1, 1).expand(2, 4, 1, 1)], -1)  # (B, Hq, 1, L + 1)
    w = torch.softmax(cols, -1)[..., :-1]                       # (B, Hq, 1, L)
    torch.testing.assert_close(out, w @ v.repeat_interleave(G, 1), atol=1e-12, rtol=1e-12)


# -- gradients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("softcap", [None, 2.0], ids=["no-cap", "softcap2"])
@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-head"])
def test_query_and_sink_gradients_match_reference(share, softcap):
    q, k, v, sinks, cache = make(2, 4, 2, 45, 8, 5, 4, dtype=torch.float64)
    q1, q2 = q.clone().requires_grad_(), q.clone().requires_grad_()
    s1, s2 = sinks.clone().requires_grad_(), sinks.clone().requires_grad_()
    out, sel = sparse_decode(q1, cache, budget=12, share_selection=share, softcap=softcap, sinks=s1,
                             return_selection=True)
    ref, _ = sparse_attention_reference(q2, k, v, sel.pages, 4, softcap=softcap, sinks=s2)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(q1.grad, q2.grad, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(s1.grad, s2.grad, atol=1e-12, rtol=1e-12)


def test_gradcheck_at_full_budget():
    q, k, v, sinks, cache = make(1, 4, 2, 13, 4, 3, 4, dtype=torch.float64, spread=1.0)

    def f(q, sinks):
        return sparse_decode(q, cache, budget=13, softcap=1.5, sinks=sinks)

    assert torch.autograd.gradcheck(f, (q.requires_grad_(), sinks.requires_grad_()))


# -- the cache with values of another width ------------------------------------------------------

@pytest.mark.parametrize("Dv", [3, 8, 13], ids=lambda d: f"Dv{d}")
def test_cache_stores_values_of_their_own_width(Dv):
    q, k, v, sinks, cache = make(2, 4, 2, 29, 8, Dv, 4, chunks=[5, 1, 1, 15, 7])
    assert cache.value_dim == Dv and cache.head_dim == 8
    assert torch.equal(cache.keys, k) and torch.equal(cache.values, v)
    assert cache.page_values.shape == (2, 2, 8, 4, Dv) and cache.summaries.shape == (2, 2, 8, 16)
    plain = PagedKVCache(2, 2, 8, page_size=4)
    plain.append(k, torch.zeros(2, 2, 29, 8))
    assert torch.equal(cache.summaries, plain.summaries)        # summaries: keys only
    pages = torch.tensor([[[0, 3, 7]], [[1, 2, 7]]]).expand(2, 2, 3)
    gk, gv = cache.gather_pages(pages)
    assert gk.shape == (2, 2, 12, 8) and gv.shape == (2, 2, 12, Dv)
    pos = cache.page_positions(pages).clamp(max=28)             # (B, Hsel, n*P)
    assert torch.equal(gv[pos < 28], v.gather(2, pos.unsqueeze(-1).expand(-1, -1, -1, Dv))[pos < 28])
    cache.truncate(10)
    assert cache.values.shape == (2, 2, 10, Dv) and torch.equal(cache.values, v[:, :, :10])
    cache.append(k[:, :, 10:], v[:, :, 10:])
    assert torch.equal(cache.values, v) and torch.equal(cache.summaries, plain.summaries)
    assert ("value_dim" in repr(cache)) == (Dv != 8)


def test_default_value_dim_is_head_dim_bit_for_bit():
    q, k, v, sinks, cache = make(1, 4, 2, 37, 8)
    twin = PagedKVCache(1, 2, 8, page_size=4, value_dim=8)
    twin.append(k, v)
    assert cache.value_dim == 8 and repr(cache) == repr(twin)
    for backend in ("auto", "torch"):
        a = sparse_decode(q, cache, budget=12, backend=backend)
        b = sparse_decode(q, twin, budget=12, backend=backend, softcap=None, sinks=None)
        assert torch.equal(a, b)


# -- bad inputs --------------------------------------------------------------------------------

def bad_calls():
    q, k, v, sinks, cache = make(1, 4, 2, 20, 8, 5, 4)
    call = lambda **kw: sparse_decode(q, cache, budget=8, **kw)  # noqa: E731
    return [
        ("softcap 0", lambda: call(softcap=0), GatherValueError, "softcap = 0 is outside the valid range (0, inf)"),
        ("softcap negative", lambda: call(softcap=-3.0), GatherValueError, "softcap = -3.0"),
        ("softcap nan", lambda: call(softcap=math.nan), GatherValueError, "softcap = nan"),
        ("sinks per kv head", lambda: call(sinks=sinks[:2]), GatherValueError,
         "sinks has shape (2,); expected (Hq,) = (4,)"),
        ("sinks ints", lambda: call(sinks=torch.zeros(4, dtype=torch.int32)), GatherTypeError, "sinks has dtype"),
        ("sinks float", lambda: call(sinks=0.5), GatherTypeError, "sinks must be a torch.Tensor"),
        ("native softcap", lambda: call(softcap=2.0, backend="native"), GatherValueError,
         "backend = 'native' cannot run this sparse_decode call: the attention variant sets softcap = 2.0, which "
         "this row does not apply (it applies: sinks); use backend='torch' or 'auto'"),
        ("query width", lambda: sparse_decode(q[..., :5], cache, budget=8), GatherValueError,
         "head_dim = 8 (the keys' width; values are value_dim = 5)"),
        ("append values width", lambda: cache.append(k[:, :, :2], k[:, :, :2]), GatherValueError,
         "values has shape (1, 2, 2, 8); expected (B, Hkv, T, Dv) = (1, 2, 'T', 5) for this cache (keys are "
         "head_dim = 8 wide, values value_dim = 5)"),
        ("append keys width", lambda: cache.append(v[:, :, :2], v[:, :, :2]), GatherValueError,
         "keys has shape (1, 2, 2, 5); expected (B, Hkv, T, D) = (1, 2, 'T', 8)"),
        ("append lengths", lambda: cache.append(k[:, :, :2], v[:, :, :3]), GatherValueError,
         "must have the same shape in (B, Hkv, T)"),
        ("value_dim 0", lambda: PagedKVCache(1, 1, 8, value_dim=0), GatherValueError, "value_dim = 0 must be >= 1"),
        ("value_dim float", lambda: PagedKVCache(1, 1, 8, value_dim=4.0), GatherTypeError, "value_dim must be an int"),
        ("value_dim bool", lambda: PagedKVCache(1, 1, 8, value_dim=True), GatherTypeError, "value_dim must be an int"),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())), ids=[c[0] for c in bad_calls()])
def test_bad_input_raises_clear_errors(case, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    name, call, cls, text = bad_calls()[case]
    if name == "native softcap":
        require_native(None if native_loaded() else "fused_decode.cpp did not build")
    with pytest.raises(cls) as info:
        call()
    assert isinstance(info.value, GatherLensError)
    assert text in str(info.value), str(info.value)


def test_failed_append_of_wrong_values_leaves_the_cache_unchanged():
    q, k, v, sinks, cache = make(1, 4, 2, 20, 8, 5, 4)
    before = (cache.length, cache.keys.clone(), cache.values.clone())
    with pytest.raises(GatherValueError):
        cache.append(k[:, :, :3], k[:, :, :3])
    assert cache.length == before[0] and torch.equal(cache.keys, before[1]) and torch.equal(cache.values, before[2])


# -- the Triton kernel (interpreted on CPU) ------------------------------------------------------

TRITON_CASES = {
    # id: (B, Hq, Hkv, L, D, Dv, P, budget, share, softcap, sinks)
    "softcap-gqa": (1, 4, 2, 37, 8, 8, 4, 12, True, 2.0, False),
    "sinks-per-head": (2, 4, 2, 50, 16, 16, 8, 20, False, None, True),
    "narrow-values": (1, 4, 2, 45, 16, 8, 4, 16, True, None, False),
    "wide-values-softcap-sinks": (2, 6, 3, 60, 8, 24, 8, 24, False, 5.0, True),
    "full-budget-latent": (1, 4, 1, 33, 24, 16, 16, 33, True, 30.0, True),
}


def triton_inputs(case):
    B, Hq, Hkv, L, D, Dv, P = case[:7]
    return make(B, Hq, Hkv, L, D, Dv, P, seed=L)


def _child(out_path: str) -> None:
    """Run every case through the Triton kernel (interpreted) and save the results."""
    from gatherlens.ops.sparse.decode import sparse_decode_triton

    results = {}
    for name, case in TRITON_CASES.items():
        q, k, v, sinks, cache = triton_inputs(case)
        budget, share, softcap, use_sinks = case[7:]
        out, lse, sel = sparse_decode_triton(q, cache, budget, share_selection=share, return_lse=True,
                                             return_selection=True, softcap=softcap,
                                             sinks=sinks if use_sinks else None)
        results[name] = {"out": out, "lse": lse, "pages": sel.pages}
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    return interpreted_results(__file__, tmp_path_factory)


@pytest.mark.slow  # a subprocess: Triton's interpreter
@pytest.mark.parametrize("name", list(TRITON_CASES))
def test_triton_matches_torch_path_and_reference(triton_results, name):
    case = TRITON_CASES[name]
    q, k, v, sinks, cache = triton_inputs(case)
    B, Hq, Hkv, L, D, Dv, P, budget, share, softcap, use_sinks = case
    sinks = sinks if use_sinks else None
    got = triton_results[name]
    out, lse, sel = sparse_decode(q, cache, budget, share_selection=share, return_lse=True, return_selection=True,
                                  softcap=softcap, sinks=sinks, backend="torch")
    assert torch.equal(got["pages"], sel.pages)
    assert got["out"].shape == (B, Hq, 1, Dv) and got["out"].dtype == q.dtype
    torch.testing.assert_close(got["out"], out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["lse"], lse, atol=1e-5, rtol=1e-5)
    ref, ref_lse = sparse_attention_reference(q, k, v, got["pages"], P, softcap=softcap, sinks=sinks)
    torch.testing.assert_close(got["out"], ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["lse"], ref_lse, atol=1e-5, rtol=1e-5)


if __name__ == "__main__":
    _child(sys.argv[1])
