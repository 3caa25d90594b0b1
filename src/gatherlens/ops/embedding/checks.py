"""Validation of an embedding lookup, done before any kernel runs.

    >>> ids, bad = check_ids_in_range(torch.tensor([[3, 1, 9]]), vocab=5, bounds="clamp")
    ... # OutOfVocabularyWarning: 1 token id outside the vocabulary [0, 5) clamped; the first is 9 at (0, 2)

The value check is one reduction (`aminmax`) and, on CUDA, one device-to-host copy of its two
numbers; the first bad id is located (one more pass) only when there is one. `bounds=` chooses what
happens to ids outside [0, V), as FBGEMM's `bounds_check_mode` does:

- "raise" (default): GatherIndexError naming the id, its position in `ids` and the valid range.
- "clamp": clamp into [0, V-1], with an OutOfVocabularyWarning.
- "zero": look those ids up as 0, then zero their output rows (no gradient), with a warning.
- "off": no value check; the kernel's own behaviour (an error on CPU, a device assert on CUDA).
"""
from __future__ import annotations

import warnings

import torch

from gatherlens.errors import GatherIndexError, GatherTypeError, GatherValueError, position_of
from gatherlens.ops.tensors import require_data

__all__ = [
    "BOUNDS",
    "OutOfVocabularyWarning",
    "check_table",
    "check_ids",
    "check_padding_idx",
    "check_out",
    "check_ids_in_range",
    "first_out_of_range",
]

BOUNDS = ("raise", "clamp", "zero", "off")
_ID_DTYPES = (torch.int64, torch.int32)
_SMALL = 16  # ids this few are checked on the host from a list: cheaper than a reduction


class OutOfVocabularyWarning(UserWarning):
    """Some token ids were outside the vocabulary and were clamped or zeroed (bounds='clamp'/'zero')."""


def check_table(table, name: str = "table") -> None:
    """A 2-D tensor (V, d)."""
    if not isinstance(table, torch.Tensor):
        raise GatherTypeError(f"{name} must be a torch.Tensor of shape (V, d), got {type(table).__name__}")
    if table.dim() != 2:
        raise GatherValueError(
            f"{name} must be 2-D (vocabulary, dim), got shape {tuple(table.shape)} ({table.dim()}-D)"
        )
    require_data(**{name: table})


def check_ids(ids, table: torch.Tensor, name: str = "ids") -> None:
    """An int32/int64 tensor on the table's device."""
    if not isinstance(ids, torch.Tensor):
        raise GatherTypeError(f"{name} must be a torch.Tensor of int64 or int32 token ids, got {type(ids).__name__}")
    if ids.dtype not in _ID_DTYPES:
        raise GatherTypeError(f"{name} must hold integer token ids (torch.int64 or torch.int32), got dtype {ids.dtype}")
    if ids.device != table.device:
        raise GatherValueError(f"{name} are on {ids.device} but the table is on {table.device}; move one of them")
    require_data(**{name: ids})


def check_padding_idx(padding_idx, vocab: int) -> int | None:
    """As torch.nn.Embedding: an int in [-V, V), negative counted from the end; returned in [0, V)."""
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
        raise GatherTypeError(f"padding_idx must be an int or None, got {type(padding_idx).__name__} {padding_idx!r}")
    if not -vocab <= padding_idx < vocab:
        raise GatherIndexError(f"padding_idx {padding_idx} is outside the vocabulary [{-vocab}, {vocab})")
    return padding_idx % vocab


def check_out(out, shape: tuple[int, ...], table: torch.Tensor) -> None:
    """`out=` must be a contiguous tensor of the result's shape, dtype and device."""
    if not isinstance(out, torch.Tensor):
        raise GatherTypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise GatherValueError(f"out has shape {tuple(out.shape)} but the lookup gives shape {shape}")
    if out.dtype != table.dtype or out.device != table.device:
        raise GatherValueError(
            f"out is {out.dtype} on {out.device} but the table is {table.dtype} on {table.device}"
        )
    if not out.is_contiguous():
        raise GatherValueError(f"out must be contiguous (strides {out.stride()} for shape {shape})")


def first_out_of_range(ids: torch.Tensor, vocab: int) -> tuple[int, tuple[int, ...], int]:
    """(value, position, count) of the first id outside [0, vocab), in row-major order.

    The failure path: one masked pass and one host copy, never a loop over elements.
    """
    bad = ((ids < 0) | (ids >= vocab)).reshape(-1)  # (N,)
    count = int(bad.sum())
    flat = int(bad.nonzero()[0, 0])
    value = int(ids.reshape(-1)[flat])
    return value, position_of(flat, tuple(ids.shape)), count


def _id_range(ids: torch.Tensor) -> tuple[int, int]:
    """(min, max) of non-empty ids: one reduction, and on CUDA one device-to-host copy."""
    if ids.is_cpu:
        if ids.numel() <= _SMALL:  # a short list is cheaper than a reduction's dispatch
            dims = ids.dim()
            values = ids.tolist() if dims == 1 else [ids.item()] if dims == 0 else ids.reshape(-1).tolist()
            return min(values), max(values)
        low, high = torch.aminmax(ids)
        return low.item(), high.item()
    low, high = torch.aminmax(ids)
    return tuple(torch.stack((low, high)).tolist())  # one sync, not one per element


def check_ids_in_range(ids: torch.Tensor, vocab: int, bounds: str = "raise"):
    """Apply the `bounds` policy. Returns (ids to look up, mask of zeroed positions or None)."""
    if bounds not in BOUNDS:
        raise GatherValueError(f"bounds must be one of {', '.join(map(repr, BOUNDS))}, got {bounds!r}")
    if bounds == "off" or ids.numel() == 0:
        return ids, None
    low, high = _id_range(ids)
    if low >= 0 and high < vocab:
        return ids, None
    value, position, count = first_out_of_range(ids, vocab)
    where = f"token id {value} at position {position} is outside the vocabulary [0, {vocab})"
    if bounds == "raise" or vocab == 0:  # an empty table has no row to clamp or zero into
        raise GatherIndexError(where + (f" ({count} ids are)" if count > 1 else ""))
    warnings.warn(
        f"{count} token id{'s' if count > 1 else ''} outside the vocabulary [0, {vocab}) "
        f"{'clamped into [0, %d]' % (vocab - 1) if bounds == 'clamp' else 'looked up as zero rows'}; "
        f"the first: {where}",
        OutOfVocabularyWarning,
        stacklevel=3,
    )
    if bounds == "clamp":
        return ids.clamp(0, vocab - 1), None
    bad = (ids < 0) | (ids >= vocab)  # same shape as ids
    return ids.masked_fill(bad, 0), bad
