"""The q8act route (llama.cpp's integer matmul, q8act.cpp) against its float64 reference (the same
8-bit rounding of x) and against the float reference, with the error bound that rounding implies."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from gatherlens.ops.quant import FORMATS, q8act
from gatherlens.ops.quant.linear import LinearConfig, pack_linear, quantized_linear, split_linear
from gatherlens.ops.quant.linear_naive import naive_quantized_linear
from gatherlens.ops.quant.q8act_naive import q8act_reference, quantize_activations

pytestmark = pytest.mark.skipif(not q8act.kernel_loaded(), reason="no C++ compiler or ninja")
QTYPES = q8act.Q8ACT_QTYPES  # the formats whose records name the q8act route


def blocks(qtype: str, rows: int, width: int, seed: int = 0) -> torch.Tensor:
    data = (np.random.default_rng(seed).standard_normal((rows, width)) * 0.05).astype(np.float32)
    return torch.from_numpy(quantize(data, GGMLQuantizationType[qtype]))  # (rows, row bytes)


def x_rounding_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|x W^T - x' W^T| <= sum_k |W[n, k]| dx(k) / 2 for x' = x rounded to 8 bits per block: (M, N)."""
    _, dx = quantize_activations(x)  # (M, K/32)
    half_step = (dx / 2).float().repeat_interleave(32, dim=1)  # (M, K)
    return half_step @ w.abs().t() * (1 + 1e-4) + 1e-6  # (M, N), plus float32 sums' slack


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 1, 32), (1, 37, 96), (3, 65, 576), (2, 130, 1536), (0, 5, 64)], ids=str)
def test_kernel_equals_its_reference_and_stays_within_the_rounding_bound(qtype, M, N, K):
    raw = blocks(qtype, N, K, seed=N)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(K)) * 2  # (M, K)
    y = q8act.q8act_matmul(x, raw, qtype)  # (M, N)
    assert y.shape == (M, N) and y.dtype == torch.float32
    ref = q8act_reference(x, raw, qtype)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    w = pack_linear(raw, qtype, LinearConfig("dequant", None)).dequantize()  # (N, K) exact
    assert ((y - x @ w.t()).abs() <= x_rounding_bound(x, w)).all()


@pytest.mark.parametrize("qtype", QTYPES)
def test_zero_blocks_and_large_values(qtype):
    raw = blocks(qtype, 9, 64)
    x = torch.zeros(2, 64)
    x[1, 40] = 1e4  # one block all zeros, one dominated by a single value
    torch.testing.assert_close(q8act.q8act_matmul(x, raw, qtype), q8act_reference(x, raw, qtype), atol=1e-3, rtol=1e-5)
    assert torch.equal(q8act.q8act_matmul(x[:1], raw, qtype), torch.zeros(1, 9))


@pytest.mark.parametrize("batch", [(1,), (7,), (2, 3), ()], ids=str)
def test_the_route_through_quantized_linear(batch):
    w = pack_linear(blocks("Q4_1", 40, 96), "Q4_1", LinearConfig("q8act", None))
    assert w.tensors == () and w.activation_dtype == torch.float32  # nothing packed beside the blocks
    x = torch.randn(*batch, 96)
    y = quantized_linear(x, w)
    assert y.shape == (*batch, 40)
    torch.testing.assert_close(y, q8act_reference(x.reshape(-1, 96), w.raw, "Q4_1").view(y.shape), atol=1e-5, rtol=1e-5)


def test_prefill_rows_take_the_exact_route():
    w = pack_linear(blocks("Q8_0", 16, 64), "Q8_0", LinearConfig("q8act", 4))
    x = torch.randn(5, 64)
    assert torch.equal(quantized_linear(x, w), naive_quantized_linear(x, w))


def test_split_parts_are_the_fused_rows():
    raw = blocks("Q4_1", 70, 64)
    fused = pack_linear(raw, "Q4_1", LinearConfig("q8act", None))
    a, b = split_linear(fused, [30, 40])
    x = torch.randn(1, 64)
    y = quantized_linear(x, fused)
    assert torch.equal(torch.cat([quantized_linear(x, a), quantized_linear(x, b)], -1), y)


def test_without_the_operator_the_route_is_exact_float(monkeypatch):
    from gatherlens.ops.quant import linear

    w = pack_linear(blocks("Q4_0", 8, 64), "Q4_0", LinearConfig("q8act", None))
    monkeypatch.setattr(linear, "q8act_ready", lambda: "not built")  # the table's q8act row: dequant runs
    x = torch.randn(2, 64)
    assert torch.equal(quantized_linear(x, w), naive_quantized_linear(x, w))


def test_opcheck_and_input_errors():
    raw, q4_1 = blocks("Q4_1", 16, 64), FORMATS["Q4_1"].ggml_type
    torch.library.opcheck(torch.ops.gatherlens.q8act_linear.default, (torch.randn(2, 64), raw, q4_1),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    types = q8act.GGML_TYPE
    valid = re.escape(f"{types['Q4_0']} (Q4_0), {types['Q4_1']} (Q4_1) or {types['Q8_0']} (Q8_0)")
    others = [fmt.ggml_type for q, fmt in FORMATS.items() if q not in QTYPES] + [4]  # 4: ggml's retired Q4_2
    for qtype in others:
        with pytest.raises(RuntimeError, match=f"qtype must be {valid}, got {qtype}"):
            torch.ops.gatherlens.q8act_linear(torch.randn(1, 64), raw, qtype)
    with pytest.raises(RuntimeError, match="raw must be"):
        torch.ops.gatherlens.q8act_linear(torch.randn(1, 96), raw, q4_1)


def _half_at(raw: torch.Tensor, field, value: float) -> None:
    raw[0, field.offset:field.end] = torch.tensor([value], dtype=torch.float16).view(torch.uint8)


@pytest.mark.parametrize("qtype", QTYPES)
def test_the_operator_reads_each_format_at_its_records_layout(qtype):
    """One block, zero but for d = 1, m = 0.5 (where the format has a min) and code 1 at weight 0,
    against x = 127 at weight 0: y = (1 - code_offset) * 127 + 0.5 * 127, exactly (x is exact in
    8 bits), so the operator reads d, m and qs where the record (and quant_formats.h) puts them."""
    fmt = FORMATS[qtype]
    raw = torch.zeros(1, fmt.block_bytes, dtype=torch.uint8)  # (1, bytes): one block
    _half_at(raw, fmt.field("d"), 1.0)
    want = (1 - fmt.code_offset) * 127.0
    if fmt.has("m"):
        _half_at(raw, fmt.field("m"), 0.5)
        want += 0.5 * 127.0
    raw[0, fmt.field("qs").offset] = 1  # weight 0 (the low nibble, or an int8): code 1
    x = torch.zeros(1, fmt.weights)
    x[0, 0] = 127.0  # (1, 32): dx = 1
    assert q8act.q8act_matmul(x, raw, qtype).tolist() == [[want]] == q8act_reference(x, raw, qtype).tolist()


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_value_in_a_block_of_x_makes_its_outputs_nan(qtype, bad):
    """Must hold (issue 29): a NaN (or inf) in x is never turned into finite numbers: its row's
    outputs are NaN, as float and the reference give, and the other rows are unchanged."""
    raw = blocks(qtype, 37, 96)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(1))  # (3, 96)
    clean = q8act.q8act_matmul(x, raw, qtype)  # (3, 37)
    x[1, 40] = bad  # one value of block 1 of row 1
    y = q8act.q8act_matmul(x, raw, qtype)  # (3, 37)
    assert torch.isnan(y[1]).all() and torch.isnan(q8act_reference(x, raw, qtype)[1]).all()
    assert torch.equal(y[[0, 2]], clean[[0, 2]])
