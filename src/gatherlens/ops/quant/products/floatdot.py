"""y = x W^T for a weight held as the file's plain floats (F16, BF16, F32), read as stored: the mapped
2- or 4-byte values, converted in registers (floatdot.cpp: F16C for halves, a shift for bfloat16),
never into a float copy of the weight.

    >>> if kernel_loaded():
    ...     y = float_matmul(x, raw, "F16")          # x (M, K) float32, raw (N, 2 K) uint8 -> (M, N)

The sums are float32 fused multiply-adds over the exact weights (x is not rounded): the result is
`F.linear(x, w)` on the weight as float32 up to the order of float32 sums (`float_reference`, the
plain path with the same signature, widens the weight for each call and sums in float64). The "q8act" route of
matmul.py calls it for these formats (their records name it: q8act.py's `kernel_of`); its decode speed was measured
against torch's own `F.linear` on the stored half / bfloat16 tensor (x converted), which it beats
by far on this CPU (tests/test_quantized_floatdot.py, docstring).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from gatherlens.ops.native import load_library
from gatherlens.ops.quant.formats.floats import float_values
from gatherlens.ops.quant.formats.layout import LAYOUTS, formats_run_by

__all__ = ["FLOAT_QTYPES", "kernel_loaded", "float_matmul", "float_reference", "KERNEL"]

KERNEL = Path(__file__).with_name("floatdot.cpp")
FLOAT_QTYPES = formats_run_by("floatdot_linear")  # the plain floats: one value a "block"


def kernel_loaded() -> bool:
    """True once `gatherlens::floatdot_linear` is registered (built on first use)."""
    return load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::floatdot_linear", fake_floatdot_linear)


def fake_floatdot_linear(x, raw, qtype):
    return x.new_empty(x.shape[0], raw.shape[0])


def float_matmul(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """x (M, K) -> (M, N) float32 for values raw (N, K * bytes) uint8 of `qtype` (FLOAT_QTYPES). Unchecked."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()  # (M, K)
    return torch.ops.gatherlens.floatdot_linear(x, raw, LAYOUTS[qtype].ggml_type)  # (M, N)


def float_reference(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """The plain path: the stored values widened (exactly) for this call, `F.linear` in float64, as float32."""
    w = float_values(raw, qtype).double()  # (N, K): floats.py's view of the stored values, widened
    return F.linear(x.double(), w).float()  # (M, N)
