"""llama.cpp's CPU matmul for Q4_0 / Q4_1 / Q8_0 weights: x quantized to 8 bits per 32 values, the
dot products in integers, the weight read as its GGUF blocks (q8act.cpp, which takes each format's
type number, block bytes and field offsets from quant_formats.h, generated from layout.py).

    >>> if kernel_loaded():
    ...     y = q8act_matmul(x, raw, "Q4_1")        # x (M, K) float32, raw (N, row_bytes) -> (M, N)

Each 32-value block of a row of x becomes dx = max|x| / 127 and codes qx = round(x / dx); a weight
block (scale d, min m) contributes d dx sum(q qx) + m dx sum(qx). The only rounding beyond float32's
is x's to 8 bits (as llama.cpp rounds it); `q8act_reference` (q8act_naive.py) computes the same
sums in float64 and the tests compare with it and with the float reference. The "q8act" route of
matmul.py calls it: no packed copy of the weight at all.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gatherlens.ops.native import load_library
from gatherlens.ops.quant.layout import LAYOUTS, formats_taking

__all__ = ["Q8ACT_QTYPES", "GGML_TYPE", "kernel_loaded", "q8act_matmul", "KERNEL"]

KERNEL = Path(__file__).with_name("q8act.cpp")
Q8ACT_QTYPES = formats_taking("q8act")  # the formats whose records name this kernel
GGML_TYPE = {q: LAYOUTS[q].ggml_type for q in Q8ACT_QTYPES}  # ggml's type numbers, as the operator takes them


def kernel_loaded() -> bool:
    """True once `gatherlens::q8act_linear` is registered (built on first use)."""
    return load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::q8act_linear", fake_q8act_linear)


def fake_q8act_linear(x, raw, qtype):
    return x.new_empty(x.shape[0], raw.shape[0])


def q8act_matmul(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """x (M, K) -> (M, N) float32 for blocks raw (N, row_bytes) of `qtype` (Q8ACT_QTYPES). Unchecked."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()  # (M, K)
    return torch.ops.gatherlens.q8act_linear(x, raw, GGML_TYPE[qtype])  # (M, N)
