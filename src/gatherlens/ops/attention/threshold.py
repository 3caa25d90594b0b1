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

import ctypes
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from gatherlens.ops.native import load_kernel

KERNEL = Path(__file__).with_name("threshold_select.cpp")

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


def topk_rows(x: torch.Tensor, k: int, *, native: bool | None = None):
    """x (R, L) float32/float64 on CPU -> vals, idx (R, min(k, L)): each row's kept keys in ascending
    key index, padded with -inf / -1. native=None: the C++ kernel if it builds, else numpy."""
    R, L = x.shape
    k = min(k, L)
    a = x.detach().contiguous()                                 # (R, L)
    vals = torch.empty(R, k, dtype=a.dtype)
    idx = torch.empty(R, k, dtype=torch.long)
    lib = load_kernel(KERNEL) if native is not False else None
    if native and lib is None:
        raise RuntimeError(f"the native kernel {KERNEL.name} did not build (see the warning)")
    if R == 0 or k == 0:
        return vals, idx
    if lib is not None:
        fn = lib.select_rows_f64 if a.dtype == torch.float64 else lib.select_rows_f32
        ptr = lambda t, r0, width: ctypes.c_void_p(t.data_ptr() + r0 * width * t.element_size())
        map_row_ranges(R, lambda r0, r1: fn(ptr(a, r0, L), r1 - r0, L, k, ptr(vals, r0, k), ptr(idx, r0, k)))
        return vals, idx
    av, vv, iv = a.numpy(), vals.numpy(), idx.numpy()
    map_row_ranges(R, lambda r0, r1: _numpy_rows(av[r0:r1], k, vv[r0:r1], iv[r0:r1]))
    return vals, idx


def _numpy_rows(a: np.ndarray, k: int, vals: np.ndarray, idx: np.ndarray) -> None:
    """The same as the kernel with numpy: keep_block, then each row's kept keys packed to the left."""
    keep = keep_block(a, k)                                     # (r, L)
    row, col = np.nonzero(keep)                                 # row-major: ascending key per row
    counts = np.bincount(row, minlength=a.shape[0])             # (r,)
    slot = np.arange(row.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
    vals.fill(-np.inf)
    idx.fill(-1)
    vals[row, slot], idx[row, slot] = a[row, col], col


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
