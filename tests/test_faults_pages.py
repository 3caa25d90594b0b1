"""Non-finite keys in the paged KV cache: the forced pages are always read, in torch, Triton
(interpreter) and dist's candidates; sharded page owners raise no torch warning."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))



def test_a_non_finite_key_never_takes_a_forced_page():
    """Must hold: page 0 (documented as always read) and the newest page are chosen at every
    step even when other pages hold NaN or inf keys (their bounds are NaN/inf); the pages of
    NaN keys are read last (as many pages are read as with finite keys)."""
    from gatherlens.ops.sparse import PagedKVCache, select_pages

    torch.manual_seed(0)
    keys, values = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)   # (B, Hkv, L, D)
    clean = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=4)
    clean.append(keys, values)
    keys[:, :, 20:28] = float("nan")                                     # pages 5 and 6
    keys[:, 1, 30] = float("inf")                                        # page 7 of head 1
    cache = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=4)
    cache.append(keys, values)
    query = torch.randn(1, 4, 1, 8)                                      # (B, Hq, 1, D)
    for budget in (8, 12, 24):
        pages, _ = select_pages(query, cache, budget=budget)             # (1, 2, n)
        assert (pages[..., 0] == 0).all() and (pages[..., -1] == 15).all(), (budget, pages)
        assert not torch.isin(pages[0, 0], torch.tensor([5, 6])).any(), (budget, pages)   # NaN ranks last
        assert pages.shape[-1] == select_pages(query, clean, budget=budget)[0].shape[-1]


def test_sharded_page_owners_raise_no_warning():
    """Must hold: the owners of a page choice that reads every page (an expanded, strided
    tensor) come without torch's non-contiguous searchsorted warning, and equal the ranks
    computed one page at a time."""
    from gatherlens.trace.sharded import ShardedPageSelection

    pages = torch.arange(7).expand(1, 2, 7)                              # (B, Hsel, N), strided
    sel = ShardedPageSelection(pages=pages, bounds=[None, None], lse=torch.zeros(1, 4, 1), lengths=(16, 12),
                               rank=0, page_size=4, budget=64, query_heads=4, kv_heads=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        owners = sel.owners()                                            # (1, 2, 7)
    assert owners.tolist() == [[[0, 0, 0, 0, 1, 1, 1]] * 2]


def test_a_non_finite_key_never_takes_a_forced_page_in_triton_or_dist():
    """Must hold: the Triton page choice (in its CPU interpreter) and dist's per-rank candidates
    follow the same rule as select_pages: page 0 and the newest page always, NaN pages last."""
    import os

    from gatherlens.dist.pages import local_candidates
    from gatherlens.ops.sparse import PagedKVCache

    bounds = torch.tensor([[[float("nan"), 3.0, float("inf"), float("nan"), 1.0]]])  # (B, H, N_r)
    cb, ci = local_candidates(bounds, offset=0, n=3, total=5)
    assert set(ci[0, 0].tolist()) == {0, 4, 2}, ci            # both forced pages kept, inf next, nan out
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    pytest.importorskip("triton")
    from gatherlens.ops.sparse.triton_decode import triton_select_pages

    torch.manual_seed(0)
    keys, values = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)   # (B, Hkv, L, D)
    keys[:, :, 20:28] = float("nan")                                     # pages 5 and 6
    cache = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=4)
    cache.append(keys, values)
    pages, _ = triton_select_pages(torch.randn(1, 4, 1, 8), cache, budget=12)  # (1, 2, n) unsorted
    for row in pages[0]:
        assert {0, 15} <= set(row.tolist()) and not ({5, 6} & set(row.tolist())), pages
