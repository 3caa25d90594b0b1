"""The article's get_embeddings: its failing call, the silent wrong fix, and the correct function."""
import pytest
import torch

from gatherlens.ops.embedding import get_embeddings


@pytest.fixture
def article():
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(10, 6, generator=gen)  # (V, d)
    ids = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])  # (B, S) with S <= d
    return ids, table


def test_article_call_raises_about_dimensions(article):
    ids, table = article
    dim = table.shape[1]
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        torch.gather(table, 0, ids.unsqueeze(-1).expand(-1, -1, dim))  # 3-D index on a 2-D table


def test_tempting_fix_is_silently_wrong(article):
    ids, table = article
    wrong = table.gather(0, ids)  # runs: seq_len <= dim
    assert wrong.shape == ids.shape, "one scalar per token, not a row"
    for b in range(ids.shape[0]):
        for s in range(ids.shape[1]):
            assert wrong[b, s] == table[ids[b, s], s]  # column s of row ids[b, s]


def test_get_embeddings_contract(article):
    ids, table = article
    out = get_embeddings(ids, table)
    assert out.shape == (*ids.shape, table.shape[1])  # (B, S, d)
    for b in range(ids.shape[0]):
        for s in range(ids.shape[1]):
            assert torch.equal(out[b, s], table[ids[b, s]])


def test_corrected_gather_matches(article):
    ids, table = article
    B, S = ids.shape
    dim = table.shape[1]
    fixed = table.gather(0, ids.reshape(-1, 1).expand(-1, dim)).view(B, S, dim)
    assert torch.equal(fixed, get_embeddings(ids, table))
