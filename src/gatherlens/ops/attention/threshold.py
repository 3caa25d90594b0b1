"""Exact top-k per row as a threshold: the k-th largest logit, and which of its ties are kept.

    >>> vals, idx = topk_rows(torch.tensor([[1., 3., 3., -inf], [2., 0., 5., 5.]]), 2)
    >>> idx                     # each row's kept keys, in ascending key index
    tensor([[1, 2],
            [2, 3]])

The rule is topk_select.py's (`select_topk`): a row keeps its k allowed (finite) keys of highest
logit, ties at the k-th value go to the lower key index, a row with fewer than k allowed keys keeps
them all. Two implementations give the same keys:

- threshold_select.cpp (built once by native.py): a lower bound of the k-th largest from a sample
  of the row, one vectorized pass that keeps the few keys above it, the exact k-th largest among
  those by counting, then the tie rule; optionally the softmax weights over the kept keys
  (`weights=True`) or, for a dense product with V, the whole row overwritten by them
  (`topk_weights_`). About 1 ns per logit here; no Python per row.
- numpy, where no compiler is found: `np.partition` (introselect) per row for the k-th largest
  value, every key >= it, the tie rows redone by index (`keep_block`); several times slower.

Row blocks run on worker threads (ctypes and numpy release the GIL), one per torch thread, for
calls with at least PARALLEL_MIN logits.
"""
from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from gatherlens.ops.native import load_kernel

KERNEL = Path(__file__).with_name("threshold_select.cpp")
PARALLEL_MIN = 1 << 21    # logits per call below which the kernel runs on the calling thread

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

    x (R, W) float32/float64 on CPU, or (N, G, W) read as R = N*G rows, any strides (decode logits
    stay (B*Hkv, L, G) in memory and are read as rows); row r ranks keys [0, lens[r]) (lens (R,)
    int64; default all W: a causal row passes its prefix). Returns vals, idx (R, k'), k' = min(k, W),
    padded with -inf and -1; with base (R,) int64, idx + base[r] (padding: base[r]), rows of a value
    table. weights=True also returns w (R, k'), the softmax over each row's kept logits (0 where
    padded), and lse (R,). native=None: the C++ kernel if it builds, else numpy (False: numpy).
    """
    x3 = (x.unsqueeze(1) if x.dim() == 2 else x).detach()      # (N, G, W)
    N, G, W = x3.shape
    R, k = N * G, min(k, W)
    lib = load_kernel(KERNEL) if native is not False else None
    if native and lib is None:
        raise RuntimeError(f"the native kernel {KERNEL.name} did not build (see the warning)")
    if lib is None:
        return _numpy_topk_rows(x3.reshape(R, W), k, lens, base, weights)
    layout = (G, x3.stride(0), x3.stride(1) if G > 1 else 0, x3.stride(2), W, 1, 0)
    return _select(lib, x3, R, layout, k, lens, base, weights)


def topk_summed_rows(s: torch.Tensor, k: int, *, lens=None, native=None):
    """share_selection's ranking: rows of the sum over dim 2 of s (B, Hkv, G, C, Lc) (any strides),
    added in head order -> vals, idx (B*Hkv*C, k') as topk_rows, vals being those sums."""
    B, Hkv, G, C, Lc = s.shape
    lib = load_kernel(KERNEL) if native is not False else None
    if lib is None or s.stride(0) != Hkv * s.stride(1):
        rank = s[:, :, 0].clone()                               # (B, Hkv, C, Lc), added as chunked.py does
        for g in range(1, G):
            rank += s[:, :, g]
        return topk_rows(rank.reshape(-1, Lc), k, lens=lens, native=native)
    layout = (C, s.stride(1), s.stride(3), s.stride(4), Lc, G, s.stride(2))
    return _select(lib, s, B * Hkv * C, layout, min(k, Lc), lens, None, False)


def _select(lib, x: torch.Tensor, R: int, layout: tuple, k: int, lens, base, weights: bool):
    """The kernel over R rows of x, as `layout` (grp, gs, rs, ks, W, n, ss) places them."""
    vals, idx = torch.empty(R, k, dtype=x.dtype), torch.empty(R, k, dtype=torch.long)
    w, lse = (torch.empty(R, k, dtype=x.dtype), torch.empty(R, dtype=x.dtype)) if weights else (None, None)
    lens, base = (None if t is None else t.contiguous() for t in (lens, base))
    fn = lib.select_rows_f64 if x.dtype == torch.float64 else lib.select_rows_f32
    start = ctypes.c_void_p(x.data_ptr())

    def block(r0, r1):
        at = torch.tensor((r0, *layout))
        fn(start, _ptr(at, 0), ctypes.c_int64(r1 - r0), _ptr(lens, r0), ctypes.c_int64(k),
           _ptr(base, r0), _ptr(vals, r0, k), _ptr(idx, r0, k), _ptr(w, r0, k), _ptr(lse, r0))

    if R and k:
        map_row_ranges(R, block, R * layout[4] * layout[5])
    return (vals, idx, w, lse) if weights else (vals, idx)


def topk_weights_(x: torch.Tensor, k: int, *, lens=None, native=None) -> torch.Tensor:
    """In place: each row of x (R, W) becomes the softmax over its kept keys, 0 elsewhere (and past
    lens[r]); returns lse (R,). For a matmul by V when k is a large part of the row."""
    R, W = x.shape
    lib = load_kernel(KERNEL) if native is not False else None
    if lib is None or not x.is_contiguous():
        vals, idx, w, lse = topk_rows(x, k, lens=lens, weights=True, native=native)
        x.zero_().scatter_add_(-1, idx.clamp_min(0), w)        # padding adds 0 at key 0
        return lse
    lse = torch.empty(R, dtype=x.dtype)
    fn = lib.dense_rows_f64 if x.dtype == torch.float64 else lib.dense_rows_f32
    lens = None if lens is None else lens.contiguous()

    def block(r0, r1):
        fn(_ptr(x, r0, W), ctypes.c_int64(r1 - r0), ctypes.c_int64(W), _ptr(lens, r0), ctypes.c_int64(min(k, W)),
           _ptr(lse, r0))

    if R:
        map_row_ranges(R, block, R * W)
    return lse


def _ptr(t, r0: int, width: int = 1):
    """ctypes address of row r0 of t (rows of `width` elements), or NULL for None."""
    return None if t is None else ctypes.c_void_p(t.data_ptr() + r0 * width * t.element_size())


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


def map_row_ranges(rows: int, fn, elements: int | None = None) -> list:
    """[fn(r0, r1) for each range of rows], one range per torch thread, on worker threads;
    here alone when the rows hold fewer than PARALLEL_MIN elements (a thread hand-off costs more)."""
    n = max(1, min(torch.get_num_threads(), rows))
    if elements is not None and elements < PARALLEL_MIN:
        n = 1
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
