"""llama.cpp's CPU matmul for the super-block formats (K-quants, IQ4_XS): x quantized to Q8_K (8 bits
per 256 values, with sums per 16), the dot products in integers, the weight read as its GGUF blocks
(q8k.cpp, which takes each format's type number, block bytes, field offsets and codebook from
quant_formats.h, generated from layout.py).

    >>> if kernel_loaded():
    ...     y = q8k_matmul(x, raw, "Q4_K")          # x (M, K) float32, K % 256 == 0 -> (M, N)

Each 256-value block of a row of x becomes dx = max|x| / 127, codes qx = round(x / dx) and the sums
of qx per 16; a weight super-block (d, dmin, integer sub-block scales sc and mins mn) contributes
d dx sum_s sc_s sum(q qx) - dmin dx sum_s mn_s sum(qx). The only rounding beyond float32's is x's to
8 bits (as llama.cpp rounds it); `q8k_reference` (q8k_naive.py) computes the same sums in float64
and the tests compare with it and with the float reference. The "q8act" route calls it for these
formats (q8act_matmul for the 32-weight ones): no copy of the weight at all.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from gatherlens.ops.native import load_library
from gatherlens.ops.quant.formats.layout import LAYOUTS, formats_run_by

__all__ = ["Q8K_QTYPES", "kernel_loaded", "q8k_matmul", "KERNEL", "blocked_simd", "row_simd"]

KERNEL = Path(__file__).with_name("q8k.cpp")
# the super-block formats (codes in blocks of 256 with sub-block scales): the records naming this kernel
Q8K_QTYPES = formats_run_by("q8k_linear")


def kernel_loaded() -> bool:
    """True once `gatherlens::q8k_linear` is registered (built on first use)."""
    return load_library(KERNEL, on_load=register_fakes)


SIMD = ("scalar", "avx2", "avx2")  # q8k.cpp's blocked loop, by `gatherlens::q8k_simd()` (2: its one-row loop
ROW_SIMD = ("scalar", "avx2", "avx512")  # of Q4_K and Q6_K in AVX-512BW; the blocked loop AVX2)


@cache
def blocked_simd() -> str | None:
    """The instructions of q8k.cpp's blocked loop (x of several rows) in this build: "avx2", or "scalar"
    (its plain twin); None where the operator did not build."""
    return SIMD[torch.ops.gatherlens.q8k_simd()] if kernel_loaded() else None


@cache
def row_simd() -> str | None:
    """The instructions of q8k.cpp's one-row loop (decode) for Q4_K and Q6_K in this build: "avx512"
    (AVX-512BW), "avx2", or "scalar"; None where the operator did not build."""
    return ROW_SIMD[torch.ops.gatherlens.q8k_simd()] if kernel_loaded() else None


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::q8k_linear", fake_q8k_linear)


def fake_q8k_linear(x, raw, qtype):
    return x.new_empty(x.shape[0], raw.shape[0])


def q8k_matmul(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """x (M, K) -> (M, N) float32 for blocks raw (N, row_bytes) of `qtype` (Q8K_QTYPES). Unchecked."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()  # (M, K)
    return torch.ops.gatherlens.q8k_linear(x, raw, LAYOUTS[qtype].ggml_type)  # (M, N)
