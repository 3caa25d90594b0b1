"""Faults of the process turned into one clear line: a SIGBUS inside a guarded file mapping.

    >>> from gatherlens.ops.fault import guard_mapping, unguard_mapping
    >>> slot = guard_mapping(address, length, "Error: the model file ... changed while in use\\n")

`sigbus.py` holds the operators (sigbus.cpp, built on first use); without a compiler nothing is
guarded and the caller's own checks (models/files/watch.py) are all there is.
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

_EXPORTS = {"guard_mapping": "sigbus", "unguard_mapping": "sigbus", "kernel_loaded": "sigbus"}

__all__ = ["guard_mapping", "unguard_mapping", "kernel_loaded"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
