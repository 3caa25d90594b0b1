"""The short path for a few ids (small.py): the same rows as F.embedding, the same errors as the full path."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gatherlens.errors import GatherIndexError, GatherTypeError
from gatherlens.ops.embedding import embedding_lookup, get_embeddings
from gatherlens.ops.embedding.small import SMALL_MAX, small_lookup


@settings(max_examples=80, deadline=None)
@given(shape=st.sampled_from([(), (1,), (7,), (1, 8), (2, 3), (4, 16), (2, 2, 2)]),
       dtype=st.sampled_from([torch.int64, torch.int32]),
       table_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), seed=st.integers(0, 10**6))
def test_small_lookup_equals_f_embedding(shape, dtype, table_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(50, 6, generator=g).to(table_dtype)
    ids = torch.randint(0, 50, shape, generator=g, dtype=dtype)
    want = F.embedding(ids.long(), table)
    for got in (small_lookup(ids, table), embedding_lookup(ids, table)):
        assert got.dtype == table.dtype and torch.equal(got, want)
    if ids.dim() == 2:
        assert torch.equal(get_embeddings(ids, table), want)


@pytest.mark.parametrize("bad", [-1, 50, 10**9])
@pytest.mark.parametrize("call", ["embedding_lookup", "get_embeddings"])
def test_an_id_out_of_range_gets_the_full_paths_error(bad, call):
    ids = torch.tensor([[3, bad, 4]])
    assert small_lookup(ids, torch.randn(50, 6)) is None
    fn = embedding_lookup if call == "embedding_lookup" else get_embeddings
    with pytest.raises(GatherIndexError, match=rf"token id {bad} at position \(0, 1\) is outside the vocabulary \[0, 50\)"):
        fn(ids, torch.randn(50, 6))


def test_cases_outside_the_short_path_are_left_to_the_full_path():
    table = torch.randn(50, 6)
    assert small_lookup(torch.zeros(SMALL_MAX + 1, dtype=torch.long), table) is None   # too many ids
    assert small_lookup(torch.zeros(0, dtype=torch.long), table) is None               # no id
    assert small_lookup(torch.zeros(3), table) is None                                 # float ids
    assert small_lookup(torch.zeros(3, dtype=torch.long), torch.randn(50)) is None     # 1-D table
    assert small_lookup([1, 2], table) is None
    assert small_lookup(torch.zeros(3, dtype=torch.long), table.requires_grad_()) is None  # autograd
    with torch.no_grad():
        assert small_lookup(torch.zeros(3, dtype=torch.long), table) is not None
    with pytest.raises(GatherTypeError, match="torch.int64 or torch.int32"):
        embedding_lookup(torch.zeros(3), table)


def test_padding_idx_and_out_still_take_the_full_path():
    table = torch.randn(10, 4, requires_grad=True)
    ids = torch.tensor([1, 2, 1])
    embedding_lookup(ids, table, padding_idx=1).sum().backward()
    assert torch.equal(table.grad[1], torch.zeros(4)) and torch.equal(table.grad[2], torch.ones(4))
    out = torch.empty(3, 4)
    with torch.no_grad():
        assert embedding_lookup(ids, table, out=out) is out
    assert torch.equal(out, table.detach()[ids])
