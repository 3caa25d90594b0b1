"""The prefill's product with the weight dequantized a tile of rows at a time, never whole.

    >>> y = tiled_dequant_matmul(x, weight)             # x (M, K) -> (M, N), as the "dequant" route
    >>> y = tiled_dequant_matmul(x, weight, rows=256)   # 256 weight rows dequantized per tile

The "dequant" route (matmul.py, the prefill row of linear.LINEAR_PRODUCT) dequantizes the whole
weight (N, K) to float32 for each call: for a 49,152-row head that is a 113 MB copy beside its
blocks, for a 14,336 x 4,096 MLP weight 235 MB. Here `rows` weight rows at a time (default: as many
as TILE_BYTES of float32 hold, so a small weight is one tile: the reference's own call) are
dequantized, and each tile's product is written into its columns of the one preallocated output
(M, N): the float32 copy of a large weight never exists whole (linear.LINEAR_PRODUCT's "prefill" row).
Every output element is the same dot product of x's row and the dequantized weight row as
F.linear's (tested against the reference `dequant` route, to float32's rounding of the GEMM's order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.ops.quant.formats.registry import dequantize_rows

__all__ = ["TILE_BYTES", "tiled_dequant_matmul"]

TILE_BYTES = 8 << 20  # float32 bytes of weight dequantized at a time: SmolLM2's layers are one tile, its head 12


def tiled_dequant_matmul(x: torch.Tensor, weight, rows: int | None = None) -> torch.Tensor:
    """x (M, K) -> (M, N) in x's dtype for a QuantizedWeight (N, K), `rows` weight rows dequantized at
    a time (None: TILE_BYTES' worth; the "dequant" route's signature and result, less memory). Unchecked."""
    N, K = weight.shape
    rows = rows or max(1, TILE_BYTES // (4 * K))
    xf = x if x.dtype == torch.float32 else x.float()  # (M, K)
    if N <= rows:
        out = F.linear(xf, dequantize_rows(weight.blocks(), weight.qtype))  # (M, N)
    else:
        out = torch.empty(x.shape[0], N, dtype=torch.float32, device=x.device)  # (M, N)
        for n0 in range(0, N, rows):
            w = dequantize_rows(weight.blocks(n0, n0 + rows), weight.qtype)  # (n, K) float32, this tile only
            out[:, n0:n0 + rows] = F.linear(xf, w)  # (M, n)
    return out if x.dtype == torch.float32 else out.to(x.dtype)
