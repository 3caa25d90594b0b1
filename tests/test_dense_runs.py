"""ops/sparse/dense_runs.py: the rule that makes a layer read densely for a while after a sparse step that needed
nearly every page, its union count against a plain one (hypothesis, odd sizes), and its settings' checks."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.config import SparseConfig
from gatherlens.ops.sparse.dense_runs import covered_pages, note_cover, note_step, step_budget


def _plain_covered(pages: torch.Tensor, kv_heads: int) -> int:
    """Each (batch row, KV group)'s set of pages, sized and summed."""
    B, Hsel, n = pages.shape
    G = Hsel // kv_heads
    return sum(len({p for g in range(G) for p in pages[b, h * G + g].tolist() if p >= 0})
               for b in range(B) for h in range(kv_heads))


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), kv=st.integers(1, 4), G=st.integers(1, 7), N=st.integers(1, 40), n=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_covered_pages_is_each_groups_union(B, kv, G, N, n, seed):
    gen = torch.Generator().manual_seed(seed)
    pages = torch.randint(-1, N, (B, kv * G, n), generator=gen)  # (B, Hsel, n), -1: padding
    assert covered_pages(pages, kv, N) == _plain_covered(pages, kv)


def _cache(tokens: int, kv_heads: int = 2) -> PagedKVCache:
    cache = PagedKVCache(batch=1, kv_heads=kv_heads, head_dim=8, page_size=4)
    cache.append(torch.randn(1, kv_heads, tokens, 8), torch.randn(1, kv_heads, tokens, 8))
    return cache


def test_a_step_needing_most_pages_starts_a_dense_run_then_the_layer_chooses_again():
    config, cache = SparseConfig(16, page_size=4, dense_cover=0.75, dense_steps=3), _cache(100)  # 25 pages, 2 groups
    assert step_budget(config, cache, 100, layer=5) == 16  # no run yet: the budget
    note_cover(config, cache, 37)  # 37 of 50: below 0.75
    assert cache.dense_left == 0
    note_cover(config, cache, 38)  # 38 of 50: a run of 3
    assert [step_budget(config, cache, 100, layer=5) for _ in range(4)] == [100, 100, 100, 16]
    note_cover(config, cache, 50)
    cache.truncate(90)  # a rollback ends the run
    assert cache.dense_left == 0 and step_budget(config, cache, 90, layer=5) == 16


def test_dense_layers_and_budgets_that_buy_every_page_are_untouched():
    config, cache = SparseConfig(16, page_size=4, dense_cover=0.5), _cache(100)
    cache.dense_left = 2
    assert step_budget(config, cache, 100, layer=0) == 100 and cache.dense_left == 2  # a dense layer: no step used
    note_step(config, cache, 100, torch.zeros(1, 2, 1, dtype=torch.long))  # a budget of every page chose nothing
    assert cache.dense_left == 2
    never = SparseConfig(16, page_size=4, dense_cover=None)
    note_cover(never, cache, 50)
    assert cache.dense_left == 0


@pytest.mark.parametrize("name,value", [("dense_cover", 0.0), ("dense_cover", 1.5), ("dense_cover", True),
                                        ("dense_cover", "most"), ("dense_steps", 0), ("dense_steps", 2.5)])
def test_bad_dense_run_settings_name_the_setting_and_range(name, value):
    with pytest.raises(GatherValueError, match=name):
        SparseConfig(**{name: value})
