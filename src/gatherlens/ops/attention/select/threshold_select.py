"""Exact top-k per CPU row as a threshold: the k-th largest logit, and which of its ties are kept.

    >>> vals, idx = topk_rows(torch.tensor([[1., 3., 3., -inf], [2., 0., 5., 5.]]), 2)
    >>> idx                     # each row's kept keys, in ascending key index
    tensor([[1, 2],
            [2, 3]])

The rule is the tie rule (ties.py), the same keys as `select_topk` (exact_topk.py). Two
implementations give them:

- the C++ operators (threshold_kernel.py, threshold_select.cpp): a lower bound of the k-th largest
  from a sample of the row, one vectorized pass that keeps the few keys above it, the exact k-th
  largest among those by counting, then the tie rule; optionally the softmax weights over the kept
  keys (`weights=True`) or, for a dense product with V, the whole row overwritten by them
  (`topk_weights_`). About 1 ns per logit; no Python per row.
- numpy, where no compiler is found (threshold_numpy.py); several times slower.

Row blocks run on the worker threads (workers.py), one per torch thread, for calls with at least
PARALLEL_MIN logits.
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.select import threshold_kernel
from gatherlens.ops.attention.select.threshold_numpy import numpy_topk_rows
from gatherlens.ops.attention.select.workers import map_row_ranges


def use_kernel(native) -> bool:
    """native=None: the C++ operators if they build; False: numpy; True: the operators or an error."""
    ok = native is not False and threshold_kernel.kernel_loaded()
    if native and not ok:
        raise RuntimeError(f"the native kernel {threshold_kernel.KERNEL.name} did not build (see the warning)")
    return ok


def topk_rows(x: torch.Tensor, k: int, *, lens=None, base=None, weights: bool = False, native=None):
    """Each row's kept keys (the tie rule), in ascending key index.

    x (R, W) float32/float64 on CPU, or (N, G, W) read as R = N*G rows, any strides (decode logits
    stay (B*Hkv, L, G) in memory and are read as rows); row r ranks keys [0, lens[r]) (lens (R,)
    int64; default all W: a causal row passes its prefix). Returns vals, idx (R, k'), k' = min(k, W),
    padded with -inf and -1; with base (R,) int64, idx + base[r] (padding: base[r]), rows of a value
    table. weights=True also returns w (R, k'), the softmax over each row's kept logits (0 where
    padded), and lse (R,). native=None: the C++ kernel if it builds, else numpy (False: numpy).
    """
    x3 = (x.unsqueeze(1) if x.dim() == 2 else x).detach()      # (N, G, W)
    N, G, W = x3.shape
    k = min(k, W)                                               # more than a row holds keeps the row
    if not use_kernel(native):
        return numpy_topk_rows(x3.reshape(N * G, W), min(k, W), lens, base, weights)
    return kernel_rows(x3.unsqueeze(1), k, lens, base, weights)


def kernel_rows(x4: torch.Tensor, k: int, lens, base, weights: bool):
    """torch.ops.gatherlens.topk_rows over the rows of x4 (N, n, grp, W), in blocks on the workers."""
    N, n, grp, W = x4.shape
    R = N * grp
    lens, base = (None if t is None else t.contiguous() for t in (lens, base))
    op = torch.ops.gatherlens.topk_rows
    parts = map_row_ranges(R, lambda r0, r1: op(x4, lens, base, k, weights, r0, r1), R * W * n)
    out = parts[0] if len(parts) == 1 else [torch.cat(p) for p in zip(*parts)]
    return tuple(out) if weights else tuple(out[:2])


def topk_weights_(x: torch.Tensor, k: int, *, lens=None, native=None) -> torch.Tensor:
    """In place: each row of x (R, W) becomes the softmax over its kept keys, 0 elsewhere (and past
    lens[r]); returns lse (R,). For a matmul by V when k is a large part of the row."""
    R, W = x.shape
    k = min(k, W)                                               # more than a row holds keeps the row
    if not x.is_contiguous() or not use_kernel(native):
        vals, idx, w, lse = topk_rows(x, k, lens=lens, weights=True, native=native)
        x.zero_().scatter_add_(-1, idx.clamp_min(0), w)        # padding adds 0 at key 0
        return lse
    lens = None if lens is None else lens.contiguous()
    op = torch.ops.gatherlens.topk_weights_into

    def block(r0, r1):
        return op(x[r0:r1], None if lens is None else lens[r0:r1], k)

    parts = map_row_ranges(R, block, R * W)
    return parts[0] if len(parts) == 1 else torch.cat(parts)
