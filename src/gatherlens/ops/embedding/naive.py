"""The plain-loop reference: for each token id, take its row. Every faster path is tested against it.

    >>> table = torch.arange(12.).view(4, 3)       # (V, d)
    >>> naive_lookup(torch.tensor([[2, 0]]), table) # (1, 2, 3)
    tensor([[[6., 7., 8.],
             [0., 1., 2.]]])
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherIndexError, position_of

__all__ = ["naive_lookup"]


def naive_lookup(ids: torch.Tensor, table: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """Row `ids[...]` of `table` for every position of `ids`: (*ids.shape) -> (*ids.shape, d).

    Autograd flows through each row; the `padding_idx` row is detached, so it gets no gradient.
    """
    vocab, dim = table.shape
    if padding_idx is not None:
        padding_idx %= vocab
    rows = []
    for flat, token in enumerate(ids.reshape(-1).tolist()):
        if not 0 <= token < vocab:
            raise GatherIndexError(
                f"token id {token} at position {position_of(flat, tuple(ids.shape))} "
                f"is outside the vocabulary [0, {vocab})"
            )
        row = table[token]  # (d,)
        rows.append(row.detach() if token == padding_idx else row)
    out = torch.stack(rows) if rows else table[:0]  # (N, d); empty: still on the graph
    return out.view(*ids.shape, dim)  # (*ids.shape, d)
