"""Page-selected sparse decode: equals dense when the budget covers the cache, equals the
reference restricted to the chosen pages always, and the page bound really bounds."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.errors import GatherLensError, GatherTypeError, GatherValueError
from gatherlens.ops.sparse import PagedKVCache, PageSelection, pages_for_budget, sparse_decode
from gatherlens.ops.sparse.naive import (
    dense_decode_reference,
    page_bound_reference,
    page_bounds_reference,
    sparse_attention_reference,
)
from gatherlens.ops.sparse.page_choice import page_bounds, select_pages

TOL = {torch.float32: 2e-5, torch.float64: 1e-10, torch.bfloat16: 3e-2}


def make(B=1, Hq=4, Hkv=2, L=37, D=8, P=4, dtype=torch.float32, chunks=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    q = torch.randn(B, Hq, 1, D, generator=g).to(dtype)  # (B, Hq, 1, D)
    cache = PagedKVCache(B, Hkv, D, page_size=P, dtype=dtype)
    s = 0
    for t in chunks or [L]:
        cache.append(k[:, :, s:s + t], v[:, :, s:s + t])
        s += t
    assert s == L
    return q, k, v, cache


def recomputed_summaries(k: torch.Tensor, P: int):
    """Page max/min straight from the keys (B, Hkv, L, D), page by page."""
    L = k.shape[2]
    if L == 0:
        return k[:, :, :0], k[:, :, :0]
    hi = torch.stack([k[:, :, s:s + P].amax(dim=2) for s in range(0, L, P)], dim=2)  # (B, Hkv, N, D)
    lo = torch.stack([k[:, :, s:s + P].amin(dim=2) for s in range(0, L, P)], dim=2)  # (B, Hkv, N, D)
    return hi, lo


# -- dense when the budget covers the cache -----------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "B,Hq,Hkv,L,D,P",
    [(1, 4, 2, 37, 8, 4), (2, 8, 8, 16, 16, 16), (1, 32, 8, 300, 128, 16), (3, 6, 2, 1, 5, 16),
     (1, 3, 1, 33, 7, 32)],
    ids=lambda x: str(x),
)
@pytest.mark.parametrize("extra", [0, 1, 1000], ids=["budget=L", "budget=L+1", "budget=L+1000"])
def test_budget_covering_cache_is_dense(B, Hq, Hkv, L, D, P, dtype, extra):
    q, k, v, cache = make(B, Hq, Hkv, L, D, P, dtype)
    out, lse = sparse_decode(q, cache, budget=L + extra, return_lse=True)
    ref, ref_lse = dense_decode_reference(q, k, v)
    assert out.shape == (B, Hq, 1, D) and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref.double(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    if dtype != torch.bfloat16:
        sdpa = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # (B, Hq, 1, D)
        torch.testing.assert_close(out, sdpa, atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)


# -- equals the reference restricted to the chosen pages ---------------------------------------

@given(
    B=st.integers(1, 2), Hkv=st.integers(1, 3), G=st.sampled_from([1, 2, 4]), L=st.integers(1, 90),
    D=st.sampled_from([1, 3, 8, 16]), P=st.sampled_from([1, 2, 4, 5, 16]), budget=st.integers(1, 100),
    share=st.booleans(), group_score=st.sampled_from(["max", "sum"]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), seed=st.integers(0, 99),
)
def test_matches_reference_on_chosen_pages(B, Hkv, G, L, D, P, budget, share, group_score, dtype, seed):
    q, k, v, cache = make(B, G * Hkv, Hkv, L, D, P, dtype, seed=seed)
    out, lse, sel = sparse_decode(q, cache, budget=budget, share_selection=share, return_lse=True,
                                  return_selection=True, group_score=group_score)
    ref, ref_lse = sparse_attention_reference(q, k, v, sel.pages, P)
    torch.testing.assert_close(out.double(), ref.double(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse, ref_lse, atol=1e-4 if dtype != torch.bfloat16 else 2e-2, rtol=1e-4)
    # the choice is within budget (or the 2 pages always kept) and the pages are distinct, sorted
    N = -(-L // P)
    assert sel.pages.shape == (B, Hkv if share else G * Hkv, pages_for_budget(budget, L, P))
    assert sel.tokens_read <= max(budget, min(L, P + (L - (N - 1) * P)))
    assert bool((sel.pages.diff(dim=-1) > 0).all())


def masked_reference(q, k, v, pages, P, key_mask):
    """float64 attention over the chosen pages' keys that key_mask (B, L) allows; a row with no
    key left is 0 with lse -inf."""
    B, Hq, _, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G, Hsel = Hq // Hkv, pages.shape[1]
    page_of = torch.arange(L) // P  # (L,)
    keep = (page_of.view(1, 1, 1, L) == pages.unsqueeze(-1)).any(dim=2)  # (B, Hsel, L)
    keep = keep.repeat_interleave(Hq // Hsel, dim=1) & key_mask[:, None, :]  # (B, Hq, L)
    kk, vv = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)  # (B, Hq, L, D)
    logits = (q.double() @ kk.transpose(-1, -2)) / D ** 0.5  # (B, Hq, 1, L)
    logits = logits.masked_fill(~keep.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # (B, Hq, 1)
    w = torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0)  # (B, Hq, 1, L)
    return w @ vv, lse.float()


@given(B=st.integers(1, 3), Hkv=st.integers(1, 2), G=st.sampled_from([1, 2]), L=st.integers(1, 60),
       P=st.sampled_from([1, 4, 16]), budget=st.integers(1, 70), share=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), seed=st.integers(0, 99))
def test_key_mask_gives_masked_keys_no_weight(B, Hkv, G, L, P, budget, share, dtype, seed):
    q, k, v, cache = make(B, G * Hkv, Hkv, L, 8, P, dtype, seed=seed)
    key_mask = torch.rand(B, L, generator=torch.Generator().manual_seed(seed)) > 0.4  # (B, L)
    out, lse, sel = sparse_decode(q, cache, budget=budget, share_selection=share, return_lse=True,
                                  return_selection=True, key_mask=key_mask)
    _, sel_plain = sparse_decode(q, cache, budget=budget, share_selection=share, return_selection=True)
    assert torch.equal(sel.pages, sel_plain.pages)  # the mask does not change which pages are read
    ref, ref_lse = masked_reference(q, k, v, sel.pages, P, key_mask)
    torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse, ref_lse, atol=1e-4 if dtype != torch.bfloat16 else 2e-2, rtol=1e-4)


def test_all_true_key_mask_equals_no_mask():
    q, k, v, cache = make(B=2, Hq=4, Hkv=2, L=37, D=8, P=4)
    ones = torch.ones(2, 37, dtype=torch.bool)
    out, lse = sparse_decode(q, cache, budget=12, return_lse=True, key_mask=ones)
    out0, lse0 = sparse_decode(q, cache, budget=12, return_lse=True)
    torch.testing.assert_close(out, out0, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, lse0, atol=1e-6, rtol=1e-5)


def test_gather_pages_returns_the_pages_tokens():
    q, k, v, cache = make(B=2, Hq=4, Hkv=2, L=37, D=8, P=4)
    pages = torch.tensor([[[0, 3, 9]], [[1, 2, 9]]]).expand(2, 4, 3)  # (B, Hsel=Hq, n): head h reads KV h // 2
    kg, vg = cache.gather_pages(pages)  # (B, 4, 12, D)
    pos = cache.page_positions(pages)  # (B, 4, 12)
    inside = pos < 37
    for b in range(2):
        for h in range(4):
            want = pos[b, h][inside[b, h]]
            assert torch.equal(kg[b, h][inside[b, h]], k[b, h // 2, want])
            assert torch.equal(vg[b, h][inside[b, h]], v[b, h // 2, want])


def test_scale_is_passed_through():
    q, k, v, cache = make(L=40)
    out, sel = sparse_decode(q, cache, budget=12, scale=0.3, return_selection=True)
    ref, _ = sparse_attention_reference(q, k, v, sel.pages, 4, scale=0.3)
    torch.testing.assert_close(out, ref)


# -- the page bound really bounds ------------------------------------------------------------

@given(
    T=st.integers(1, 16), D=st.integers(1, 24), seed=st.integers(0, 10_000),
    spread=st.sampled_from([0.01, 1.0, 100.0]),
)
def test_page_bound_bounds_every_score(T, D, seed, spread):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(D, generator=g, dtype=torch.float64) * spread  # (D,)
    keys = torch.randn(T, D, generator=g, dtype=torch.float64) * spread  # (T, D)
    bound = page_bound_reference(q, keys)
    scores = keys @ q  # (T,)
    assert bool((scores <= bound + 1e-9 * (1 + bound.abs())).all())
    # the cache's matmul form computes the same bound (one query, one page)
    cache = PagedKVCache(1, 1, D, page_size=16, dtype=torch.float64)
    cache.append(keys.view(1, 1, T, D), keys.view(1, 1, T, D))
    fast = page_bounds(q.view(1, 1, 1, D), cache.summaries)[0, 0, 0, 0]
    torch.testing.assert_close(fast, bound)


def test_page_bounds_match_reference_for_every_page():
    q, k, v, cache = make(B=1, Hq=2, Hkv=1, L=53, D=16, P=8, dtype=torch.float64)
    fast = page_bounds(q.view(1, 1, 2, 16), cache.summaries)  # (1, 1, 2, N)
    for h in range(2):
        ref = page_bounds_reference(q[0, h, 0], k[0, 0], 8)  # (N,)
        torch.testing.assert_close(fast[0, 0, h], ref)
        scores = (k[0, 0] @ q[0, h, 0]).view(-1)  # (L,)
        for p in range(ref.shape[0]):
            assert bool((scores[p * 8:(p + 1) * 8] <= ref[p] + 1e-9).all())


# -- the cache: incremental summaries, growth ------------------------------------------------

@given(chunks=st.lists(st.integers(0, 23), min_size=1, max_size=8), P=st.sampled_from([1, 3, 4, 16]),
       seed=st.integers(0, 99))
def test_incremental_summaries_equal_recomputed(chunks, P, seed):
    L = sum(chunks)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 2, L, 5, generator=g)  # (B, Hkv, L, D)
    cache = PagedKVCache(2, 2, 5, page_size=P, capacity=0)
    s = 0
    for t in chunks:
        cache.append(k[:, :, s:s + t], k[:, :, s:s + t] * 2)
        s += t
        hi, lo = recomputed_summaries(k[:, :, :s], P)
        assert torch.equal(cache.key_max, hi) and torch.equal(cache.key_min, lo)
        assert torch.equal(cache.keys, k[:, :, :s]) and torch.equal(cache.values, 2 * k[:, :, :s])
    assert cache.length == L == len(cache)
    assert cache.num_pages == -(-L // P)


def test_append_touches_only_the_pages_it_writes():
    """A poisoned summary of an untouched page survives appends: the cache is never rescanned."""
    q, k, v, cache = make(L=40, P=4)
    cache.summaries[:, :, 2] = 123.0  # page 2 (tokens 8..11), not touched by later appends
    cache.append(k[:, :, :7], v[:, :, :7])  # touches pages 10 and 11 only
    assert bool((cache.summaries[:, :, 2] == 123.0).all())
    hi, lo = recomputed_summaries(torch.cat([k, k[:, :, :7]], dim=2), 4)
    assert torch.equal(cache.key_max[:, :, 10:], hi[:, :, 10:])


def test_half_precision_cache_keeps_exact_float32_summaries_on_cpu():
    q, k, v, cache = make(L=37, dtype=torch.bfloat16)
    assert cache.summary_dtype == torch.float32 and cache.summaries.dtype == torch.float32
    hi, lo = recomputed_summaries(k, 4)
    assert torch.equal(cache.key_max, hi.float()) and torch.equal(cache.key_min, lo.float())
    same = PagedKVCache(1, 2, 8, page_size=4, dtype=torch.bfloat16, summary_dtype=torch.bfloat16)
    same.append(k, v)
    assert torch.equal(same.key_max, hi)


def test_storage_grows_by_doubling():
    cache = PagedKVCache(1, 1, 4, page_size=4, capacity=4)
    caps = []
    for _ in range(100):
        cache.append(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
        caps.append(cache.capacity)
    grows = sorted(set(caps))
    assert len(grows) <= 8  # 300 tokens from 4: log2 growth, not one per append
    assert all(b >= 2 * a for a, b in zip(grows, grows[1:]))
    assert cache.length == 300


def test_clear_and_reuse():
    q, k, v, cache = make(L=20)
    cache.clear()
    assert cache.length == 0 and cache.num_pages == 0
    cache.append(k[:, :, :5], v[:, :, :5])
    out = sparse_decode(q, cache, budget=100)
    ref, _ = dense_decode_reference(q, k[:, :, :5], v[:, :, :5])
    torch.testing.assert_close(out, ref)


# -- selection: first and last page, best bounds, GQA ---------------------------------------

@given(L=st.integers(1, 200), P=st.sampled_from([1, 4, 16]), budget=st.integers(1, 64),
       share=st.booleans(), seed=st.integers(0, 99))
def test_always_keeps_first_and_last_page(L, P, budget, share, seed):
    q, k, v, cache = make(B=2, Hq=4, Hkv=2, L=L, D=8, P=P, seed=seed)
    N = cache.num_pages
    # make the first and last page the worst possible for every query
    q = q.abs()
    cache.summaries[:, :, 0] = -1e6  # a view: writes reach the cache
    cache.summaries[:, :, N - 1] = -1e6
    pages, bounds = select_pages(q, cache, budget, share_selection=share)
    assert bool((pages[..., 0] == 0).all()) and bool((pages[..., -1] == N - 1).all())
    # every other chosen page's bound beats every page left out
    chosen = torch.zeros_like(bounds, dtype=torch.bool).scatter_(-1, pages, True)  # (B, Hsel, N)
    chosen[..., 0] = chosen[..., N - 1] = False
    left = ~torch.zeros_like(chosen).scatter_(-1, pages, True)
    for b in range(bounds.shape[0]):
        for h in range(bounds.shape[1]):
            if chosen[b, h].any() and left[b, h].any():
                assert bounds[b, h][chosen[b, h]].min() >= bounds[b, h][left[b, h]].max()


def test_gqa_shared_selection_is_the_group_max_or_sum_of_head_bounds():
    q, k, v, cache = make(B=1, Hq=8, Hkv=2, L=64, D=8, P=4, dtype=torch.float64)
    per_head = torch.stack([page_bounds_reference(q[0, h, 0], k[0, h // 4], 4) for h in range(8)])  # (8, N)
    for score, reduce in (("max", lambda x: x.amax(0)), ("sum", lambda x: x.sum(0))):
        _, sel = sparse_decode(q, cache, budget=16, group_score=score, return_selection=True)
        assert sel.pages.shape == (1, 2, 4)
        for grp in range(2):
            torch.testing.assert_close(sel.bounds[0, grp].double(), reduce(per_head[grp * 4:(grp + 1) * 4]))
    _, sel = sparse_decode(q, cache, budget=16, share_selection=False, return_selection=True)
    assert sel.pages.shape == (1, 8, 4)
    torch.testing.assert_close(sel.bounds[0].double(), per_head)


def test_per_head_equals_shared_when_each_group_has_one_head():
    q, k, v, cache = make(B=2, Hq=3, Hkv=3, L=77, D=16, P=4)
    a = sparse_decode(q, cache, budget=20, share_selection=True)
    b = sparse_decode(q, cache, budget=20, share_selection=False)
    assert torch.equal(a, b)


def test_per_head_selection_can_differ_within_a_group():
    q, k, v, cache = make(B=1, Hq=4, Hkv=1, L=160, D=16, P=4, seed=3)
    _, sel = sparse_decode(q, cache, budget=16, share_selection=False, return_selection=True)
    assert len({tuple(sel.pages[0, h].tolist()) for h in range(4)}) > 1


def test_pages_for_budget():
    assert pages_for_budget(2048, 32768, 16) == 128
    assert pages_for_budget(2048, 32770, 16) == 128  # 2-token last page + 127 whole pages
    assert pages_for_budget(20, 20, 16) == 2 and pages_for_budget(19, 20, 16) == 2
    assert pages_for_budget(1, 100, 16) == 2  # first and last always
    assert pages_for_budget(1, 10, 16) == 1  # a one-page cache
    assert pages_for_budget(10**9, 100, 16) == 7


# -- the selection record ----------------------------------------------------------------------

def test_page_selection_record_and_views():
    q, k, v, cache = make(B=2, Hq=4, Hkv=2, L=37, D=8, P=4)
    out, lse, sel = sparse_decode(q, cache, budget=12, return_lse=True, return_selection=True)
    assert isinstance(sel, PageSelection)
    assert sel.num_pages == 10 and sel.tokens_read == 9 and torch.equal(sel.lse, lse)
    assert sel.mask().sum(-1).eq(3).all()
    pos = sel.token_positions(1, 1)
    assert pos.numel() == sel.tokens_read and int(pos.max()) == 36
    rec = sel.to_record(batch=1, head=1)
    assert torch.equal(rec.gathered()[rec.valid], rec.output[rec.valid])
    assert torch.equal(rec.index, sel.pages[1, 1])
    assert "3 of 10 pages" in rec.caption
    assert "PageSelection" in repr(sel)


def test_page_selection_draws():
    pytest.importorskip("gatherlens.render.svg")
    q, k, v, cache = make(L=37)
    _, sel = sparse_decode(q, cache, budget=12, return_selection=True)
    svg = sel.to_svg()
    assert svg.lstrip().startswith("<") and "index_select" in svg
    assert "<html" in sel.to_html().lower()
    # one door: the selection draws exactly its record (trace.as_record), with record options
    from gatherlens.render import draw
    from gatherlens.trace import as_record

    assert svg == as_record(sel).to_svg() == draw(sel, "svg")
    assert sel.to_svg(lang="zh") == as_record(sel, lang="zh").to_svg()
    assert sel._repr_html_() == as_record(sel)._repr_html_()
    assert sel.to_record(batch=0, head=1).meta["head"] == 1


# -- errors --------------------------------------------------------------------------------

def bad_calls():
    q, k, v, cache = make()
    empty = PagedKVCache(1, 2, 8, page_size=4)
    return [
        ("budget=0", lambda: sparse_decode(q, cache, budget=0), GatherValueError, "budget = 0"),
        ("budget<0", lambda: sparse_decode(q, cache, budget=-5), GatherValueError, "budget = -5"),
        ("budget float", lambda: sparse_decode(q, cache, budget=1.5), GatherTypeError, "budget"),
        ("budget bool", lambda: sparse_decode(q, cache, budget=True), GatherTypeError, "budget"),
        ("page_size mismatch", lambda: sparse_decode(q, cache, budget=8, page_size=16), GatherValueError,
         "page_size = 16 does not match the cache's page_size = 4"),
        ("query 3-D", lambda: sparse_decode(q[0], cache), GatherValueError, "(B, Hq, 1, D)"),
        ("query Q=2", lambda: sparse_decode(q.expand(1, 4, 2, 8), cache), GatherValueError, "(B, Hq, 1, D)"),
        ("query D", lambda: sparse_decode(torch.randn(1, 4, 1, 9), cache), GatherValueError, "head_dim = 8"),
        ("query B", lambda: sparse_decode(torch.randn(2, 4, 1, 8), cache), GatherValueError, "batch = 1"),
        ("heads", lambda: sparse_decode(torch.randn(1, 3, 1, 8), cache), GatherValueError,
         "Hq = 3 must be a multiple of the cache's kv_heads = 2"),
        ("int query", lambda: sparse_decode(torch.ones(1, 4, 1, 8, dtype=torch.long), cache), GatherTypeError,
         "floating"),
        ("not a tensor", lambda: sparse_decode([1.0], cache), GatherTypeError, "query must be a torch.Tensor"),
        ("not a cache", lambda: sparse_decode(q, (k, v)), GatherTypeError, "PagedKVCache"),
        ("empty cache", lambda: sparse_decode(q, empty), GatherValueError, "empty"),
        ("group_score", lambda: sparse_decode(q, cache, group_score="mean"), GatherValueError, "group_score"),
        ("backend", lambda: sparse_decode(q, cache, backend="cuda"), GatherValueError, "backend"),
        ("triton on cpu", lambda: sparse_decode(q, cache, backend="triton"), GatherValueError,
         "backend = 'triton'"),
        ("key_mask shape", lambda: sparse_decode(q, cache, key_mask=torch.ones(1, 36, dtype=torch.bool)),
         GatherValueError, "expected (B, L) = (1, 37)"),
        ("key_mask dtype", lambda: sparse_decode(q, cache, key_mask=torch.ones(1, 37)), GatherTypeError,
         "torch.bool"),
        ("key_mask list", lambda: sparse_decode(q, cache, key_mask=[True]), GatherTypeError, "key_mask"),
        ("key_mask triton", lambda: sparse_decode(q, cache, backend="triton",
                                                  key_mask=torch.ones(1, 37, dtype=torch.bool)),
         GatherValueError, "backend='torch' only"),
        ("append shape", lambda: cache.append(k[0], v[0]), GatherValueError, "expected (B, Hkv, T, D)"),
        ("append heads", lambda: cache.append(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)),
         GatherValueError, "(1, 3, 2, 8)"),
        ("append k != v", lambda: cache.append(k[:, :, :2], v[:, :, :3]), GatherValueError, "same shape"),
        ("append ints", lambda: cache.append(torch.ones(1, 2, 2, 8, dtype=torch.long),
                                             torch.ones(1, 2, 2, 8, dtype=torch.long)), GatherTypeError, "floating"),
        ("append list", lambda: cache.append([1], v), GatherTypeError, "keys must be a torch.Tensor"),
        ("page_size 0", lambda: PagedKVCache(1, 1, 8, page_size=0), GatherValueError, "page_size = 0"),
        ("heads float", lambda: PagedKVCache(1, 1.5, 8), GatherTypeError, "kv_heads"),
        ("capacity", lambda: PagedKVCache(1, 1, 8, capacity=-1), GatherValueError, "capacity"),
        ("dtype", lambda: PagedKVCache(1, 1, 8, dtype=torch.int32), GatherTypeError, "dtype"),
        ("summary_dtype", lambda: PagedKVCache(1, 1, 8, summary_dtype=torch.int8), GatherTypeError,
         "summary_dtype"),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())), ids=[c[0] for c in bad_calls()])
def test_bad_input_raises_clear_errors(case, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    name, call, cls, text = bad_calls()[case]
    with pytest.raises(cls) as info:
        call()
    assert isinstance(info.value, GatherLensError)
    assert text in str(info.value), str(info.value)


def test_failed_append_leaves_the_cache_unchanged():
    q, k, v, cache = make()
    before = cache.length
    with pytest.raises(GatherValueError):
        cache.append(k[:, :, :2], v[:, :, :3])
    assert cache.length == before
    torch.testing.assert_close(sparse_decode(q, cache, budget=100), dense_decode_reference(q, k, v)[0])


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-head"])
def test_query_gradient_matches_reference(share):
    """Decode is inference, but the query's gradient (e.g. for probing) is exact; the cache
    stores detached copies, so keys that required grad do not drag a graph along."""
    q, k, v, cache = make(B=2, Hq=4, Hkv=2, L=45, D=8, P=4, dtype=torch.float64)
    kg = k.clone().requires_grad_()
    cache = PagedKVCache(2, 2, 8, page_size=4, dtype=torch.float64)
    cache.append(kg, v)
    assert not cache.keys.requires_grad
    q1, q2 = q.clone().requires_grad_(), q.clone().requires_grad_()
    out, sel = sparse_decode(q1, cache, budget=12, share_selection=share, return_selection=True)
    ref, _ = sparse_attention_reference(q2, k, v, sel.pages, 4)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(q1.grad, q2.grad)
