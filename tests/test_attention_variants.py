"""topk_attention's variants of today's decoders: soft-capping (Gemma 2), attention sinks
(GPT-OSS) and values of another width than the keys (latent attention), on every path, against
transformers' eager attention at full k and the plain-loop references at any k."""
from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from lanes import sweep

from gatherlens.errors import GatherLensError, GatherTypeError, GatherValueError
from gatherlens.ops.attention import chunked, sparse_sum, topk_attention
from gatherlens.ops.attention.naive import dense_masked_attention, naive_topk_attention

PATHS = ["sparse", "chunked"]   # the CPU threshold path, and the chunked reference path (decode: by shape)


def qkv(B, Hq, Hkv, Q, L, D, Dv=None, dtype=torch.float64, seed=0, spread=2.0):
    """Random inputs; `spread` scales q and k so the logits reach the cap's curved part."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, Q, D, generator=g) * spread).to(dtype)   # (B, Hq, Q, D)
    k = (torch.randn(B, Hkv, L, D, generator=g) * spread).to(dtype)  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, Dv or D, generator=g).to(dtype)       # (B, Hkv, L, Dv)
    sinks = torch.randn(Hq, generator=g).to(dtype)                    # (Hq,)
    return q, k, v, sinks


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Run a test on the sparse (CPU) path or on the chunked path with many small chunks."""
    if request.param == "chunked":
        monkeypatch.setattr(sparse_sum, "ENABLED", False)
        monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 64)
    return request.param


def causal_additive(Q, L, dtype):
    """SDPA's top-left causal rule as an additive (Q, L) mask, as transformers passes it."""
    keep = torch.ones(Q, L, dtype=torch.bool).tril()           # (Q, L)
    return torch.zeros(Q, L, dtype=dtype).masked_fill(~keep, -math.inf)


def eager_softcap(q, k, v, softcap, mask=None):
    """Gemma 2's eager attention (transformers) if it imports offline; else the same lines here."""
    G = q.shape[1] // k.shape[1]
    module = types.SimpleNamespace(num_key_value_groups=G, head_dim=q.shape[-1], training=False)
    try:
        from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward
    except Exception:
        s = q @ k.repeat_interleave(G, 1).transpose(-1, -2) * q.shape[-1] ** -0.5  # (B, Hq, Q, L)
        s = softcap * torch.tanh(s / softcap) + (0 if mask is None else mask)
        return torch.softmax(s.float(), -1).to(q.dtype) @ v.repeat_interleave(G, 1)
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5, softcap=softcap)
    return out.transpose(1, 2)                                  # (B, Hq, Q, Dv)


def eager_sinks(q, k, v, sinks, mask=None):
    """GPT-OSS's eager attention (transformers) if it imports offline; else the same lines here."""
    G = q.shape[1] // k.shape[1]
    module = types.SimpleNamespace(num_key_value_groups=G, training=False, sinks=sinks)
    try:
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    except Exception:
        s = q @ k.repeat_interleave(G, 1).transpose(-1, -2) * q.shape[-1] ** -0.5  # (B, Hq, Q, L)
        s = s + (0 if mask is None else mask)
        col = sinks.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)  # (B, Hq, Q, 1)
        w = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]  # (B, Hq, Q, L)
        return w @ v.repeat_interleave(G, 1)
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2)                                  # (B, Hq, Q, Dv)


# -- full k equals dense attention of transformers ---------------------------------------------

FULL_CASES = [
    # (B, Hq, Hkv, Q, L, D, Dv, causal)
    (1, 1, 1, 1, 1, 4, 4, False),
    (2, 4, 2, 7, 7, 8, 8, True),
    (2, 6, 2, 5, 11, 8, 5, True),        # Q < L, values narrower than keys
    (1, 3, 1, 13, 9, 6, 10, True),       # Q > L, values wider
    (1, 8, 2, 1, 300, 16, 12, False),    # decode against a cache
    (2, 4, 4, 3, 70, 8, 8, False),       # a few queries (the decode path)
]
FULL_IDS = ["B{}-H{}x{}-Q{}-L{}-D{}-Dv{}-causal{}".format(*c) for c in FULL_CASES]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("softcap", [1.0, 5.0, 50.0], ids=lambda c: f"softcap{c}")
@pytest.mark.parametrize("case", FULL_CASES, ids=FULL_IDS)
def test_full_k_softcap_equals_gemma2_eager(case, softcap, dtype, path):
    B, Hq, Hkv, Q, L, D, Dv, causal = case
    q, k, v, _ = qkv(B, Hq, Hkv, Q, L, D, Dv, dtype)
    mask = causal_additive(Q, L, dtype) if causal else None
    ref = eager_softcap(q, k, v, softcap, mask)                 # (B, Hq, Q, Dv)
    for top_k in (L, L + 3):
        out = topk_attention(q, k, v, top_k, is_causal=causal, enable_gqa=Hq != Hkv, softcap=softcap)
        assert out.shape == (B, Hq, Q, Dv)
        torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-6)  # eager's softmax runs in float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", FULL_CASES, ids=FULL_IDS)
def test_full_k_sinks_equal_gpt_oss_eager(case, dtype, path):
    B, Hq, Hkv, Q, L, D, Dv, causal = case
    q, k, v, sinks = qkv(B, Hq, Hkv, Q, L, D, Dv, dtype, spread=1.0)
    mask = causal_additive(Q, L, dtype) if causal else None
    ref = eager_sinks(q, k, v, sinks, mask)                     # (B, Hq, Q, Dv)
    out, sel = topk_attention(q, k, v, L, is_causal=causal, enable_gqa=Hq != Hkv, sinks=sinks,
                              return_selection=True)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    share = torch.exp(sinks.view(1, Hq, 1).to(sel.lse.dtype) - sel.lse)  # (B, Hq, Q) the sink's weight
    torch.testing.assert_close(sel.weights.sum(-1) + share, torch.ones_like(share))


@pytest.mark.parametrize("case", FULL_CASES, ids=FULL_IDS)
def test_value_width_full_k_equals_sdpa(case, path):
    B, Hq, Hkv, Q, L, D, Dv, causal = case
    q, k, v, _ = qkv(B, Hq, Hkv, Q, L, D, Dv, torch.float32, spread=1.0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
    out = topk_attention(q, k, v, L, is_causal=causal, enable_gqa=Hq != Hkv)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# -- any k: the fast paths against the per-query loop -----------------------------------------

@given(
    B=st.integers(1, 2), Hkv=st.integers(1, 2), G=st.sampled_from([1, 2, 3]), Q=st.integers(1, 9),
    L=st.integers(1, 40), D=st.integers(1, 6), Dv=st.integers(1, 7), top_k=st.integers(1, 12),
    causal=st.booleans(), softcap=st.sampled_from([None, 1.0, 3.0, 30.0]), use_sinks=st.booleans(),
    share=st.booleans(), chunked_path=st.booleans(), seed=st.integers(0, 999),
)
def test_fast_paths_match_the_loop(B, Hkv, G, Q, L, D, Dv, top_k, causal, softcap, use_sinks, share,
                                   chunked_path, seed):
    # spread 1: logits short of the cap's flat ends, where float32 group sums (naive.py) could tie
    q, k, v, sinks = qkv(B, Hkv * G, Hkv, Q, L, D, Dv, seed=seed, spread=1.0)
    sinks = sinks if use_sinks else None
    kw = dict(is_causal=causal, enable_gqa=G > 1, share_selection=share, softcap=softcap, sinks=sinks)
    before = sparse_sum.ENABLED
    sparse_sum.ENABLED = not chunked_path
    try:
        out, sel = topk_attention(q, k, v, top_k, return_selection=True, **kw)
    finally:
        sparse_sum.ENABLED = before
    ref, rsel = naive_topk_attention(q, k, v, top_k, **kw)
    assert out.shape == (B, Hkv * G, Q, Dv)
    assert torch.equal(sel.indices, rsel.indices)
    tol = 2e-6                                                  # naive.py's softmax runs in float32
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    torch.testing.assert_close(sel.lse, rsel.lse, atol=tol, rtol=tol)
    torch.testing.assert_close(sel.weights, rsel.weights, atol=tol, rtol=tol)


@pytest.mark.parametrize("top_k", [1, 3, 8], ids=lambda k: f"k{k}")
@pytest.mark.parametrize("softcap", [None, 2.0], ids=["no-cap", "softcap2"])
def test_cap_ranks_the_capped_logits_and_keeps_the_order(softcap, top_k, path):
    """The cap is monotonic: one row keeps the same keys with and without it; the scores are capped."""
    q, k, v, _ = qkv(2, 4, 2, 6, 23, 8, 5, seed=3)
    _, plain = topk_attention(q, k, v, top_k, enable_gqa=True, return_selection=True)
    _, sel = topk_attention(q, k, v, top_k, enable_gqa=True, softcap=softcap, return_selection=True)
    assert torch.equal(sel.indices, plain.indices)
    want = plain.scores if softcap is None else softcap * torch.tanh(plain.scores / softcap)
    torch.testing.assert_close(sel.scores, want)
    assert sel.meta.get("softcap") == softcap


def test_minus_infinite_sinks_change_nothing(path):
    q, k, v, sinks = qkv(1, 4, 2, 5, 30, 8, 6, torch.float32)
    plain = topk_attention(q, k, v, 7, enable_gqa=True, is_causal=True)
    none = topk_attention(q, k, v, 7, enable_gqa=True, is_causal=True, sinks=torch.full_like(sinks, -math.inf))
    torch.testing.assert_close(none, plain)                      # the lse-keeping sum: other rounding


def test_defaults_are_the_plain_call_bit_for_bit(path):
    q, k, v, _ = qkv(2, 6, 2, 9, 40, 8, 8, torch.float32)
    for top_k in (1, 5, 40):
        a, sa = topk_attention(q, k, v, top_k, enable_gqa=True, return_selection=True)
        b, sb = topk_attention(q, k, v, top_k, enable_gqa=True, return_selection=True, softcap=None, sinks=None)
        assert torch.equal(a, b) and torch.equal(sa.indices, sb.indices) and torch.equal(sa.lse, sb.lse)
        assert sa.meta == sb.meta


def test_query_without_keys_gets_zeros_and_the_sink_as_lse():
    q, k, v, sinks = qkv(1, 2, 1, 4, 3, 5, 4)
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[2] = False                                             # query 2 may see no key
    out, sel = topk_attention(q, k, v, 2, enable_gqa=True, attn_mask=mask, sinks=sinks, return_selection=True)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    torch.testing.assert_close(sel.lse[0, :, 2], sinks)


def test_sixteen_bit_inputs_follow_the_float32_reference():
    q, k, v, sinks = qkv(1, 4, 2, 6, 50, 16, 8, torch.bfloat16)
    out = topk_attention(q, k, v, 9, enable_gqa=True, softcap=5.0, sinks=sinks)
    ref, _ = naive_topk_attention(q.float(), k.float(), v.float(), 9, enable_gqa=True, softcap=5.0,
                                  sinks=sinks.float())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


# -- gradients ---------------------------------------------------------------------------------

GRAD_CASES = [
    # (B, Hq, Hkv, Q, L, D, Dv, top_k, causal, softcap, sinks)
    (1, 2, 1, 5, 7, 4, 3, 3, True, 2.0, True),
    (2, 4, 2, 3, 9, 5, 6, 4, False, None, True),
    (1, 3, 3, 6, 6, 3, 3, 6, True, 1.5, False),
    (2, 2, 1, 2, 12, 4, 2, 5, False, 4.0, True),
]
GRAD_IDS = ["B{}-H{}x{}-Q{}-L{}-D{}-Dv{}-k{}-causal{}-softcap{}-sinks{}".format(*c) for c in GRAD_CASES]


@pytest.mark.parametrize("case", GRAD_CASES, ids=GRAD_IDS)
def test_gradients_match_dense_masked_reference(case):
    B, Hq, Hkv, Q, L, D, Dv, top_k, causal, softcap, use_sinks = case
    q, k, v, sinks = qkv(B, Hq, Hkv, Q, L, D, Dv, seed=1)
    a = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    b = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out, sel = topk_attention(a[0], a[1], a[2], top_k, is_causal=causal, enable_gqa=Hq != Hkv, softcap=softcap,
                              sinks=a[3] if use_sinks else None, return_selection=True)
    assert sel.meta["path"] == "autograd"
    ref = dense_masked_attention(b[0], b[1], b[2], sel.indices, softcap=softcap, sinks=b[3] if use_sinks else None)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    for name, x, y in zip(("query", "key", "value", "sinks"), a, b):
        if name == "sinks" and not use_sinks:
            assert x.grad is None
            continue
        torch.testing.assert_close(x.grad, y.grad, atol=1e-12, rtol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("case", sweep(GRAD_CASES[:2], fast=GRAD_CASES[0]), ids=GRAD_IDS[:2])
def test_gradcheck(case):
    B, Hq, Hkv, Q, L, D, Dv, top_k, causal, softcap, use_sinks = case
    q, k, v, sinks = qkv(B, Hq, Hkv, Q, L, D, Dv, seed=2, spread=1.0)

    def f(q, k, v, sinks):
        return topk_attention(q, k, v, top_k, is_causal=causal, enable_gqa=Hq != Hkv, softcap=softcap, sinks=sinks)

    assert torch.autograd.gradcheck(f, tuple(t.requires_grad_() for t in (q, k, v, sinks)))


def test_gradient_of_sinks_alone():
    q, k, v, sinks = qkv(1, 4, 2, 3, 20, 8, 4, seed=5)
    s1, s2 = sinks.clone().requires_grad_(), sinks.clone().requires_grad_()
    out, sel = topk_attention(q, k, v, 6, enable_gqa=True, sinks=s1, return_selection=True)
    ref = dense_masked_attention(q, k, v, sel.indices, sinks=s2)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(s1.grad, s2.grad, atol=1e-12, rtol=1e-12)


# -- bad inputs --------------------------------------------------------------------------------

def bad_calls():
    q, k, v, sinks = qkv(1, 4, 2, 3, 5, 8, 6, torch.float32)
    call = lambda **kw: topk_attention(q, k, v, 2, enable_gqa=True, **kw)  # noqa: E731
    return [
        ("softcap 0", lambda: call(softcap=0.0), GatherValueError, "softcap = 0.0 is outside the valid range (0, inf)"),
        ("softcap negative", lambda: call(softcap=-1), GatherValueError, "softcap = -1"),
        ("softcap nan", lambda: call(softcap=float("nan")), GatherValueError, "softcap = nan"),
        ("softcap inf", lambda: call(softcap=math.inf), GatherValueError, "softcap = inf"),
        ("softcap bool", lambda: call(softcap=True), GatherValueError, "softcap = True"),
        ("softcap str", lambda: call(softcap="50"), GatherValueError, "softcap = '50'"),
        ("sinks per kv head", lambda: call(sinks=sinks[:2]), GatherValueError,
         "sinks has shape (2,); expected (Hq,) = (4,)"),
        ("sinks 2-D", lambda: call(sinks=sinks.view(1, 4)), GatherValueError, "sinks has shape (1, 4)"),
        ("sinks ints", lambda: call(sinks=torch.zeros(4, dtype=torch.long)), GatherTypeError, "sinks has dtype"),
        ("sinks list", lambda: call(sinks=[0.0] * 4), GatherTypeError, "sinks must be a torch.Tensor"),
        ("key width", lambda: topk_attention(q, k[..., :5], v, 2, enable_gqa=True), GatherValueError,
         "key head_dim 5 does not match query head_dim 8"),
        ("value length", lambda: topk_attention(q, k, v[:, :, :4], 2, enable_gqa=True), GatherValueError,
         "value length 4 does not match key length 5"),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())), ids=[c[0] for c in bad_calls()])
def test_bad_input_raises_clear_errors(case):
    name, call, cls, text = bad_calls()[case]
    with pytest.raises(cls) as info:
        call()
    assert isinstance(info.value, GatherLensError)
    assert text in str(info.value), str(info.value)
