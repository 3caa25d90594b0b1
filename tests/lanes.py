"""The lanes' rule for sweeps: a parametrization over many cases keeps one in the fast lane, the rest in the
slow lane (`pytest -m "not slow"` is the fast lane; tests/test_lanes.py holds the other rules).

    @pytest.mark.parametrize("arch", sweep(list(TINY), fast="llama"))      # llama fast, every other slow
"""
from __future__ import annotations

import pytest


def sweep(values, fast) -> list:
    """`values` as parameters, each but `fast` marked slow: the fast lane runs one case of the sweep."""
    assert any(v is fast or v == fast for v in values), f"{fast!r} is not one of the sweep's values"
    return [v if v is fast or v == fast else pytest.param(v, marks=pytest.mark.slow) for v in values]
