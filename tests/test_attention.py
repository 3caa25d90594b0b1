"""topk_attention and apply_attention_scores against SDPA and the plain-loop references."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

from gatherlens.errors import GatherLensError, GatherTypeError, GatherValueError
from gatherlens.ops.attention import AttentionSelection, apply_attention_scores, topk_attention
from gatherlens.ops.attention import chunked
from gatherlens.ops.attention.select import partial
from gatherlens.ops.attention.naive import (
    dense_masked_attention,
    naive_apply_attention_scores,
    naive_topk_attention,
)

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float64: 1e-10}


def qkv(B, Hq, Hkv, Q, L, D, dtype=torch.float32, seed=0, Dv=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Q, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, Dv or D, generator=g).to(dtype)
    return q, k, v


def int_qkv(B, Hq, Hkv, Q, L, D, seed=0, lo=-2, hi=2):
    """Integer-valued inputs: logits are exact whatever the summation order, and ties are common."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(lo, hi + 1, (B, Hq, Q, D), generator=g).float()
    k = torch.randint(lo, hi + 1, (B, Hkv, L, D), generator=g).float()
    v = torch.randn(B, Hkv, L, D, generator=g)
    return q, k, v


def make_mask(kind, B, Hq, Q, L, seed=0):
    """Masks that leave every row at least one key (key 0), so SDPA is defined everywhere."""
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    if kind == "bool":
        m = torch.rand(B, 1, Q, L, generator=g) > 0.4
    elif kind == "bool-per-head":
        m = torch.rand(B, Hq, Q, L, generator=g) > 0.4
    elif kind == "bool-2d":
        m = torch.rand(Q, L, generator=g) > 0.4
    elif kind == "float":
        m = torch.randn(B, 1, Q, L, generator=g)
        m[torch.rand(B, 1, Q, L, generator=g) > 0.7] = -math.inf
        m[..., 0] = 0.0
        return m
    else:
        raise ValueError(kind)
    m[..., 0] = True
    return m


@pytest.fixture
def small_chunks(monkeypatch):
    """Force many query chunks, so chunk boundaries are exercised on small inputs."""
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 64)


@pytest.fixture(params=["numpy", "torch.topk"])
def selector(request, monkeypatch):
    """Run a test with each row-selection backend."""
    monkeypatch.setattr(partial, "NUMPY_MIN_ELEMENTS", 0 if request.param == "numpy" else 10**12)
    return request.param


# -- apply_attention_scores -------------------------------------------------------------------

@given(
    B=st.integers(1, 2), H=st.integers(1, 3), Q=st.integers(1, 7), K=st.integers(1, 9),
    D=st.integers(1, 5), masked=st.sampled_from(["none", "bool", "float"]), seed=st.integers(0, 999),
)
def test_apply_attention_scores_matches_softmax_and_loop(B, H, Q, K, D, masked, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, Q, K, generator=g)
    values = torch.randn(B, H, K, D, generator=g)
    mask = None
    if masked == "bool":
        mask = torch.rand(B, 1, Q, K, generator=g) > 0.3
    elif masked == "float":
        mask = torch.randn(1, H, Q, K, generator=g)
    out = apply_attention_scores(scores, values, mask=mask)
    assert out.shape == (B, H, Q, D)
    torch.testing.assert_close(out, naive_apply_attention_scores(scores, values, mask=mask))
    if masked == "none":
        torch.testing.assert_close(out, torch.softmax(scores, -1) @ values)
    if masked == "bool":
        dead = ~mask.any(-1)                                    # (B, 1, Q)
        assert torch.equal(out[dead.expand(B, H, Q)], torch.zeros_like(out[dead.expand(B, H, Q)]))
    assert not out.isnan().any()


def test_apply_attention_scores_all_masked_row_is_zero_with_finite_grad():
    scores = torch.randn(1, 1, 2, 3, requires_grad=True)
    values = torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    out = apply_attention_scores(scores, values, mask=mask)
    assert torch.equal(out[0, 0, 1], torch.zeros(4))
    out.sum().backward()
    assert torch.isfinite(scores.grad).all()


def test_apply_attention_scores_does_not_rescale():
    scores = torch.tensor([[[[0.0, math.log(3.0)]]]])          # weights 1/4, 3/4
    values = torch.tensor([[[[4.0], [8.0]]]])
    assert apply_attention_scores(scores, values).item() == pytest.approx(7.0)


@pytest.mark.parametrize("bad", ["shape", "dtype", "mask"], ids=str)
def test_apply_attention_scores_errors(bad):
    s, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 4, 5)
    with pytest.raises(GatherLensError):
        if bad == "shape":
            apply_attention_scores(s, torch.randn(1, 2, 5, 5))
        elif bad == "dtype":
            apply_attention_scores(s.long(), v)
        else:
            apply_attention_scores(s, v, mask=torch.ones(7, 7, dtype=torch.bool))


# -- exactness against SDPA --------------------------------------------------------------------

SDPA_CASES = [
    # (B, Hq, Hkv, Q, L, D, causal, mask kind)
    (1, 1, 1, 1, 1, 4, False, "none"),
    (2, 4, 4, 7, 7, 8, True, "none"),
    (2, 6, 2, 5, 11, 16, True, "none"),        # Q < L, top-left causal
    (1, 3, 3, 13, 9, 8, True, "none"),         # Q > L
    (2, 4, 2, 9, 13, 8, False, "bool"),
    (1, 4, 4, 6, 10, 8, False, "bool-per-head"),
    (1, 2, 1, 7, 7, 5, False, "bool-2d"),
    (2, 2, 2, 8, 12, 8, False, "float"),
    (1, 8, 2, 1, 300, 32, False, "none"),      # decode
    (1, 8, 2, 3, 300, 32, False, "float"),     # a few queries against a cache
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: "B{}-H{}x{}-Q{}-L{}-D{}-causal{}-{}".format(*c))
def test_topk_covering_every_key_equals_sdpa(case, dtype, small_chunks):
    B, Hq, Hkv, Q, L, D, causal, kind = case
    q, k, v = qkv(B, Hq, Hkv, Q, L, D, dtype)
    mask = make_mask(kind, B, Hq, Q, L)
    sdpa_mask = mask if mask is None or mask.dtype == torch.bool else mask.to(dtype)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, is_causal=causal,
                                         enable_gqa=Hq != Hkv)
    for top_k in (L, L + 5):
        out = topk_attention(q, k, v, top_k, is_causal=causal, attn_mask=mask, enable_gqa=Hq != Hkv)
        assert out.dtype == dtype and out.shape == ref.shape
        torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_causal_lower_right_bias_equals_sdpa():
    q, k, v = qkv(1, 4, 2, 5, 12, 8)
    bias = causal_lower_right(5, 12)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    out, sel = topk_attention(q, k, v, 12, attn_mask=bias, enable_gqa=True, return_selection=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert (sel.indices[0, 0, 0] >= 0).sum() == 8             # first new query sees 12 - 5 + 1 keys


def test_decode_query_sees_the_whole_cache():
    """Q = 1, is_causal=False (what transformers passes while decoding) = the last position."""
    q, k, v = qkv(1, 4, 4, 1, 64, 8)
    _, sel = topk_attention(q, k, v, 64, return_selection=True)
    assert torch.equal(sel.indices.sort(-1).values[0, 0, 0], torch.arange(64))


# -- against the plain-loop reference ----------------------------------------------------------

@given(
    B=st.integers(1, 2), Hkv=st.integers(1, 2), G=st.integers(1, 3), Q=st.integers(1, 9),
    L=st.integers(1, 12), D=st.integers(1, 4), top_k=st.integers(1, 14), causal=st.booleans(),
    mask=st.sampled_from(["none", "bool", "bool-per-head", "float"]), share=st.booleans(),
    seed=st.integers(0, 10_000), chunk_elements=st.sampled_from([1, 40, 1 << 22]),
)
def test_topk_matches_loop_reference(B, Hkv, G, Q, L, D, top_k, causal, mask, share, seed,
                                     chunk_elements):
    q, k, v = int_qkv(B, Hkv * G, Hkv, Q, L, D, seed)
    m = make_mask(mask, B, Hkv * G, Q, L, seed)
    if m is not None and mask != "float":
        m[..., 0] = torch.rand(m[..., 0].shape, generator=torch.Generator().manual_seed(seed)) > 0.5
    kw = dict(is_causal=causal, attn_mask=m, scale=0.5, enable_gqa=G > 1, share_selection=share)
    ref, ref_sel = naive_topk_attention(q, k, v, top_k, **kw)
    old = chunked.CHUNK_ELEMENTS, partial.NUMPY_MIN_ELEMENTS
    chunked.CHUNK_ELEMENTS, chunked.GATHER_MAX_QUERIES = chunk_elements, 10**9
    try:
        for ratio, numpy_min in ((1, 0), (10**9, 0), (1, 10**9), (10**9, 10**9)):  # gather / dense sum,
            chunked.GATHER_RATIO = ratio                       # numpy / torch.topk selection
            partial.NUMPY_MIN_ELEMENTS = numpy_min
            out, sel = topk_attention(q, k, v, top_k, return_selection=True, **kw)
            assert torch.equal(sel.indices, ref_sel.indices)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(sel.lse, ref_sel.lse, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(sel.weights, ref_sel.weights, atol=1e-5, rtol=1e-5)
            assert torch.equal(sel.scores, ref_sel.scores)
            torch.testing.assert_close(topk_attention(q, k, v, top_k, **kw), ref, atol=1e-5, rtol=1e-5)
    finally:
        (chunked.CHUNK_ELEMENTS, partial.NUMPY_MIN_ELEMENTS), chunked.GATHER_RATIO = old, 8
        chunked.GATHER_MAX_QUERIES = 16


def test_random_floats_match_reference_on_every_path(selector):
    q, k, v = qkv(2, 8, 2, 40, 200, 16, seed=3)
    ref, rsel = naive_topk_attention(q, k, v, 17, is_causal=True, enable_gqa=True)
    for elements, ratio in ((50, 1), (50, 10**9), (1 << 24, 8)):
        chunked.CHUNK_ELEMENTS, chunked.GATHER_RATIO, chunked.GATHER_MAX_QUERIES = elements, ratio, 10**9
        try:
            out, sel = topk_attention(q, k, v, 17, is_causal=True, enable_gqa=True, return_selection=True)
            plain = topk_attention(q, k, v, 17, is_causal=True, enable_gqa=True)
        finally:
            chunked.CHUNK_ELEMENTS, chunked.GATHER_RATIO, chunked.GATHER_MAX_QUERIES = 1 << 24, 8, 16
        assert torch.equal(sel.indices, rsel.indices)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(plain, ref, atol=1e-5, rtol=1e-5)


# -- the selection record ----------------------------------------------------------------------

def test_ties_go_to_the_lower_key_index(selector):
    q = torch.ones(1, 1, 1, 2)
    k = torch.ones(1, 1, 10, 2)
    k[0, 0, 7] = 2.0                                           # one clear winner
    v = torch.arange(10.0).view(1, 1, 10, 1)
    out, sel = topk_attention(q, k, v, 4, return_selection=True)
    assert sel.indices.tolist() == [[[[7, 0, 1, 2]]]]
    # a tie across the cut: ranks are equal from key 0 on
    out, sel = topk_attention(q, torch.ones(1, 1, 300, 2), torch.randn(1, 1, 300, 3), 5,
                              return_selection=True)
    assert sel.indices.tolist() == [[[[0, 1, 2, 3, 4]]]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_ties_are_deterministic_under_heavy_ties(dtype, selector):
    q, k, v = int_qkv(1, 2, 2, 30, 500, 2, seed=1, lo=-1, hi=1)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    _, ref = naive_topk_attention(q, k, v, 37, scale=1.0)
    _, sel = topk_attention(q, k, v, 37, scale=1.0, return_selection=True)
    assert torch.equal(sel.indices, ref.indices)


def test_fewer_keys_than_k_are_padded_and_empty_rows_are_zero():
    q, k, v = qkv(1, 2, 2, 4, 6, 8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False                                            # query 2 sees nothing
    mask[3, 2:] = False                                        # query 3 sees keys 0, 1
    out, sel = topk_attention(q, k, v, 10, attn_mask=mask, return_selection=True)
    assert isinstance(sel, AttentionSelection)
    assert sel.indices.shape == (1, 2, 4, 6)                   # k > L: width L
    assert torch.equal(out[:, :, 2], torch.zeros(1, 2, 8))
    assert sel.lse[0, 0, 2] == -math.inf
    assert (sel.indices[0, 0, 2] == -1).all()
    assert sorted(sel.indices[0, 0, 3, :2].tolist()) == [0, 1] and (sel.indices[0, 0, 3, 2:] == -1).all()
    assert (sel.weights[0, 0, 3, 2:] == 0).all() and (sel.scores[0, 0, 3, 2:] == -math.inf).all()
    torch.testing.assert_close(sel.weights.sum(-1)[0, 0], torch.tensor([1.0, 1.0, 0.0, 1.0]))
    # causal rows early on: query 0 has one key
    _, sel = topk_attention(q, k, v, 3, is_causal=True, return_selection=True)
    assert sel.indices[0, 0, 0].tolist() == [0, -1, -1] and sel.is_causal


def test_lse_merges_shards_exactly():
    """out over keys [0, L) from two key shards, merged with their lse: the convention later issues use."""
    q, k, v = qkv(1, 2, 2, 3, 40, 8, seed=5)
    full, sel = topk_attention(q, k, v, 40, return_selection=True)
    a, sa = topk_attention(q, k[:, :, :25], v[:, :, :25], 40, return_selection=True)
    b, sb = topk_attention(q, k[:, :, 25:], v[:, :, 25:], 40, return_selection=True)
    lse = torch.logaddexp(sa.lse, sb.lse)
    merged = a * (sa.lse - lse).exp().unsqueeze(-1) + b * (sb.lse - lse).exp().unsqueeze(-1)
    torch.testing.assert_close(merged, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, sel.lse)


def test_share_selection_picks_one_set_per_kv_group():
    q, k, v = qkv(1, 6, 2, 5, 30, 8, seed=2)
    _, sel = topk_attention(q, k, v, 4, enable_gqa=True, share_selection=True, return_selection=True)
    for g in range(2):
        heads = sel.indices[0, 3 * g: 3 * g + 3]                # (3, Q, k)
        assert torch.equal(heads.sort(-1).values, heads[:1].expand_as(heads).sort(-1).values)
    assert sel.share_selection and sel.kv_heads == 2


# -- autograd ----------------------------------------------------------------------------------

def test_gradcheck_float64(small_chunks):
    q, k, v = qkv(1, 4, 2, 5, 9, 3, torch.float64, seed=4)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    f = lambda q, k, v: topk_attention(q, k, v, 3, is_causal=True, enable_gqa=True)
    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("share", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("kind", ["none", "bool", "float"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_equal_dense_masked_reference(causal, kind, share, small_chunks, selector):
    q, k, v = qkv(2, 4, 2, 9, 14, 6, torch.float64, seed=7, Dv=5)
    mask = make_mask(kind, 2, 4, 9, 14)
    mask = mask if mask is None or mask.dtype == torch.bool else mask.double()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, sel = topk_attention(q, k, v, 4, is_causal=causal, attn_mask=mask, enable_gqa=True,
                              share_selection=share, return_selection=True)
    ref = dense_masked_attention(q, k, v, sel.indices, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_bfloat16_gradients_are_close():
    q, k, v = qkv(1, 2, 2, 6, 10, 8, torch.bfloat16, seed=8)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, sel = topk_attention(q, k, v, 4, return_selection=True)
    out.float().sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    dense_masked_attention(q64, k64, v64, sel.indices).sum().backward()
    for a, b in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(a.double(), b, atol=5e-2, rtol=5e-2)


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("top_k,exc,words", [
    (0, GatherValueError, "top_k 0"), (-3, GatherValueError, "top_k -3"),
    (True, GatherTypeError, "top_k"), (2.0, GatherTypeError, "float"), ("4", GatherTypeError, "str"),
], ids=["zero", "negative", "bool", "float", "str"])
def test_bad_top_k(top_k, exc, words):
    q, k, v = qkv(1, 1, 1, 2, 3, 4)
    with pytest.raises(exc, match=words):
        topk_attention(q, k, v, top_k)


@pytest.mark.parametrize("what", [
    "dtype", "batch", "head_dim", "value_len", "kv_heads", "gqa_divisible", "gqa_flag", "mask_shape",
    "mask_dtype", "ndim", "not_tensor", "mask_grad",
])
def test_bad_arguments_raise_clear_errors(what):
    q, k, v = qkv(2, 4, 2, 3, 5, 8)
    kw = dict(enable_gqa=True)
    if what == "dtype":
        k = k.double()
    elif what == "batch":
        v = v[:1]
    elif what == "head_dim":
        k = k[..., :4]
    elif what == "value_len":
        v = v[:, :, :4]
    elif what == "kv_heads":
        v = v[:, :1]
    elif what == "gqa_divisible":
        q = torch.randn(2, 3, 3, 8)
    elif what == "gqa_flag":
        kw = {}
    elif what == "mask_shape":
        kw["attn_mask"] = torch.ones(3, 4, dtype=torch.bool)
    elif what == "mask_dtype":
        kw["attn_mask"] = torch.ones(3, 5, dtype=torch.long)
    elif what == "ndim":
        q = q[0]
    elif what == "not_tensor":
        q = q.tolist()
    elif what == "mask_grad":
        kw["attn_mask"] = torch.zeros(3, 5, requires_grad=True)
    with pytest.raises(GatherLensError) as err:
        topk_attention(q, k, v, 2, **kw)
    assert len(str(err.value)) > 20


def test_gqa_error_names_the_heads():
    with pytest.raises(GatherValueError, match="query heads 3 are not a multiple of key/value heads 2"):
        topk_attention(torch.randn(1, 3, 2, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), 2,
                       enable_gqa=True)


@pytest.mark.parametrize("Q,L", [(0, 5), (3, 0), (0, 0), (1, 0)], ids=lambda x: str(x))
def test_empty_queries_or_keys(Q, L):
    q, k, v = qkv(1, 2, 2, Q, L, 4)
    out, sel = topk_attention(q, k, v, 3, return_selection=True)
    assert out.shape == (1, 2, Q, 4) and sel.indices.shape == (1, 2, Q, min(3, L))
    assert torch.equal(out, torch.zeros_like(out)) and (sel.lse == -math.inf).all()
