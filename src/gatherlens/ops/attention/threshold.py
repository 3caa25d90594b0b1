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


def topk_rows(x: torch.Tensor, k: int, *, lens=None, base=None, weights: bool = False, native=None):
    """Each row's kept keys (the rule above), in ascending key index.

    x (R, W) float32/float64 on CPU; row r ranks keys [0, lens[r]) (lens (R,) int64; default all
    W: a causal row passes its prefix). Returns vals, idx (R, k'), k' = min(k, W), padded with
    -inf and -1; with base (R,) int64, idx + base[r] (padding: base[r]), rows of a value table.
    weights=True also returns w (R, k'), the softmax over each row's kept logits (0 where padded),
    and lse (R,). native=None: the C++ kernel if it builds, else numpy (False: numpy; True: kernel).
    """
    R, W = x.shape
    k = min(k, W)
    a = x.detach().contiguous()                                 # (R, W)
    lib = load_kernel(KERNEL) if native is not False else None
    if native and lib is None:
        raise RuntimeError(f"the native kernel {KERNEL.name} did not build (see the warning)")
    if lib is None:
        return _numpy_topk_rows(a, k, lens, base, weights)
    vals, idx = torch.empty(R, k, dtype=a.dtype), torch.empty(R, k, dtype=torch.long)
    w, lse = (torch.empty(R, k, dtype=a.dtype), torch.empty(R, dtype=a.dtype)) if weights else (None, None)
    args = [t.contiguous() if t is not None else None for t in (lens, base)]
    fn = lib.select_rows_f64 if a.dtype == torch.float64 else lib.select_rows_f32

    def ptr(t, r0, width=1):                                   # address of row r0, or NULL
        return None if t is None else ctypes.c_void_p(t.data_ptr() + r0 * width * t.element_size())

    def block(r0, r1):
        fn(ptr(a, r0, W), ctypes.c_int64(r1 - r0), ctypes.c_int64(W), ptr(args[0], r0), ctypes.c_int64(k),
           ptr(args[1], r0), ptr(vals, r0, k), ptr(idx, r0, k), ptr(w, r0, k), ptr(lse, r0))

    if R and k:
        map_row_ranges(R, block)
    return (vals, idx, w, lse) if weights else (vals, idx)


def _numpy_topk_rows(a: torch.Tensor, k: int, lens, base, weights: bool):
    """topk_rows without the kernel: numpy's introselect per row, then torch for the rest."""
    R, W = a.shape
    if lens is not None:                                        # keys past a row's length: forbidden
        a = a.masked_fill(torch.arange(W) >= lens.view(R, 1), float("-inf"))
    vals, idx = torch.empty(R, k, dtype=a.dtype), torch.empty(R, k, dtype=torch.long)
    if R and k:
        av, vv, iv = a.numpy(), vals.numpy(), idx.numpy()
        map_row_ranges(R, lambda r0, r1: _numpy_rows(av[r0:r1], k, vv[r0:r1], iv[r0:r1]))
    if base is not None:
        idx = torch.where(idx < 0, 0, idx) + base.view(R, 1)
    if not weights:
        return vals, idx
    m = vals.amax(-1, keepdim=True)                             # (R, 1)
    m = torch.where(m > float("-inf"), m, torch.zeros_like(m))
    w = torch.exp(vals - m)                                     # (R, k), 0 where padded
    l = w.sum(-1, dtype=torch.float64)                          # (R,)
    lse = torch.where(l > 0, m.squeeze(-1).double() + l.log(), float("-inf")).to(a.dtype)
    return vals, idx, (w / torch.where(l > 0, l, 1.0).unsqueeze(-1)).to(a.dtype), lse


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
    n = max(1, min(torch.get_num_threads(), rows))
    if n == 1:
        return [fn(0, rows)]
    bounds = np.linspace(0, rows, n + 1).astype(int).tolist()
    return list(worker_pool(n).map(fn, bounds[:-1], bounds[1:]))


def worker_pool(n: int) -> ThreadPoolExecutor:
    """A lasting pool of at least n threads (numpy, ctypes and torch release the GIL in them)."""
    global _POOL, _POOL_SIZE
    if _POOL is None or _POOL_SIZE < n:
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="gatherlens-topk")
        _POOL_SIZE = n
    return _POOL
