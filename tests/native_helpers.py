"""The one home of how a test of a native (C++) kernel reacts to a kernel that did not build.

    pytestmark = needs_native(fused)          # every test of a module needs ops/layer/layer_ops.cpp
    @needs_native(fused_decode)               # one test
    pytest.param("Q4_K", marks=needs_native(lambda: q8act.ready("Q4_K")))   # one case
    require_native(q8act.ready(qtype))        # inside a test: None, or why not

A kernel that did not build (no compiler, no ninja, a compile error) fails each of its tests with the
reason, so a broken toolchain cannot turn them into skips and leave CI green. Only where the user
turned native kernels off on purpose, GATHERLENS_NATIVE=0 (ops/native.py then builds nothing), are
they skipped, saying so. tests/conftest.py applies the `native` mark at each test's setup.
"""
from __future__ import annotations

import os

import pytest

OFF = os.environ.get("GATHERLENS_NATIVE") == "0"  # the user turned native kernels off


def require_native(why_not: str | None) -> None:
    """Nothing when `why_not` is None (the kernel is there); else skip (native kernels off) or fail."""
    if why_not is None:
        return
    if OFF:
        pytest.skip(f"native kernels are off (GATHERLENS_NATIVE=0): {why_not}")
    pytest.fail(f"a native kernel did not build: {why_not}; fix the toolchain (a C++ compiler and ninja), "
                f"or set GATHERLENS_NATIVE=0 to skip the native tests on purpose", pytrace=False)


def needs_native(*needs):
    """The mark of a test that needs native kernels, asked at the test's setup (not at collection): each
    of `needs` an ops module with `kernel_loaded()` and its source `KERNEL`, or a function giving None
    or why not (`lambda: q8act.ready(qtype)`)."""
    return pytest.mark.native.with_args(*needs)


def _why_not(need) -> str | None:
    if callable(need):
        return need()
    return None if need.kernel_loaded() else f"{need.KERNEL.name} did not build"


def check_native_marks(item) -> None:
    """At a test's setup (conftest.py): what each of its `native` marks needs is there, or skip / fail as above."""
    for mark in item.iter_markers("native"):
        for need in mark.args:
            require_native(_why_not(need))
