"""The C++ top-k operators (threshold_select.cpp), loaded on first use, with their fake kernels.

    >>> if kernel_loaded():
    ...     vals, idx, w, lse = torch.ops.gatherlens.topk_rows(x4, lens, base, k, True, 0, rows)
    ...     lse = torch.ops.gatherlens.topk_weights_into(x, lens, k)      # x (R, W) overwritten

`torch.ops.gatherlens.topk_rows(x, lens, base, k, weights, row_start, row_stop)`: x (N, n, grp, W)
float32/float64 on CPU, any strides; row r of its R = N * grp rows is the sum over dim 1 of
x[r // grp, :, r % grp] (added in order; n = 1 for plain rows) and ranks keys [0, lens[r]) (lens,
base: (R,) int64 or None). Rows [row_start, row_stop) -> vals, idx (rows, min(k, W)) padded with
-inf / -1 (idx + base[r] with base, padding base[r]), and with weights=True the softmax weights w
(rows, min(k, W)) and lse (rows,); else those two are empty. `topk_weights_into(x, lens, k)`: x
(R, W) contiguous becomes each row's softmax over its kept keys, 0 elsewhere; returns lse (R,).
The fake kernels below give the output shapes, so both run under torch.compile and FakeTensors.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gatherlens.ops.native import load_library

KERNEL = Path(__file__).with_name("threshold_select.cpp")


def kernel_loaded() -> bool:
    """True once the operators are registered (built on the first call); False: use the numpy path."""
    return load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    """The fake (meta) kernels of the two operators: output shapes and dtypes only."""
    torch.library.register_fake("gatherlens::topk_rows", fake_topk_rows)
    torch.library.register_fake("gatherlens::topk_weights_into", fake_topk_weights_into)


def fake_topk_rows(x, lens, base, k, weights, row_start, row_stop):
    rows, width = row_stop - row_start, min(k, x.shape[3])
    n = rows if weights else 0
    return (x.new_empty(rows, width), x.new_empty(rows, width, dtype=torch.long), x.new_empty(n, width),
            x.new_empty(n))


def fake_topk_weights_into(x, lens, k):
    return x.new_empty(x.shape[0])
