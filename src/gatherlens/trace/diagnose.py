"""Catch the article's two gather mistakes before they bite.

    >>> W = torch.randn(10, 6)                      # (V, d)
    >>> ids = torch.tensor([[3, 1, 4]])             # (B, S)
    >>> diagnose_gather(W, 0, ids)                  # warns: one scalar per token, not a row
    GatherFinding(kind='scalar_per_token', ...)

1. ``torch.gather(W, 0, ids.unsqueeze(-1).expand(-1, -1, d))``: a 3-D index on a 2-D table.
   PyTorch raises "Index tensor must have the same number of dimensions as input tensor".
2. ``W.gather(0, ids)``: runs when seq_len <= d and silently returns
   ``out[b, s] = W[ids[b, s], s]``, one scalar per token instead of the token's row.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

__all__ = ["GatherFinding", "GatherDiagnosticWarning", "diagnose_gather",
           "explain_ndim_mismatch"]


class GatherDiagnosticWarning(UserWarning):
    """A gather that runs but probably does not do what was meant."""


@dataclass(frozen=True)
class GatherFinding:
    """What looks wrong with a gather call, and the fix.

    kind: "ndim_mismatch" | "index_too_large" | "out_of_range" | "scalar_per_token" |
          "partial_rows"
    severity: "error" (torch will raise) or "warning" (it runs but likely is not what you meant).
    """

    kind: str
    severity: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.message}\nfix: {self.fix}"


def explain_ndim_mismatch(src_shape: tuple, idx_shape: tuple, dim: int, name: str = "input",
                          index_name: str = "index") -> str:
    """Words for PyTorch's 'Index tensor must have the same number of dimensions' error."""
    text = (
        f"{index_name} has {len(idx_shape)} dimensions {idx_shape} but {name} has "
        f"{len(src_shape)} {src_shape}; torch.gather needs both to have the same number of "
        f"dimensions (PyTorch: 'Index tensor must have the same number of dimensions as input "
        f"tensor'). gather returns a tensor shaped like its index, one element per index entry; "
        f"it cannot add a dimension."
    )
    if len(src_shape) == 2 and len(idx_shape) == 3 and dim == 0:
        text += (
            f" For a row lookup (embedding) use {name}[ids], F.embedding(ids, {name}), or flatten "
            f"the ids: {name}.gather(0, ids.reshape(-1, 1).expand(-1, d)).view(B, S, d)."
        )
    return text


def _findings(src: torch.Tensor, dim: int, idx: torch.Tensor) -> GatherFinding | None:
    nd = src.ndim
    d = dim % max(nd, 1)
    if idx.ndim != nd:
        return GatherFinding(
            "ndim_mismatch", "error",
            explain_ndim_mismatch(tuple(src.shape), tuple(idx.shape), d),
            "give index the same number of dimensions as input; for a row lookup use "
            "input[ids] or input.gather(0, ids.reshape(-1, 1).expand(-1, d)).view(*ids.shape, d)",
        )
    for ax in range(nd):
        if ax != d and idx.shape[ax] > src.shape[ax]:
            return GatherFinding(
                "index_too_large", "error",
                f"index has size {idx.shape[ax]} on dim {ax} but input has {src.shape[ax]}; "
                f"torch.gather needs index.size({ax}) <= input.size({ax}) for every dim except "
                f"dim={d} (with W.gather(0, ids) this happens once seq_len > d)",
                "for a row lookup use input[ids]",
            )
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= src.shape[d]):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        return GatherFinding(
            "out_of_range", "error",
            f"index value {bad} is outside input's dim {d} [0, {src.shape[d]})",
            "keep every index in range (gather does not accept negative indices)",
        )
    if nd != 2 or d != 0 or idx.numel() == 0:
        return None
    n_cols, d_model = idx.shape[1], src.shape[1]
    if n_cols == d_model and bool((idx == idx[:, :1]).all()):
        return None  # expanded ids: every column of a row picks the same table row, a row lookup
    if n_cols < d_model:
        rows_constant = bool((idx == idx[:, :1]).all())
        if rows_constant:
            return GatherFinding(
                "partial_rows", "warning",
                f"gather(0, index) with index of shape {tuple(idx.shape)} on a "
                f"{tuple(src.shape)} table copies only the first {n_cols} of {d_model} columns "
                f"of each picked row",
                "expand the index to the full width: index.expand(-1, d), or use input[ids]",
            )
        return GatherFinding(
            "scalar_per_token", "warning",
            f"gather(0, index) on a 2-D {tuple(src.shape)} table with a {tuple(idx.shape)} index "
            f"returns out[i, j] = input[index[i, j], j]: one scalar per index entry, not a row "
            f"per token; this looks like an intended row (embedding) lookup",
            "use input[ids] (or F.embedding(ids, input)) for rows: shape (*ids.shape, d)",
        )
    return None


def diagnose_gather(input, dim: int, index, warn: bool = True) -> GatherFinding | None:
    """Check a ``torch.gather(input, dim, index)`` call; return a finding (and warn) or None.

        >>> diagnose_gather(torch.randn(10, 6), 0, torch.tensor([[3, 1, 4]]))  # warns
        >>> diagnose_gather(torch.randn(10, 6), 0, torch.tensor([[3], [1]]).expand(-1, 6)) is None
        True

    Errors torch would raise (wrong number of dimensions, too-large index, out of range) come
    back with severity "error" and an explanation; the silent mistakes with "warning".
    Every finding is also issued as a `GatherDiagnosticWarning` unless warn=False.
    """
    if not isinstance(input, torch.Tensor) or not isinstance(index, torch.Tensor):
        from gatherlens.errors import GatherTypeError

        raise GatherTypeError(
            f"input and index must be torch.Tensors, got {type(input).__name__} and "
            f"{type(index).__name__}"
        )
    finding = _findings(input.detach(), dim, index.detach())
    if finding is not None and warn:
        warnings.warn(str(finding), GatherDiagnosticWarning, stacklevel=2)
    return finding
