"""The small lookup in few Python steps: the common case checked in under a microsecond.

    >>> small_lookup(torch.tensor([[3, 1, 4]]), torch.randn(10, 6)).shape
    torch.Size([1, 3, 6])
    >>> small_lookup(torch.tensor([[3, 1, 40]]), torch.randn(10, 6)) is None   # the full path raises
    True

A handful of ids on the CPU (int64 or int32, at most SMALL_MAX of them), a 2-D CPU table that needs no
gradient, no `out=`, no padding_idx, bounds="raise": `torch.embedding`, the kernel behind F.embedding,
without F.embedding's Python wrapper. The bounds check is the kernel's own: on the CPU it tests every
id against [0, V) while it copies the rows and raises IndexError for the first one outside (any
check written here, even `ids.tolist()` and min/max, cost more than the lookup of 8 rows). Then, and
for anything else, this returns None and the caller takes its full path, which raises the project's
GatherIndexError naming the id, its position and the range.
"""
from __future__ import annotations

import torch

__all__ = ["small_lookup", "SMALL_MAX"]

SMALL_MAX = 64            # ids per call on this path
_ID_DTYPES = (torch.int64, torch.int32)


def small_lookup(ids, table) -> torch.Tensor | None:
    """Rows `ids` of `table` (*ids.shape, d) when the small common case applies, else None.

    Every test is a cheap attribute read, cheapest and likeliest to fail first: this runs on
    every call of `embedding_lookup` and `get_embeddings`.
    """
    if type(ids) is not torch.Tensor or not isinstance(table, torch.Tensor):
        return None
    if ids.dtype not in _ID_DTYPES or not 0 < ids.numel() <= SMALL_MAX or table.dim() != 2:
        return None
    if not (ids.is_cpu and table.is_cpu) or (table.requires_grad and torch.is_grad_enabled()):
        return None
    try:
        return torch.embedding(table, ids)                      # (*ids.shape, d)
    except (IndexError, RuntimeError):                          # the kernel's bounds check failed (a table of
        return None                                             # 0 rows: RuntimeError): the full path names the id
