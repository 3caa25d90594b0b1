"""What every tensor an op is given, or makes, must be: data (not the meta device), and an allocation
this machine can hold; one error naming the argument otherwise, never torch's own.

    >>> require_data(query=q, key=k)            # a meta tensor has a shape and no data
    GatherValueError: key is on the meta device: it has a shape but no data; ...
    >>> check_allocation("PagedKVCache storage", (1, 2, 10**15, 16, 8), torch.float32)
    GatherValueError: PagedKVCache storage of shape (1, 2, 1000000000000000, 16, 8) float32 would take ...

Shared by the ops (embedding, attention, sparse, quant) and the trace builders, so a meta tensor or a
size past the machine's memory is refused the same way everywhere.
"""
from __future__ import annotations

import math
import os

import torch

from gatherlens.errors import GatherValueError

__all__ = ["require_data", "check_allocation", "memory_bytes"]


def require_data(**tensors) -> None:
    """Each named tensor holds data: a tensor on the meta device (a model made with init_empty_weights,
    `torch.empty(..., device="meta")`) is refused by name before any kernel reads it."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_meta:
            raise GatherValueError(f"{name} is on the meta device: it has a shape but no data; make it on cpu (or "
                                   f"cuda), or load the weights of a model made on meta (model.to_empty, then "
                                   f"load_state_dict) before calling")


def memory_bytes() -> int:
    """This machine's memory (RAM), in bytes; 2**62 where it cannot be told."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_allocation(what: str, shape, dtype: torch.dtype, device=None) -> None:
    """Refuse a tensor of `shape` and `dtype` that no machine of this size holds (CPU: more bytes than its
    memory; any device: past 2**62 bytes), naming `what`, the shape and the bytes, before torch tries."""
    numel = math.prod(int(n) for n in shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    cpu = device is None or torch.device(device).type in ("cpu", "meta")
    limit = memory_bytes() if cpu else 1 << 62
    if nbytes > limit:
        raise GatherValueError(f"{what} of shape {tuple(int(n) for n in shape)} {str(dtype).removeprefix('torch.')} "
                               f"would take {_size(nbytes)}; this machine has {_size(memory_bytes())} of memory")


def _size(n: int) -> str:
    for unit, step in (("EB", 1 << 60), ("PB", 1 << 50), ("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20)):
        if n >= step:
            return f"{n / step:,.1f} {unit}"
    return f"{n:,} bytes"
