"""The native (C++) path of sparse decode against the torch path and the float64 reference:
the same pages, the same attention up to float rounding, the operator as PyTorch sees it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from native_helpers import needs_native

from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse import fused_decode
from gatherlens.ops.sparse.decode import sparse_decode_native
from gatherlens.ops.sparse.geometry import page_count
from gatherlens.ops.sparse.naive import sparse_attention_reference

pytestmark = needs_native(fused_decode)


def make(B=1, Hkv=2, G=3, L=37, D=8, P=4, seed=0, chunks=None):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, Hkv, L, D, generator=g)  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, D, generator=g)  # (B, Hkv, L, D)
    q = torch.randn(B, Hkv * G, 1, D, generator=g)  # (B, Hq, 1, D)
    cache = PagedKVCache(B, Hkv, D, page_size=P)
    s = 0
    for t in chunks or [L]:
        cache.append(k[:, :, s:s + t], v[:, :, s:s + t])
        s += t
    return q, k, v, cache


def both(q, cache, budget, **kw):
    """(native, torch) results of the same call, each with lse and selection."""
    a = sparse_decode(q, cache, budget, return_lse=True, return_selection=True, backend="native", **kw)
    b = sparse_decode(q, cache, budget, return_lse=True, return_selection=True, backend="torch", **kw)
    return a, b


CASES = [  # (B, Hkv, G, L, D, P, budget)
    (1, 3, 3, 4100, 64, 8, 512), (2, 2, 4, 37, 16, 4, 9), (1, 1, 1, 5, 8, 16, 100), (3, 1, 5, 301, 7, 16, 40),
    (1, 2, 2, 64, 5, 8, 1), (2, 3, 1, 1000, 33, 32, 256), (1, 1, 2, 17, 3, 1, 6),
]


@pytest.mark.parametrize("share", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("group_score", ["max", "sum"])
@pytest.mark.parametrize("B,Hkv,G,L,D,P,budget", CASES, ids=lambda x: str(x))
def test_native_equals_torch_and_the_reference(B, Hkv, G, L, D, P, budget, share, group_score):
    q, k, v, cache = make(B, Hkv, G, L, D, P, chunks=[L // 2, L - L // 2] if L > 1 else None)
    recent = budget // 4
    (o, lse, sel), (o2, lse2, sel2) = both(q, cache, budget, share_selection=share, group_score=group_score,
                                          recent=recent)
    assert torch.equal(sel.pages, sel2.pages)
    torch.testing.assert_close(sel.bounds, sel2.bounds, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse2, atol=1e-5, rtol=1e-5)
    ref, ref_lse = sparse_attention_reference(q, k, v, sel.pages, P)
    torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 2), Hkv=st.integers(1, 3), G=st.integers(1, 4), L=st.integers(1, 200),
       D=st.integers(1, 20), P=st.sampled_from([1, 2, 3, 8, 16]), budget=st.integers(1, 220),
       share=st.booleans(), recent=st.integers(0, 64), seed=st.integers(0, 2 ** 16))
def test_native_matches_torch_on_any_shape(B, Hkv, G, L, D, P, budget, share, recent, seed):
    q, k, v, cache = make(B, Hkv, G, L, D, P, seed=seed)
    (o, lse, sel), (o2, lse2, sel2) = both(q, cache, budget, share_selection=share, recent=recent)
    assert torch.equal(sel.pages, sel2.pages)
    torch.testing.assert_close(o, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("Hkv,G,D,L,budget,mass", [
    (2, 7, 64, 1500, 1500, None),   # Qwen2.5 0.5B's group: every head reads every page (their union, once)
    (2, 7, 64, 1500, 96, None),     # small per-head choices, mostly apart (a page summed for its own heads)
    (1, 4, 256, 700, 512, 0.998),   # Gemma 3's one KV head, head_dim 256, the auto budget (their union)
    (8, 4, 128, 900, 512, 0.3),     # Llama 3's group of 4 at head_dim 128, the auto budget stopping early:
    (2, 4, 16, 900, 512, 0.6),      # heads with their own counts, read together (above) or apart (here)
], ids=str)
def test_wide_groups_with_per_head_choices_equal_the_reference(Hkv, G, D, L, budget, mass):
    """Per-head choices in a wide KV group: read once for the group over the union of its heads' pages (in
    groups above 4, each page's logits and values summed for the heads that chose it: fused_decode.cpp's
    group_union, page_logits, page_values; in smaller ones every head's, the others masked) or head by head,
    whichever costs less: either way exactly the attention of each head's own pages."""
    q, k, v, cache = make(B=1, Hkv=Hkv, G=G, L=L, D=D, P=8, seed=G + L)
    q = q * 4  # peaked scores: heads of a group choose differently
    kw = dict(share_selection=False, recent=16, mass=mass, min_pages=2) if mass else dict(share_selection=False,
                                                                                          recent=16)
    (o, lse, sel), (o2, lse2, sel2) = both(q, cache, budget, **kw)
    assert torch.equal(sel.pages, sel2.pages)
    torch.testing.assert_close(o, o2, atol=1e-5, rtol=1e-5)
    ref, ref_lse = sparse_attention_reference(q, k, v, sel.pages, 8) if mass is None else (None, None)
    if mass is None:  # fixed budgets: every row of pages is a full choice (no -1 padding)
        torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_auto_takes_native_on_a_float32_cpu_cache(monkeypatch):
    q, _, _, cache = make(L=300, D=16, P=8)
    calls = []
    real = torch.ops.gatherlens.paged_decode
    monkeypatch.setattr(fused_decode.torch.ops.gatherlens, "paged_decode",
                        lambda *a: calls.append(1) or real(*a), raising=False)
    sparse_decode(q, cache, 64)
    assert calls


@pytest.mark.parametrize("value,what", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_non_finite_keys_rank_as_the_torch_path_ranks_them(value, what):
    q, k, v, cache = make(Hkv=1, G=2, L=160, D=8, P=8, seed=3)
    k2 = k.clone()
    k2[0, 0, 40:48] = value  # page 5 holds a non-finite key
    c = PagedKVCache(1, 1, 8, page_size=8)
    c.append(k2, v)
    (o, lse, sel), (o2, lse2, sel2) = both(q, c, 48, share_selection=False, recent=8)
    assert torch.equal(sel.pages, sel2.pages)
    assert torch.equal(o.isnan(), o2.isnan())


def test_budget_covering_the_cache_is_dense_in_place():
    q, k, v, cache = make(L=50, D=8, P=4)
    out = sparse_decode_native(q, cache, budget=50)
    ref, _ = sparse_attention_reference(q, k, v, torch.arange(13).expand(1, 2, 13), 4)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_native_refuses_what_it_does_not_compute():
    q, _, _, cache = make(L=40, D=8, P=4)
    with pytest.raises(GatherValueError, match="key_mask"):
        sparse_decode(q, cache, 16, backend="native", key_mask=torch.ones(1, 40, dtype=torch.bool))
    half = PagedKVCache(1, 2, 8, page_size=4, dtype=torch.bfloat16)
    half.append(torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8))
    with pytest.raises(GatherValueError, match="float32"):
        sparse_decode(q, half, 16, backend="native")
    with pytest.raises(GatherValueError, match="backend"):
        sparse_decode(q, cache, 16, backend="c++")


def test_a_query_that_needs_gradients_takes_the_torch_path():
    q, _, _, cache = make(L=40, D=8, P=4)
    q.requires_grad_(True)
    out = sparse_decode(q, cache, 16)
    out.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_the_operator_passes_opcheck_and_compiles_with_its_fake_kernel():
    q, _, _, cache = make(L=90, D=8, P=4)
    args = (q.reshape(1, 6, 8).contiguous(), cache.page_keys, cache.page_values, cache.summaries, cache.length,
            10, 20, 0.35, True, False)
    torch.library.opcheck(torch.ops.gatherlens.paged_decode.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))

    def f(qq):
        return torch.ops.gatherlens.paged_decode(qq, *args[1:])[0] * 2

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(args[0]), f(args[0]))


def test_the_operator_checks_its_inputs_with_a_clear_message():  # a length past the storage
    q, _, _, cache = make(L=90, D=8, P=4)
    with pytest.raises(RuntimeError, match="length"):
        torch.ops.gatherlens.paged_decode(q.reshape(1, 6, 8).contiguous(), cache.page_keys, cache.page_values,
                                          cache.summaries, 1000, 4, 5, 1.0, True, False)


@pytest.mark.parametrize("share", [False, True], ids=["per-head", "shared"])
def test_values_of_another_width_latent_attention(share):
    g = torch.Generator().manual_seed(5)
    k, v = torch.randn(1, 2, 70, 12, generator=g), torch.randn(1, 2, 70, 5, generator=g)  # Dk 12, Dv 5
    q = torch.randn(1, 4, 1, 12, generator=g)
    cache = PagedKVCache(1, 2, 12, page_size=8, value_dim=5)
    cache.append(k, v)
    (o, lse, sel), (o2, lse2, sel2) = both(q, cache, 24, share_selection=share, recent=8)
    assert o.shape == (1, 4, 1, 5) and torch.equal(sel.pages, sel2.pages)
    torch.testing.assert_close(o, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("L,P,G", [(1, 4, 3), (37, 4, 2), (1100, 8, 3), (513, 16, 1)], ids=str)
def test_dense_in_place_equals_the_reference(L, P, G):
    q, k, v, cache = make(B=2, Hkv=2, G=G, L=L, D=8, P=P, seed=L)
    out, lse = fused_decode.fused_dense(q, cache, 0.3)
    n = page_count(L, P)  # every page
    ref, ref_lse = sparse_attention_reference(q, k, v, torch.arange(n).expand(2, 2, n), P, scale=0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("budget", [16, 64, 10 ** 6], ids=["sparse", "sparse-64", "dense"])
@pytest.mark.parametrize("share", [False, True], ids=["per-head", "shared"])
def test_the_models_decode_step_is_sparse_decode(budget, share):
    from gatherlens.ops.sparse.config import SparseConfig

    q, k, v, cache = make(Hkv=3, G=3, L=300, D=16, P=8, seed=2)
    config = SparseConfig(budget=min(budget, 300), share_selection=share, dense_layers=0)
    from gatherlens.ops.backends import reset_ran, ran
    from gatherlens.ops.sparse.decode import decode_pages

    reset_ran()
    fast = decode_pages(q, cache, min(budget, 300), config.choice, 0.25)[2]  # the model's entrance
    assert ran()["sparse_decode"] == {"native": 1}  # the table picked the operator
    ref = sparse_decode(q, cache, min(budget, 300), scale=0.25, config=config, backend="torch")
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("share", [False, True], ids=["per-head", "shared"])
@pytest.mark.parametrize("ties", ["integer-keys", "random"])
def test_long_caches_choose_the_torch_paths_pages(share, ties):
    """Past 1,024 candidate pages (fused_decode.cpp's `choose`: the budget's best by a radix select of their
    ranks, then one scan): still exactly the pages of the rule, ties at the cut included."""
    g = torch.Generator().manual_seed(7)
    L = 12_000
    k = torch.randn(1, 2, L, 16, generator=g)  # (B, Hkv, L, D)
    if ties == "integer-keys":
        k = k.round().clamp(-1, 1)  # a few distinct page boxes: long runs of equal bounds
    cache = PagedKVCache(1, 2, 16, page_size=4)
    cache.append(k, torch.randn(1, 2, L, 16, generator=g))
    q = torch.randn(1, 6, 1, 16, generator=g).round()  # (B, Hq, 1, D)
    pages = [sparse_decode(q, cache, 700, share_selection=share, return_selection=True, backend=b)[1].pages
             for b in ("native", "torch")]
    assert torch.equal(*pages)
