"""The records the sharded pictures are drawn from keep the record promise, and draw."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatherlens.dist import shard_cache, simulate_sharded_decode
from gatherlens.errors import GatherIndexError, GatherValueError
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.trace import as_record
from gatherlens.trace.sharded import record_sharded_pages, record_vocab_shard, record_vocab_sum, shard_rows


@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(1, 30), world=st.integers(1, 5), d=st.integers(1, 4),
       ids=st.lists(st.integers(0, 10**6), min_size=1, max_size=7))
def test_vocab_shards_sum_to_the_lookup(vocab, world, d, ids):
    table = torch.randn(vocab, d)  # (V, d)
    x = torch.tensor(ids).remainder(vocab).view(1, -1)  # (1, S)
    partials = []
    for rank, (lo, hi) in enumerate(shard_rows(vocab, world)):
        rec = record_vocab_shard(x, table[lo:hi], lo, vocab, rank=rank, world=world)
        ok = rec.valid  # (1, S, d)
        if hi > lo:  # a rank may hold no rows (vocab < world): nothing to gather from
            assert torch.equal(rec.gathered()[ok], rec.output[ok])  # the record promise
        assert not rec.output[~ok].any()  # masked ids give zero rows
        owned = (x >= lo) & (x < hi)  # (1, S)
        assert torch.equal(rec.index, torch.where(owned, x - lo, -1))
        partials.append(rec.output)
    total = record_vocab_sum(x, table, world)
    assert torch.equal(torch.stack(partials).sum(0), table[x]) and torch.equal(total.output, table[x])
    assert torch.equal(total.gathered(), total.output)


def test_vocab_shard_rejects_ids_outside_the_vocabulary():
    with pytest.raises(GatherIndexError, match="token id 8 is outside the vocabulary"):
        record_vocab_shard(torch.tensor([[1, 8]]), torch.randn(3, 2), 0, 8)


def _toy(lengths=(16, 12, 9), budget=17):
    g = torch.Generator().manual_seed(3)
    L = sum(lengths)
    k, v = (torch.randn(1, 2, L, 4, generator=g) for _ in range(2))  # (B, Hkv, L, D)
    q = torch.randn(1, 4, 1, 4, generator=g)  # (B, Hq, 1, D)
    return k, v, q, simulate_sharded_decode(q, shard_cache(k, v, list(lengths), page_size=4), budget)


def test_sharded_pages_record_is_the_page_choice():
    k, v, q, (out, lse, sel) = _toy()
    whole = PagedKVCache(1, 2, 4, 4)
    whole.append(k, v)
    out1, lse1, sel1 = sparse_decode(q, whole, 17, return_lse=True, return_selection=True)
    assert torch.equal(sel.pages, sel1.pages)
    torch.testing.assert_close(out, out1, atol=1e-6, rtol=1e-6)
    for head in range(2):
        rec = record_sharded_pages(sel, head=head)
        assert torch.equal(rec.gathered(), rec.output)  # bounds[owner, local page]
        owner, local = rec.source_coords.unbind(-1)
        assert torch.equal(torch.tensor(sel.page_offsets)[owner] + local, sel1.pages[0, head])
        # the same bounds: a shard read whole scores in torch, the whole cache in C++ (sums in another order)
        torch.testing.assert_close(rec.output, sel1.bounds[0, head, sel1.pages[0, head]], atol=1e-6, rtol=1e-6)
        assert rec.dim == 0  # cells are coloured by the rank holding the page
    assert as_record(sel, head=1).source.shape == (3, 4)
    assert "<svg" in sel.to_svg(head=1) and "<svg" in sel.to_svg(lang="zh")


def test_a_rank_local_selection_cannot_be_drawn_until_gathered():
    *_, (out, lse, sel) = _toy()
    sel.bounds[1] = None
    with pytest.raises(GatherValueError, match="gather_selection"):
        sel.to_svg()
    with pytest.raises(GatherIndexError):
        record_sharded_pages(_toy()[3][2], head=2)
