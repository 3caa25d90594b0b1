"""A SIGBUS inside a guarded range of memory (a file mapping whose file was cut short) writes one
line to stderr and ends the process with status 1 (sigbus.cpp), instead of dying silently (135).

    >>> slot = guard_mapping(begin, length, "Error: the model file 'm.gguf' changed while in use ...\\n")
    >>> unguard_mapping(slot)        # when the mapping goes away (its range may be reused)

Reading a mapped page past the end of a file that shrank raises SIGBUS inside whatever reads it:
a C++ kernel on one of torch's threads, numpy, memcpy. Python's `signal.signal` handler would run
only between two bytecodes, which a thread stuck in that fault never reaches, and `faulthandler`
prints a traceback and dies; so the handler is C (async-signal-safe calls only: write, _exit,
sigaction, raise). A fault outside every guarded range goes to the handler that was there before.
Without the kernel (no compiler, GATHERLENS_NATIVE=0) `guard_mapping` returns None: unguarded.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gatherlens.ops.native import load_library

__all__ = ["KERNEL", "kernel_loaded", "guard_mapping", "unguard_mapping"]

KERNEL = Path(__file__).with_name("sigbus.cpp")


def kernel_loaded() -> bool:
    """True once `gatherlens::guard_mapping` is registered (built on first use)."""
    return load_library(KERNEL)


def guard_mapping(begin: int, length: int, line: str) -> int | None:
    """Guard the bytes [begin, begin + length): a SIGBUS there writes `line` (UTF-8, at most 1 KiB)
    to stderr and exits 1. The slot to unguard it with; None when no kernel or every slot is taken.

        >>> guard_mapping(array.__array_interface__["data"][0], array.nbytes, "Error: ...\\n")
        3
    """
    if not kernel_loaded():
        return None
    slot = int(torch.ops.gatherlens.guard_mapping(int(begin), int(length), line))
    return slot if slot >= 0 else None


def unguard_mapping(slot: int | None) -> None:
    """Stop guarding `slot` (from guard_mapping; None: nothing to do).

        >>> unguard_mapping(3)
    """
    if slot is not None and kernel_loaded():
        torch.ops.gatherlens.unguard_mapping(int(slot))
