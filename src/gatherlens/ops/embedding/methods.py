"""The equivalent formulations a learner meets: each takes (ids, table) and returns (*ids.shape, d).

    >>> METHODS["gather"](torch.tensor([[3, 1]]), torch.randn(5, 4)).shape
    torch.Size([1, 2, 4])

All copy values exactly, so each is `torch.equal` to `F.embedding`. They keep their own autograd
(gradients equal F.embedding's); `embedding_lookup` adds the padding_idx rule around them. The values
are plain functions with no checks: validate first (`embedding_lookup` does).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.ops.embedding.fast import fast_lookup
from gatherlens.ops.embedding.naive import naive_lookup

__all__ = ["METHODS", "DEFAULT_METHOD"]


def gather_lookup(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The article's call, corrected: a 2-D index, one row of ids expanded over d."""
    dim = table.shape[1]
    index = ids.reshape(-1, 1).long().expand(-1, dim)  # (N, d): row n is ids[n] repeated
    return table.gather(0, index).view(*ids.shape, dim)  # (*ids.shape, d)


def index_select_lookup(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """`index_select` along the vocabulary: the kernel F.embedding itself calls."""
    return table.index_select(0, ids.reshape(-1)).view(*ids.shape, table.shape[1])  # (*ids.shape, d)


def indexing_lookup(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """NumPy-style advanced indexing `table[ids]` (the generic index kernel)."""
    return table[ids]  # (*ids.shape, d)


def embedding_lookup_f(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """PyTorch's own `F.embedding`."""
    return F.embedding(ids, table)  # (*ids.shape, d)


def one_hot_lookup(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """For teaching: a lookup is a matmul with one-hot rows. Memory N x V; a non-finite table value
    would spread as NaN through the zeros, so use it only to see the idea."""
    vocab, dim = table.shape
    hot = F.one_hot(ids.reshape(-1).long(), vocab).to(table.dtype)  # (N, V)
    return (hot @ table).view(*ids.shape, dim)  # (*ids.shape, d)


def naive_method(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The plain loop of naive.py."""
    return naive_lookup(ids, table)


DEFAULT_METHOD = "fast"

METHODS = {
    "fast": fast_lookup,
    "embedding": embedding_lookup_f,
    "index_select": index_select_lookup,
    "gather": gather_lookup,
    "indexing": indexing_lookup,
    "one_hot": one_hot_lookup,
    "naive": naive_method,
}
