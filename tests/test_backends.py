"""The backend tables (ops/backends.py): which implementation ran, and why the others did not."""
from __future__ import annotations

import pytest
import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops import backends
from gatherlens.ops.backends import Impl, Operator
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.fused_decode import kernel_loaded


def test_auto_runs_the_first_row_that_fits_and_records_it():
    op = Operator("toy_double", [Impl("fast", lambda x: None if x > 0 else "x is not positive", lambda x: 2 * x),
                                 Impl("plain", lambda x: None, lambda x: x + x)])
    backends.reset_ran()
    assert op(3) == 6 and op(-1) == -2
    assert backends.ran()["toy_double"] == {"fast": 1, "plain": 1}
    assert "toy_double: fast x1, plain x1" in backends.describe()
    assert op.why(-1) == [("fast", "x is not positive"), ("plain", None)]
    with pytest.raises(GatherValueError, match=r"backend = 'fast' cannot run this toy_double call: x is not "
                                               r"positive; use backend='plain' or 'auto'"):
        op(-1, backend="fast")
    with pytest.raises(GatherValueError, match="is not one of toy_double's"):
        op(1, backend="nope")
    backends.OPERATORS.pop("toy_double")


def test_describe_lists_what_a_tiny_decode_ran():
    from gatherlens.models.attention.sparse import CONFIG_ATTR, decode_attention
    from gatherlens.ops.sparse.config import SparseConfig

    cache = PagedKVCache(1, 3, 16, page_size=8)
    cache.append(torch.randn(1, 3, 200, 16), torch.randn(1, 3, 200, 16))
    module = torch.nn.Module()
    module.layer_idx = 4
    module.__dict__[CONFIG_ATTR] = SparseConfig(budget=64)
    backends.reset_ran()
    for _ in range(3):
        decode_attention(module, torch.randn(1, 9, 1, 16), cache, None, 0.25)  # the model's entrance
    sparse_decode(torch.randn(1, 9, 1, 16), cache, 64, softcap=5.0)  # the user's: native cannot cap
    row = "native" if kernel_loaded() else "torch"
    text = backends.describe()
    assert text.startswith(f"sparse_decode: {row} x3, torch x1" if row == "native" else "sparse_decode: torch x4")
    assert "triton: the query is not on a CUDA device" in text
    if row == "native":
        assert "skipped" in text
