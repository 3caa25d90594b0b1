"""Exact top-k per row as a threshold: the k-th largest logit, and which of its ties are kept.

    >>> flat, counts = threshold_select(torch.tensor([[1., 3., 3., -inf], [2., 0., 5., 5.]]), 2)
    >>> flat, counts            # positions r * L + j of the kept keys, ascending; keys per row
    (tensor([1, 2, 6, 7]), tensor([2, 2]))

The rule is select.py's (`select_topk`): a row keeps its k allowed (finite) keys of highest logit,
ties at the k-th value go to the lower key index, a row with fewer than k allowed keys keeps them
all. Per row: the k-th largest value `edge` (numpy's introselect, `np.partition`, which copies no
indices and is about 3x faster than `np.argpartition`), then every key >= edge; a row where a value
equal to edge also lies below the cut keeps only its first `need` equal keys (by index). The kept
keys come out as flat positions in ascending order (`np.flatnonzero`), so a sum over them can
gather only those value rows, and nothing of size (R, L) outlives the row block in flight.
Row blocks run on worker threads (numpy releases the GIL), one per torch thread.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0


def keep_block(a: np.ndarray, k: int) -> np.ndarray:
    """a (r, L) float -> bool (r, L): True at the keys each row keeps (the rule above)."""
    r, L = a.shape
    if k >= L:
        return a > -np.inf                                      # every allowed key
    kth = L - k
    part = np.partition(a, kth, axis=-1)                        # (r, L): [<= edge | edge | >= edge]
    edge = part[:, kth:kth + 1]                                 # (r, 1) the k-th largest
    keep = a >= edge                                            # (r, L)
    below = part[:, :kth].max(axis=-1, keepdims=True)           # (r, 1) largest value under the cut
    redo = ((below == edge) | (edge == -np.inf)).ravel()        # ties across the cut, or < k allowed
    if redo.any():
        rows = np.flatnonzero(redo)
        keep[rows] = exact_keep(a[rows], edge[rows], k)
    return keep


def exact_keep(a: np.ndarray, edge: np.ndarray, k: int) -> np.ndarray:
    """a (r, L), edge (r, 1) its k-th largest -> bool (r, L): keys above edge, then the lowest-index
    keys equal to it until k are kept; an edge of -inf (fewer than k allowed keys) keeps the finite."""
    above = a > edge                                            # (r, L)
    tied = (a == edge) & (edge > -np.inf)                       # (r, L) never a forbidden key
    need = k - above.sum(axis=-1, keepdims=True)                # (r, 1) ties still to take
    return above | (tied & (np.cumsum(tied, axis=-1) <= need))


def _block(a: np.ndarray, k: int):
    keep = keep_block(a, k)                                     # (r, L)
    return np.flatnonzero(keep), keep.shape[0]


def threshold_select(x: torch.Tensor, k: int):
    """x (R, L) float32/float64 on CPU -> flat (N,) int64 positions r * L + j of the kept keys
    (ascending: row by row, each row's keys by index) and counts (R,) int64 (keys kept per row)."""
    R, L = x.shape
    a = x.detach().contiguous().numpy()                         # (R, L), shares memory
    parts = map_row_blocks(a, lambda b: _block(b, k))
    flats, row0 = [], 0
    for flat, r in parts:
        flats.append(flat + row0 * L)
        row0 += r
    flat = np.concatenate(flats) if len(flats) > 1 else flats[0]  # (N,)
    bounds = np.searchsorted(flat, np.arange(R + 1, dtype=np.int64) * L)  # (R + 1,) row starts
    return torch.from_numpy(flat.astype(np.int64, copy=False)), torch.from_numpy(np.diff(bounds))


def map_row_blocks(a: np.ndarray, fn) -> list:
    """[fn(block) for each block of rows of a], one block per torch thread, on worker threads."""
    return map_row_ranges(a.shape[0], lambda r0, r1: fn(a[r0:r1]))


def map_row_ranges(rows: int, fn) -> list:
    """[fn(r0, r1) for each range of rows], one range per torch thread, on worker threads."""
    global _POOL, _POOL_SIZE
    n = max(1, min(torch.get_num_threads(), rows))
    if n == 1:
        return [fn(0, rows)]
    if _POOL is None or _POOL_SIZE < n:
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="gatherlens-threshold")
        _POOL_SIZE = n
    bounds = np.linspace(0, rows, n + 1).astype(int).tolist()
    return list(_POOL.map(fn, bounds[:-1], bounds[1:]))
