"""Validation of raw GGUF blocks and of what a QuantizedTable is asked, before any kernel.

    >>> check_blocks(torch.zeros(3, 40, dtype=torch.uint8), "Q4_1")      # 3 rows of 2 blocks
    >>> check_blocks(torch.zeros(3, 41, dtype=torch.uint8), "Q4_1")
    Traceback (most recent call last):
    gatherlens.errors.GatherValueError: blocks of Q4_1 rows must be a whole number of 20-byte blocks ...
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.quant.formats.sizes import QTYPES, SIZES

__all__ = ["check_qtype", "check_blocks", "check_no_grad", "QUANT_METHODS", "check_method"]

QUANT_METHODS = ("fast", "naive")  # vectorised rows, or the per-block reference (naive.py)


def check_qtype(qtype) -> str:
    """A format name this package reads ("Q4_1", ...); returned as given."""
    if qtype not in SIZES:
        raise GatherValueError(f"qtype must be one of {', '.join(map(repr, QTYPES))}, got {qtype!r}")
    return qtype


def check_blocks(blocks, qtype: str, name: str = "blocks") -> None:
    """A 2-D uint8 tensor (rows, bytes per row), each row a whole, non-zero number of blocks."""
    if not isinstance(blocks, torch.Tensor):
        raise GatherTypeError(f"{name} must be a uint8 torch.Tensor or numpy array (rows, bytes per row), "
                              f"got {type(blocks).__name__}")
    if blocks.dtype != torch.uint8 or blocks.dim() != 2:
        raise GatherValueError(f"{name} must be 2-D uint8 (rows, bytes per row), got {blocks.dtype} "
                               f"of shape {tuple(blocks.shape)}")
    nbytes = SIZES[qtype][1]
    if blocks.shape[1] == 0 or blocks.shape[1] % nbytes:
        raise GatherValueError(f"{name} of {qtype} rows must be a whole number of {nbytes}-byte blocks; "
                               f"got {blocks.shape[1]} bytes per row")


def check_no_grad(flag: bool) -> None:
    """A QuantizedTable holds integer codes: there is nothing for autograd to differentiate."""
    if flag:
        raise GatherTypeError(
            "a QuantizedTable holds integer GGUF blocks and cannot require grad: no gradient flows into "
            "a quantized table; train a float table (table.dequantize().requires_grad_()) instead")


def check_method(method: str) -> None:
    """The formulations a quantized lookup has (the dense table's others need float rows)."""
    if method not in QUANT_METHODS:
        raise GatherValueError(f"method {method!r} needs a float table; a QuantizedTable is looked up "
                               f"with {' or '.join(map(repr, QUANT_METHODS))}")
