"""The float kernel of the q8act route (floatdot.cpp: F32, F16, BF16 weights read as stored) against
`F.linear` on the dequantized float32 weight and against its float64 reference.

Tolerance: the kernel and `F.linear` each sum K float32 products in some order, so each is within
gamma_K * sum_k |x_k w_k| of the exact sum (gamma_K = K u / (1 - K u), u = 2^-24, any order); the two
differ by at most twice that. Against the float64 reference the kernel is within gamma_K of it (plus the
reference's own rounding to float32)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from native_helpers import needs_native

from gatherlens.ops.quant import FORMATS

from gatherlens.ops.quant.products import floatdot

pytestmark = needs_native(floatdot)
QTYPES = floatdot.FLOAT_QTYPES


def stored(qtype: str, rows: int, width: int, seed: int = 0, scale: float = 0.05) -> torch.Tensor:
    """gguf's own conversion of random floats to `qtype`, as the file's bytes (rows, width * bytes) uint8."""
    data = (np.random.default_rng(seed).standard_normal((rows, width)) * scale).astype(np.float32)
    packed = np.ascontiguousarray(quantize(data, GGMLQuantizationType[qtype]))
    size = FORMATS[qtype].block_bytes
    return torch.from_numpy(packed.view(np.uint8).reshape(rows, width * size))  # (rows, width * bytes)


def weight(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """gguf's dequantize: the stored values as float32 (N, K), exactly."""
    return torch.from_numpy(dequantize(raw.contiguous().numpy(), GGMLQuantizationType[qtype]).astype(np.float32))


def gamma(K: int) -> float:
    return K * 2.0 ** -24 / (1 - K * 2.0 ** -24)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (1, 37, 7), (3, 65, 33), (2, 130, 576), (5, 9, 1536), (9, 17, 100),
                                   (130, 11, 64), (0, 5, 64), (4, 0, 64)], ids=str)
def test_the_kernel_is_f_linear_on_the_dequantized_weight(qtype, M, N, K):
    raw = stored(qtype, N, K, seed=N + K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(K)) * 2  # (M, K)
    y = floatdot.float_matmul(x, raw, qtype)  # (M, N)
    assert y.shape == (M, N) and y.dtype == torch.float32
    w = weight(raw, qtype)  # (N, K) float32, exact
    scale = x.double().abs() @ w.double().abs().t()  # (M, N): sum_k |x_k w_k|
    assert ((y - F.linear(x, w)).double().abs() <= 2 * gamma(K) * scale + 1e-30).all()
    ref = floatdot.float_reference(x, raw, qtype)  # (M, N): float64 sums
    assert ((y - ref).double().abs() <= gamma(K) * scale + ref.double().abs() * 2.0 ** -24 + 1e-30).all()


@pytest.mark.parametrize("qtype", QTYPES)
def test_rows_read_in_place_from_a_wider_table_at_any_offset(qtype):
    """raw may be a view: rows of a wider table (stride > row bytes) whose bytes start at an odd address."""
    K, size = 40, FORMATS[qtype].block_bytes
    table = stored(qtype, 12, K + 3)  # (12, (K + 3) * bytes)
    buffer = torch.zeros(table.numel() + 1, dtype=torch.uint8)  # (1 + 12 (K + 3) bytes,)
    buffer[1:] = table.flatten()
    raw = buffer[1:].view(12, -1)[2:9, size:size + K * size]  # (7, K * bytes): odd address, longer row stride
    x = torch.randn(3, K)
    torch.testing.assert_close(floatdot.float_matmul(x, raw, qtype), floatdot.float_reference(x, raw, qtype),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qtype", QTYPES)
def test_x_in_any_float_dtype_and_layout(qtype):
    raw = stored(qtype, 21, 64)
    x = torch.randn(64, 3).t()  # (3, 64), not contiguous
    want = floatdot.float_reference(x, raw, qtype)
    torch.testing.assert_close(floatdot.float_matmul(x, raw, qtype), want, atol=1e-5, rtol=1e-5)
    xb = x.to(torch.bfloat16)  # converted to float32 (exactly) before the kernel
    torch.testing.assert_close(floatdot.float_matmul(xb, raw, qtype), floatdot.float_reference(xb, raw, qtype),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qtype", QTYPES)
def test_non_finite_values_give_what_float_gives(qtype):
    raw = stored(qtype, 13, 50)
    x = torch.randn(3, 50)
    x[1, 7], x[2, 30] = float("nan"), float("inf")
    y = floatdot.float_matmul(x, raw, qtype)
    assert torch.isnan(y[1]).all() and not torch.isfinite(y[2]).any() and torch.isfinite(y[0]).all()
    torch.testing.assert_close(y, floatdot.float_reference(x, raw, qtype), atol=1e-5, rtol=1e-5, equal_nan=True)


def test_opcheck_and_input_errors():
    raw, f16 = stored("F16", 16, 64), FORMATS["F16"].ggml_type
    torch.library.opcheck(torch.ops.gatherlens.floatdot_linear.default, (torch.randn(2, 64), raw, f16),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    for qtype in [fmt.ggml_type for q, fmt in FORMATS.items() if q not in QTYPES]:
        with pytest.raises(RuntimeError, match=f"qtype must be 0 \\(F32\\), 1 \\(F16\\) or 30 \\(BF16\\), got {qtype}"):
            torch.ops.gatherlens.floatdot_linear(torch.randn(1, 64), raw, qtype)
    with pytest.raises(RuntimeError, match=r"raw must be \(N, 192\) uint8"):
        torch.ops.gatherlens.floatdot_linear(torch.randn(1, 96), raw, f16)
    with pytest.raises(RuntimeError, match="x must be"):
        torch.ops.gatherlens.floatdot_linear(torch.randn(1, 64, dtype=torch.float64), raw, f16)


def test_the_fake_kernel_traces_under_torch_compile():
    raw = stored("BF16", 24, 64)

    def f(x):
        return floatdot.float_matmul(x, raw, "BF16").relu()  # (M, 24)

    x = torch.randn(2, 64)
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), f(x))
