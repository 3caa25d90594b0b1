"""GGUF's plain float tensors (F32, F16, BF16) as rows of "blocks" of one weight: the stored values.

    >>> raw = torch.zeros(3, 4 * 2, dtype=torch.uint8)        # (R, n*2): 3 rows of 4 F16 values
    >>> (v,) = f16_fields(raw)
    >>> v.shape, v.dtype
    (torch.Size([3, 4]), torch.float16)

Each record's one field `v` (kind "value") is the little-endian value itself; the record's
`value_dtype` (layout.py) names the torch dtype it is stored in (the one home of that fact:
dequantize.py widens it to float32, exactly, and models/gguf/check.py checks it is finite). BF16 is
float32's top 16 bits, so widening is a shift.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.quant.formats.layout import LAYOUTS

__all__ = ["float_values", "value_dtype", "f32_fields", "f16_fields", "bf16_fields"]


def value_dtype(qtype: str) -> torch.dtype:
    """The dtype a value of the plain float format `qtype` is stored in (its record's `value_dtype`);
    any other format is a GatherValueError naming it."""
    dtype = LAYOUTS[qtype].value_dtype if qtype in LAYOUTS else None
    if dtype is None:
        floats = [q for q, layout in LAYOUTS.items() if layout.value_dtype is not None]
        raise GatherValueError(f"qtype must be a plain float format ({', '.join(floats)}), got {qtype!r}")
    return dtype


def float_values(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """(R, n * bytes) uint8 rows of `qtype` -> (R, n) values in its record's value_dtype, a view (a copy
    when the bytes are not aligned to the value, e.g. a table sliced by one byte)."""
    dtype = value_dtype(qtype)
    size = torch.empty((), dtype=dtype).element_size()
    if not raw.is_contiguous() or raw.storage_offset() % size:
        raw = raw.clone(memory_format=torch.contiguous_format)  # (R, n * bytes), aligned
    return raw.view(dtype)  # (R, n)


def f32_fields(raw: torch.Tensor) -> tuple[torch.Tensor]:
    """F32 rows (R, n*4) uint8 -> (v: float32 (R, n),)."""
    return (float_values(raw, "F32"),)


def f16_fields(raw: torch.Tensor) -> tuple[torch.Tensor]:
    """F16 rows (R, n*2) uint8 -> (v: float16 (R, n),)."""
    return (float_values(raw, "F16"),)


def bf16_fields(raw: torch.Tensor) -> tuple[torch.Tensor]:
    """BF16 rows (R, n*2) uint8 -> (v: bfloat16 (R, n),)."""
    return (float_values(raw, "BF16"),)
