"""Public names that load on first use (PEP 562): the one rule every package's `__init__` uses,
so that `gatherlens --help` and `gatherlens cache list` import no torch.

    >>> __getattr__, __dir__ = lazy_exports(__name__, {"sparse_decode": "decode"})   # in a package's __init__

`exports` maps a public name to the module that defines it: absolute ("gatherlens.ops.embedding"),
relative (".decode") or a bare submodule of the package ("decode"). A name is imported once, then
kept in the package's namespace.
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable, Callable]:
    """The (__getattr__, __dir__) pair of `package`, loading each name of `exports` on first use."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if not module.startswith(("gatherlens", ".")):
            module = "." + module
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
