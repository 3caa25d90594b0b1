"""The reference of `quantized_linear`: the blocks dequantized to float32, then `F.linear`.

    >>> naive_quantized_linear(x, weight)          # same signature: x (..., K) -> (..., N), x's dtype

Every route in matmul.py is tested against this (torch.equal where the route's arithmetic is the
same, a bound from its roundings where it is not).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.ops.quant.products.linear import QuantizedWeight
from gatherlens.ops.quant.formats.registry import dequantize_rows

__all__ = ["naive_quantized_linear"]


def naive_quantized_linear(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """F.linear(x, W) with W = the blocks as float32 (bit-equal to gguf's dequantize), in float32."""
    w = dequantize_rows(weight.blocks(), weight.qtype)  # (N, K) float32
    return F.linear(x.float(), w).to(x.dtype)  # (..., N)
