"""The dtypes every attention op computes in, and the logit that means "not allowed".

    >>> compute_dtype(torch.bfloat16), stat_dtype(torch.bfloat16)
    (torch.float32, torch.float32)
    >>> compute_dtype(torch.float64), stat_dtype(torch.float64)
    (torch.float64, torch.float64)

Shared by `ops/attention` (top-k attention) and `ops/sparse` (page-selected decoding), so both
round the same way.
"""
from __future__ import annotations

import torch

__all__ = ["NEG_INF", "compute_dtype", "stat_dtype"]

NEG_INF = float("-inf")  # the logit of a key that may not be attended (mask, causal rule, padding)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logits and sums run in float32 for 16-bit inputs (CPU bf16 matmul is slow and coarse)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of lse / weights: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32
