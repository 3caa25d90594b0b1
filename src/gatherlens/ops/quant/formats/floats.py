"""GGUF's plain float tensors (F32, F16, BF16) as rows of "blocks" of one weight: the stored values.

    >>> raw = torch.zeros(3, 4 * 2, dtype=torch.uint8)        # (R, n*2): 3 rows of 4 F16 values
    >>> (v,) = f16_fields(raw)
    >>> v.shape, v.dtype
    (torch.Size([3, 4]), torch.float16)

Each record's one field `v` (kind "value") is the little-endian value itself; `VALUE_DTYPES` names the
torch dtype it is stored in (the one home of that fact: dequantize.py widens it to float32, exactly, and
models/gguf/check.py checks it is finite). BF16 is float32's top 16 bits, so widening is a shift.
"""
from __future__ import annotations

import torch

__all__ = ["VALUE_DTYPES", "float_values", "f32_fields", "f16_fields", "bf16_fields"]

VALUE_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def float_values(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """(R, n * bytes) uint8 rows of `qtype` -> (R, n) values in VALUE_DTYPES[qtype], a view (a copy when
    the bytes are not aligned to the value, e.g. a table sliced by one byte)."""
    dtype = VALUE_DTYPES[qtype]
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
