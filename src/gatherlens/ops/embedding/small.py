"""The small lookup in few Python steps: the common case checked in under a microsecond.

    >>> small_lookup(torch.tensor([[3, 1, 4]]), torch.randn(10, 6)).shape
    torch.Size([1, 3, 6])
    >>> small_lookup(torch.tensor([[3, 1, 40]]), torch.randn(10, 6)) is None   # the full path raises
    True

A handful of ids on the CPU (int64 or int32, at most SMALL_MAX of them), a 2-D CPU table that needs no
gradient, no `out=`, no padding_idx, bounds="raise": the bounds check reads the ids as a Python list
(a reduction's dispatch costs more than the whole list for this few), then `torch.embedding`, the
kernel behind F.embedding, without F.embedding's Python wrapper. Anything else, including an id out of
range, returns None and the caller takes its full path, which raises the project's error.
"""
from __future__ import annotations

import torch

__all__ = ["small_lookup", "SMALL_MAX"]

SMALL_MAX = 64            # ids per call on this path
LIST_MAX = 16             # up to this many ids the check reads them as a list; more: one aminmax
_ID_DTYPES = (torch.int64, torch.int32)


def small_lookup(ids, table) -> torch.Tensor | None:
    """Rows `ids` of `table` (*ids.shape, d) when the small common case applies, else None."""
    if not (isinstance(ids, torch.Tensor) and isinstance(table, torch.Tensor)):
        return None
    n = ids.numel()
    if not 0 < n <= SMALL_MAX or ids.dtype not in _ID_DTYPES or table.dim() != 2:
        return None
    if not (ids.is_cpu and table.is_cpu) or (table.requires_grad and torch.is_grad_enabled()):
        return None
    if n <= LIST_MAX:
        values = ids.tolist() if ids.dim() == 1 else ids.reshape(-1).tolist()
        low, high = min(values), max(values)
    else:
        low, high = (t.item() for t in torch.aminmax(ids))
    if low < 0 or high >= table.shape[0]:
        return None                                             # the full path names the bad id
    return torch.embedding(table, ids)                          # (*ids.shape, d)
