"""The q8act route (llama.cpp's integer matmul, q8act.cpp) against its float64 reference (the same
8-bit rounding of x) and against the float reference, with the error bound that rounding implies."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from gatherlens.ops.quant import q8act
from gatherlens.ops.quant.linear import LinearConfig, pack_linear, quantized_linear, split_linear
from gatherlens.ops.quant.linear_naive import naive_quantized_linear
from gatherlens.ops.quant.q8act_naive import q8act_reference, quantize_activations

pytestmark = pytest.mark.skipif(not q8act.kernel_loaded(), reason="no C++ compiler or ninja")
QTYPES = q8act.Q8ACT_QTYPES


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
    from gatherlens.ops.quant import matmul

    w = pack_linear(blocks("Q4_0", 8, 64), "Q4_0", LinearConfig("q8act", None))
    monkeypatch.setattr(matmul, "q8act_loaded", lambda: False)
    x = torch.randn(2, 64)
    assert torch.equal(quantized_linear(x, w), naive_quantized_linear(x, w))


def test_opcheck_and_input_errors():
    raw = blocks("Q4_1", 16, 64)
    torch.library.opcheck(torch.ops.gatherlens.q8act_linear.default, (torch.randn(2, 64), raw, 3),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    with pytest.raises(RuntimeError, match="qtype"):
        torch.ops.gatherlens.q8act_linear(torch.randn(1, 64), raw, 4)
    with pytest.raises(RuntimeError, match="raw must be"):
        torch.ops.gatherlens.q8act_linear(torch.randn(1, 96), raw, 3)
