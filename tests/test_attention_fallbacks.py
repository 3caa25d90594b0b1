"""Every test of test_attention.py again, on the paths the CPU fast path falls back to: the chunked
reference (autograd's forward, other devices) and the numpy selection (no C++ compiler)."""
from __future__ import annotations

import pytest

from gatherlens.ops.attention import sparse_sum
from gatherlens.ops.attention.select import threshold_kernel
from test_attention import *  # noqa: F401,F403  (collected here again, under the fixture below)


pytestmark = pytest.mark.slow  # a sweep: every test of test_attention.py again on two more paths


@pytest.fixture(autouse=True, params=["chunked", "numpy"])
def fallback(request, monkeypatch):
    """Run each test with the fast path off (chunked.py) or with the kernel missing (numpy)."""
    if request.param == "chunked":
        monkeypatch.setattr(sparse_sum, "ENABLED", False)
    else:
        monkeypatch.setattr(threshold_kernel, "kernel_loaded", lambda: False)
    return request.param
