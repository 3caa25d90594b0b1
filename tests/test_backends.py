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
    assert text.startswith("decode_attention: pages x3 (skipped window: a paged cache (a global layer))\n")
    line = text.splitlines()[1]
    assert line.startswith(f"sparse_decode: {row} x3, torch x1" if row == "native" else "sparse_decode: torch x4")
    assert "triton: the query is not on a CUDA device" in text
    if row == "native":
        assert "skipped" in text


# -- capabilities fail closed: a variant field no row lists is refused by every row -----------------------
def _extended_variant():
    """An AttentionVariant with one more field, as a new architecture's feature would add it."""
    import dataclasses

    from gatherlens.ops.attention.variants import AttentionVariant

    extended = dataclasses.make_dataclass("Extended", [("dummy", float, None)], bases=(AttentionVariant,),
                                          frozen=True, eq=False)
    return extended(dummy=1.0)


def _variant_operators():
    """Every operator whose rows declare variant fields (their modules imported, so registered)."""
    import gatherlens.models.attention.sparse  # noqa: F401  DECODE_ATTENTION
    import gatherlens.models.runtime.step  # noqa: F401  DECODE_STEP
    import gatherlens.ops.prefill.attend  # noqa: F401  BLOCK_PREFILL

    ops = [op for op in backends.OPERATORS.values() if op.facts is not None]
    assert {"sparse_decode", "block_prefill", "decode_step", "decode_attention"} <= {op.name for op in ops}
    return ops


def test_every_row_that_does_not_list_a_new_variant_field_refuses_it():
    """A field added to AttentionVariant (here by a subclass) reaches no kernel that lacks it: every row of every
    table declares the fields it applies, and refuses a variant setting any other, naming the field."""
    variant = _extended_variant()
    assert variant.used == frozenset({"dummy"})
    for op in _variant_operators():
        for impl in op.impls:
            if impl.variant is backends.EVERY_VARIANT:  # hands the variant on to a table that checks it
                continue
            assert "dummy" not in impl.variant
            assert "sets dummy, which this row does not apply" in impl.refusal((variant.used, None)), (op.name, impl)


def test_a_new_variant_field_is_an_error_in_real_calls_not_a_wrong_answer():
    from gatherlens.ops.prefill.attend import BLOCK_PREFILL
    from gatherlens.ops.sparse.config import OP
    from gatherlens.ops.sparse.decode import SPARSE_DECODE

    variant = _extended_variant()
    cache = PagedKVCache(1, 2, 16, page_size=8)
    cache.append(torch.randn(1, 2, 50, 16), torch.randn(1, 2, 50, 16))
    q = torch.randn(1, 4, 1, 16)
    assert all("dummy" in why for _, why in SPARSE_DECODE.why(q, cache, 16, OP.choice, 0.25, variant, None, False))
    with pytest.raises(GatherValueError, match="no implementation of sparse_decode takes these arguments: .*dummy"):
        sparse_decode(q, cache, 16, variant=variant)
    k = torch.randn(1, 2, 32, 16)
    blocks = torch.ones(1, 2, 2, 2, dtype=torch.bool)
    assert all("dummy" in why for _, why in BLOCK_PREFILL.why(torch.randn(1, 4, 32, 16), k, k, blocks, 16, 0.25,
                                                                variant))


def test_a_model_whose_layers_use_a_new_variant_field_runs_no_plan_row():
    """The decode-step table: the stack and the planned loop refuse a plan whose layers set a field they do not
    list; transformers' forward takes the step (its attention call hands the variant to sparse decode's table)."""
    import dataclasses

    from test_models_sparse import tiny_llama

    from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding
    from gatherlens.models.runtime.step import DECODE_STEP, installed_plan

    model = tiny_llama()
    use_sparse_decoding(model, budget=8, page_size=4)
    try:
        cache = SparseKVCache(config=model.config, page_size=4)
        with torch.no_grad():
            model(input_ids=torch.randint(1, 101, (1, 20)), cache=cache, use_cache=True)
        plan = dataclasses.replace(installed_plan(model), variants=frozenset({"dummy"}))
        why = dict(DECODE_STEP.why(plan, model, (torch.tensor([[5]]),), {"cache": cache}))
    finally:
        use_dense_decoding(model)
    assert "sets dummy" in why["stack"] and "sets dummy" in why["planned"] and why["hf"] is None
