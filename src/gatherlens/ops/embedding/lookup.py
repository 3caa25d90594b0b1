"""`embedding_lookup` (checked, any method) and the article's `get_embeddings`.

    >>> table = torch.randn(10, 6)                        # (V, d)
    >>> embedding_lookup(torch.tensor([[3, 1, 4]]), table).shape
    torch.Size([1, 3, 6])
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.embedding import checks
from gatherlens.ops.embedding.methods import DEFAULT_METHOD, METHODS

__all__ = ["embedding_lookup", "get_embeddings"]


class _NoGradRow(torch.autograd.Function):
    """Identity on the table whose backward zeroes one row: padding_idx for any formulation."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, row: int):
        ctx.row = row
        return table.view_as(table)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # (V, d)
        grad = grad.clone()
        grad[ctx.row] = 0
        return grad, None


def embedding_lookup(ids: torch.Tensor, table: torch.Tensor, *, method: str = DEFAULT_METHOD,
                     padding_idx: int | None = None, bounds: str = "raise",
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Row `ids[...]` of `table` for every position: ids (*S) int32/int64, table (V, d) -> (*S, d).

    >>> embedding_lookup(torch.tensor([5]), torch.zeros(5, 2))
    Traceback (most recent call last):
    gatherlens.errors.GatherIndexError: token id 5 at position (0,) is outside the vocabulary [0, 5)

    method: one of METHODS ("fast" default, "embedding", "index_select", "gather", "indexing",
        "one_hot", "naive"); all return the same values and gradients.
    padding_idx: as torch.nn.Embedding: that row's gradient is zero (its values are looked up as is).
    bounds: "raise" | "clamp" | "zero" | "off" for ids outside [0, V) (see checks.py).
    out: a contiguous (*S, d) tensor to write into (no autograd); returned.
    Every check runs before any kernel.
    """
    checks.check_table(table)
    checks.check_ids(ids, table)
    if method not in METHODS:
        raise GatherValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    vocab, dim = table.shape
    padding_idx = checks.check_padding_idx(padding_idx, vocab)
    if out is not None:
        checks.check_out(out, (*ids.shape, dim), table)
        if table.requires_grad and torch.is_grad_enabled():
            raise GatherValueError("out= cannot be used when the table requires grad (autograd cannot track "
                                   "a write into your buffer); call under torch.no_grad() or drop out=")
    ids, zeroed = checks.check_ids_in_range(ids, vocab, bounds)

    if method == "fast":
        result = METHODS["fast"](ids, table, padding_idx=padding_idx, out=out)
    else:
        source = table
        if padding_idx is not None and table.requires_grad and torch.is_grad_enabled():
            source = _NoGradRow.apply(table, padding_idx)
        result = METHODS[method](ids, source)  # (*S, d)
        if out is not None:
            result = out.copy_(result)
    if zeroed is not None:
        mask = zeroed.unsqueeze(-1)  # (*S, 1)
        result = result.masked_fill_(mask, 0) if out is not None else result.masked_fill(mask, 0)
    return result


def get_embeddings(token_ids: torch.Tensor, embeddings_matrix: torch.Tensor) -> torch.Tensor:
    """The article's function, correct: (B, S) ids and a (V, d) table -> (B, S, d).

    >>> get_embeddings(torch.tensor([[3, 1, 4]]), torch.randn(10, 6)).shape
    torch.Size([1, 3, 6])
    """
    checks.check_table(embeddings_matrix, "embeddings_matrix")
    checks.check_ids(token_ids, embeddings_matrix, "token_ids")
    if token_ids.dim() != 2:
        raise GatherValueError(
            f"token_ids must be 2-D (batch, seq_len), got shape {tuple(token_ids.shape)}; "
            "use embedding_lookup for ids of any shape"
        )
    return embedding_lookup(token_ids, embeddings_matrix)
