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
from gatherlens.ops.embedding.small import small_lookup
from gatherlens.ops.quant.formats.table import QuantizedTable

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
    r"""Look up the row of ``table`` that each id names: ``out[..., :] = table[ids[...], :]``.

    :func:`torch.nn.functional.embedding` with its ids checked first: every check runs before any
    kernel, and an id outside the vocabulary raises a :class:`~gatherlens.GatherIndexError` naming
    the id, its position and the valid range. Every formulation in ``METHODS`` gives the same
    values and gradients.

    Args:
        ids (Tensor): token ids, int32 or int64, of any shape.
        table (Tensor or QuantizedTable): the embedding matrix, floating point, or GGUF blocks.
        method (str, optional): one of ``METHODS``: ``"fast"`` (default), ``"embedding"``,
            ``"index_select"``, ``"gather"``, ``"indexing"``, ``"one_hot"`` or ``"naive"``.
        padding_idx (int, optional): as in :class:`torch.nn.Embedding`: that row gets no
            gradient (its values are looked up as they are).
        bounds (str, optional): ids outside ``[0, V)``: ``"raise"`` (default), ``"clamp"``,
            ``"zero"`` (zero rows, no gradient) or ``"off"`` (no check; the kernel's behaviour).
        out (Tensor, optional): a contiguous tensor to write into (no autograd); returned.

    Shape:
        - ids: :math:`(*)`, any shape
        - table: :math:`(V, d)`
        - output: :math:`(*, d)`

    Returns:
        Tensor: the rows, in ``table.dtype`` on ``table.device``.

    Examples::

        >>> table = torch.arange(12.).view(4, 3)
        >>> embedding_lookup(torch.tensor([[3, 0]]), table)
        tensor([[[ 9., 10., 11.],
                 [ 0.,  1.,  2.]]])
        >>> embedding_lookup(torch.tensor([5]), table)
        Traceback (most recent call last):
        gatherlens.errors.GatherIndexError: token id 5 at position (0,) is outside the vocabulary [0, 4)
    """
    if method == "fast" and out is None and padding_idx is None and bounds in ("raise", "off"):
        rows = small_lookup(ids, table)                         # a few ids: the short path
        if rows is not None:
            return rows
    _check_table(table)
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
    result = _lookup(ids, table, method, padding_idx, out)  # (*S, d)
    if zeroed is not None:
        mask = zeroed.unsqueeze(-1)  # (*S, 1)
        result = result.masked_fill_(mask, 0) if out is not None else result.masked_fill(mask, 0)
    return result


def _check_table(table) -> None:
    """A dense (V, d) tensor (checks.check_table), or a QuantizedTable (checked when it was built)."""
    if not isinstance(table, QuantizedTable):
        checks.check_table(table)


def _lookup(ids, table, method: str, padding_idx: int | None, out) -> torch.Tensor:
    """The lookup itself, by `method`, after every check: (*S) ids, (V, d) table -> (*S, d)."""
    if isinstance(table, QuantizedTable):  # rows of GGUF blocks: only the picked ones dequantized
        result = table.lookup(ids, method)  # (*S, d) float32
        return out.copy_(result) if out is not None else result
    if method == "fast":
        return METHODS["fast"](ids, table, padding_idx=padding_idx, out=out)
    source = table
    if padding_idx is not None and table.requires_grad and torch.is_grad_enabled():
        source = _NoGradRow.apply(table, padding_idx)
    result = METHODS[method](ids, source)  # (*S, d)
    return out.copy_(result) if out is not None else result


def get_embeddings(token_ids: torch.Tensor, embeddings_matrix: torch.Tensor) -> torch.Tensor:
    r"""The embedding vector of every token: row ``token_ids[b, s]`` of ``embeddings_matrix``.

    The article's function, corrected, with the ids checked first (see ``gatherlens gather
    --mistakes`` for what went wrong). :func:`embedding_lookup` takes ids of any shape and more
    options.

    Args:
        token_ids (Tensor): token ids, int32 or int64.
        embeddings_matrix (Tensor): the embedding table, floating point.

    Shape:
        - token_ids: :math:`(B, S)`
        - embeddings_matrix: :math:`(V, d)`
        - output: :math:`(B, S, d)`

    Returns:
        Tensor: the embeddings, in ``embeddings_matrix.dtype``.

    Example::

        >>> get_embeddings(torch.tensor([[3, 1, 4]]), torch.randn(10, 6)).shape
        torch.Size([1, 3, 6])
    """
    rows = small_lookup(token_ids, embeddings_matrix)           # a few ids: the short path
    if rows is not None and rows.dim() == 3:                    # (B, S) ids; else the full path's error
        return rows
    checks.check_table(embeddings_matrix, "embeddings_matrix")
    checks.check_ids(token_ids, embeddings_matrix, "token_ids")
    if token_ids.dim() != 2:
        raise GatherValueError(
            f"token_ids must be 2-D (batch, seq_len), got shape {tuple(token_ids.shape)}; "
            "use embedding_lookup for ids of any shape"
        )
    return embedding_lookup(token_ids, embeddings_matrix)
