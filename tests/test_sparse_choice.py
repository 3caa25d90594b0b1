"""Page choice beyond Quest's plain rule (a recent window, the oracle), the dense path below the
budget, and truncating the paged cache: each against a plain reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.decode import reads_every_page
from gatherlens.ops.sparse.naive import dense_decode_reference, sparse_attention_reference
from gatherlens.ops.sparse.page_choice import first_recent_page, page_mass, pages_for_budget, select_pages


def make(B=1, Hq=4, Hkv=2, L=100, D=8, P=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    q = torch.randn(B, Hq, 1, D, generator=g).to(dtype)  # (B, Hq, 1, D)
    cache = PagedKVCache(B, Hkv, D, page_size=P, dtype=dtype)
    cache.append(k, v)
    return q, k, v, cache


@given(L=st.integers(1, 120), P=st.sampled_from([1, 4, 16]), budget=st.integers(1, 130), recent=st.integers(0, 130),
       share=st.booleans(), seed=st.integers(0, 50))
def test_recent_window_is_always_read_and_attention_is_exact(L, P, budget, recent, share, seed):
    q, k, v, cache = make(L=L, P=P, seed=seed)
    out, lse, sel = sparse_decode(q, cache, budget=budget, share_selection=share, recent=recent,
                                  return_lse=True, return_selection=True)
    N = -(-L // P)
    first = first_recent_page(L, P, recent)
    read = sel.mask()  # (B, Hsel, N)
    assert bool(read[..., first:].all()) and bool(read[..., 0].all())
    n = sel.pages.shape[-1]
    assert n == min(N, max(pages_for_budget(budget, L, P), N - first + 1))
    ref, ref_lse = sparse_attention_reference(q, k, v, sel.pages, P)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    assert sel.recent == recent and sel.choose == "bound"


def test_first_recent_page():
    assert first_recent_page(100, 16, 0) == first_recent_page(100, 16, 1) == 6  # the last page
    assert first_recent_page(100, 16, 36) == 4 and first_recent_page(100, 16, 37) == 3
    assert first_recent_page(5, 16, 100) == 0


def test_oracle_reads_the_pages_with_the_most_attention_mass():
    q, k, v, cache = make(L=96, P=4, Hq=4, Hkv=2)
    out, sel = sparse_decode(q, cache, budget=24, choose="oracle", return_selection=True)
    G, scale = 2, 8 ** -0.5
    probs = torch.softmax(q.double().view(1, 2, G, 8) @ k.double().transpose(-1, -2) * scale, -1)  # (1, 2, G, 96)
    mass = probs.view(1, 2, G, 24, 4).sum(-1).amax(2)  # (1, 2, 24) group max of each page's mass
    torch.testing.assert_close(sel.bounds.double(), mass, atol=1e-6, rtol=1e-6)
    for h in range(2):
        others = mass[0, h, 1:-1]
        best = set((others.topk(4).indices + 1).tolist()) | {0, 23}  # 24 tokens = 6 pages, 2 forced
        assert set(sel.pages[0, h].tolist()) == best
    ref, _ = sparse_attention_reference(q, k, v, sel.pages, 4)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    assert page_mass(q.view(1, 2, G, 8), cache, scale).sum(-1).sub(1).abs().max() < 1e-5  # (1, 2, G)


@pytest.mark.parametrize("padded", [False, True])
def test_a_budget_that_buys_every_page_is_dense_in_place(padded):
    q, k, v, cache = make(L=50, P=8, B=2)
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[1, :7] = not padded  # left padding of batch 1
    assert reads_every_page(cache, 50) and reads_every_page(cache, 8, recent=45)
    assert not reads_every_page(cache, 16)
    out, lse, sel = sparse_decode(q, cache, budget=64, return_lse=True, return_selection=True,
                                  key_mask=mask if padded else None)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], enable_gqa=True)  # (2, 4, 1, 8)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    assert sel.pages.shape[-1] == 7  # every page, as a selection
    if not padded:
        torch.testing.assert_close(lse, dense_decode_reference(q, k, v)[1], atol=1e-4, rtol=1e-4)


@given(chunks=st.lists(st.integers(1, 20), min_size=1, max_size=5), cut=st.floats(0, 1), P=st.sampled_from([1, 4, 8]),
       seed=st.integers(0, 50))
def test_truncate_is_exact_and_appends_continue(chunks, cut, P, seed):
    L = sum(chunks)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 2, L + 9, 6, generator=g)  # (B, Hkv, L + 9, D)
    cache = PagedKVCache(1, 2, 6, page_size=P)
    s = 0
    for t in chunks:
        cache.append(k[:, :, s:s + t], k[:, :, s:s + t])
        s += t
    keep = int(cut * L)
    cache.truncate(keep)
    cache.append(k[:, :, L:], k[:, :, L:])  # 9 new tokens after the kept ones
    want = torch.cat([k[:, :, :keep], k[:, :, L:]], dim=2)  # (1, 2, keep + 9, 6)
    fresh = PagedKVCache(1, 2, 6, page_size=P)
    fresh.append(want, want)
    assert torch.equal(cache.keys, want) and torch.equal(cache.summaries, fresh.summaries)


def test_truncate_and_choice_errors():
    q, k, v, cache = make(L=20)
    with pytest.raises(GatherValueError, match=r"truncate\(21\)"):
        cache.truncate(21)
    with pytest.raises(GatherValueError, match="recent"):
        sparse_decode(q, cache, budget=8, recent=-1)
    with pytest.raises(GatherValueError, match="choose"):
        sparse_decode(q, cache, budget=8, choose="best")
    with pytest.raises(GatherValueError, match="torch"):
        sparse_decode(q, cache, budget=8, choose="oracle", backend="triton")


def test_select_pages_keeps_its_positional_signature():
    """dist/ calls select_pages(q, cache, budget, share_selection, group_score) positionally."""
    q, k, v, cache = make(L=40, P=4)
    pages, bounds = select_pages(q, cache, 40, True, "sum")
    assert pages.shape == (1, 2, 10) and bounds.shape == (1, 2, 10)


@pytest.mark.parametrize("L", [40, 9000])
def test_attention_layouts_for_one_and_several_threads_agree(L):
    """attend_gathered gives the kernel one task per query head (several threads, small K) or one
    per KV group (one thread, or large K): the same attention either way."""
    from gatherlens.ops.sparse.torch_decode import attend_gathered

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 3, n, 64, generator=g) for n in (3, L, L))  # (B, Hs, R, D), (B, Hs, L, D)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attend_gathered(q, k, v, L - 3, 0.125)
        torch.set_num_threads(2)
        two = attend_gathered(q, k, v, L - 3, 0.125)
    finally:
        torch.set_num_threads(before)
    ref, lse = dense_decode_reference(q.reshape(1, 9, 1, 64), k[:, :, :L - 3], v[:, :, :L - 3], scale=0.125)
    for out, out_lse in (one, two):
        torch.testing.assert_close(out.reshape(1, 9, 1, 64), ref, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(out_lse.reshape(1, 9, 1), lse, atol=1e-4, rtol=1e-4)
