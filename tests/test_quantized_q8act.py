"""The q8act route (its kernels, by format: the one each record names, q8act.kernel_of) against each kernel's float64
reference (the same rounding of x) and against the float reference (gguf's own `dequantize`), with the
error bound that rounding implies; parametrized over the formats whose records name the route."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf.quants import dequantize, quantize
from torch._subclasses.fake_tensor import FakeTensorMode

from native_helpers import needs_native, require_native

from gatherlens.ops.quant import FORMATS
from gatherlens.ops.quant.products import q8act
from gatherlens.ops.quant.formats.layout import QK
from gatherlens.ops.quant.products.linear import (LINEAR_PRODUCT, LinearConfig, pack_linear, quantized_linear,
                                                  split_linear)
from gatherlens.ops.quant.products.linear_naive import naive_quantized_linear
from gatherlens.ops.quant.products.x8 import X8_QTYPES, pack_x8, pack_x8_reference, unpack_x8, x8_matmul, x8_rows

pytestmark = needs_native(q8act)
QTYPES = q8act.Q8ACT_QTYPES  # the formats whose records name the q8act route
BLOCKS = tuple(q for q in QTYPES if q in q8act.BLOCK_QTYPES)  # those of q8act.cpp (32-weight blocks)


def _ready(qtype: str):
    return pytest.param(qtype, marks=needs_native(lambda: q8act.ready(qtype)))  # its format's kernel


ROUTED = [_ready(q) for q in QTYPES]


def random_blocks(qtype: str, rows: int, width: int, seed: int) -> torch.Tensor:
    """Random bytes, every fp16 field (scales, mins) a finite half of a few hundredths: (rows, row bytes)."""
    fmt = FORMATS[qtype]
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (rows, width // fmt.weights, fmt.block_bytes), dtype=torch.uint8, generator=g)
    for field in fmt.fields:
        if field.kind == "fp16":
            halves = ((torch.rand(rows, width // fmt.weights, 1, generator=g) - 0.3) * 0.02).half()  # (rows, nb, 1)
            raw[:, :, field.offset:field.end] = halves.view(torch.uint8)
    return raw.view(rows, -1)  # (rows, row bytes)


def blocks(qtype: str, rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """gguf's own quantizer where it has one for `qtype` (F32, F16: its values as bytes), else random blocks."""
    data = (np.random.default_rng(seed).standard_normal((rows, width)) * 0.05).astype(np.float32)
    try:
        packed = quantize(data, GGMLQuantizationType[qtype])
    except NotImplementedError:
        return random_blocks(qtype, rows, width, seed)
    return torch.from_numpy(np.ascontiguousarray(packed).view(np.uint8).reshape(rows, -1))  # (rows, row bytes)


def float_weight(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """gguf's own dequantize of the blocks: the float reference weight (N, K) float64."""
    return torch.from_numpy(dequantize(raw.numpy(), GGMLQuantizationType[qtype]).astype(np.float64))  # (N, K)


def width(qtype: str, k: int) -> int:
    """k, or the nearest whole number of the format's blocks below it (at least one block)."""
    weights = FORMATS[qtype].weights
    return max(weights, k - k % weights)


def error_bound(x: torch.Tensor, w: torch.Tensor, qtype: str) -> torch.Tensor:
    """The bound of |y - x W^T| the kernel's rounding implies: (M, N) float64.
    x rounded to 8 bits per block of b values: sum_k |W[n, k]| dx(k) / 2 (dx = max|x| / 127 of k's block);
    plus float32 sums of K products: gamma_K sum_k |x_k W[n, k]| (any order, gamma_K = K u / (1 - K u))."""
    K, b = x.shape[1], q8act.kernel_of(qtype).x_block
    gamma = K * 2.0 ** -24 / (1 - K * 2.0 ** -24)
    sums = gamma * (x.double().abs() @ w.abs().t()) + 1e-6  # (M, N)
    if not b:
        return sums  # the plain floats: x is not rounded
    dx = x.double().reshape(x.shape[0], K // b, b).abs().amax(-1) / 127  # (M, K/b)
    half_step = (dx / 2).repeat_interleave(b, dim=1)  # (M, K)
    return half_step @ w.abs().t() * (1 + 1e-4) + 2 * sums  # (M, N)


@pytest.mark.parametrize("qtype", ROUTED)
@pytest.mark.parametrize("M,N,K", [(1, 1, 32), (1, 37, 96), (3, 65, 576), (2, 130, 1536), (5, 3, 512), (0, 5, 64)],
                         ids=str)
def test_kernel_equals_its_reference_and_stays_within_the_rounding_bound(qtype, M, N, K):
    K = width(qtype, K)
    raw = blocks(qtype, N, K, seed=N)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(K)) * 2  # (M, K)
    y = q8act.q8act_matmul(x, raw, qtype)  # (M, N)
    assert y.shape == (M, N) and y.dtype == torch.float32
    ref = q8act.kernel_of(qtype).reference(x, raw, qtype)  # (M, N): the same rounding, float64 sums
    w = float_weight(raw, qtype)  # (N, K) exact
    scale = x.double().abs() @ w.abs().t()  # (M, N): sum_k |x_k w_k|, what float32 sums' rounding scales with
    assert ((y - ref).double().abs() <= 1e-5 + 1e-6 * scale).all()  # float32 against float64 sums: ~16 u
    assert ((y.double() - x.double() @ w.t()).abs() <= error_bound(x, w, qtype)).all()


@pytest.mark.parametrize("qtype", ROUTED)
def test_zero_blocks_and_large_values(qtype):
    K = width(qtype, 64)
    raw = blocks(qtype, 9, K)
    x = torch.zeros(2, K)
    x[1, 40] = 1e4  # one block all zeros, one dominated by a single value
    ref = q8act.kernel_of(qtype).reference(x, raw, qtype)
    torch.testing.assert_close(q8act.q8act_matmul(x, raw, qtype), ref, atol=1e-3, rtol=1e-5)
    assert torch.equal(q8act.q8act_matmul(x[:1], raw, qtype), torch.zeros(1, 9))


@pytest.mark.parametrize("batch", [(1,), (7,), (2, 3), ()], ids=str)
def test_the_route_through_quantized_linear(batch):
    w = pack_linear(blocks("Q4_1", 40, 96), "Q4_1", LinearConfig("q8act", None))
    assert w.activation_dtype == torch.float32  # 40 rows: five panels of 8 (ops/quant/products/x8.py), the same bytes
    assert len(w.tensors) == 1 and torch.equal(unpack_x8(w.tensors[0], "Q4_1"), w.raw)
    x = torch.randn(*batch, 96)
    y = quantized_linear(x, w)
    assert y.shape == (*batch, 40)
    ref = q8act.kernel_of("Q4_1").reference(x.reshape(-1, 96), w.raw, "Q4_1").view(y.shape)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qtype", ROUTED)
def test_every_routed_format_runs_its_kernel_with_no_copy_of_the_weight(qtype):
    """The model's choice (`pick_route`) for each format the records route here, and no packed copy
    where the rows do not make whole panels of 8 (33 rows: the blocks as stored)."""
    from gatherlens.ops.quant.products.matmul import pick_route

    assert pick_route(qtype, "auto") == "q8act"
    K = width(qtype, 256)
    w = pack_linear(blocks(qtype, 33, K), qtype, LinearConfig("q8act", None))
    assert w.tensors == () and w.nbytes() == 0
    x = torch.randn(2, K)
    assert LINEAR_PRODUCT.select(x, w).name == "q8act"
    assert torch.equal(quantized_linear(x, w), q8act.q8act_matmul(x, w.raw, qtype))


def test_prefill_rows_take_the_integer_gemm_where_it_is_faster_else_the_exact_route(monkeypatch):
    """From prefill_rows on, a q8act weight whose kernel multiplies several rows blocked keeps to it up
    to its format record's gemm_rows (x rounded as in decode); past them, for a format without the
    blocked loop (F16: floatdot) and where that loop is the scalar twin (no AVX2), the exact route runs
    (dequantized, float32 GEMM: the reference's own call)."""
    w = pack_linear(blocks("Q8_0", 16, 64), "Q8_0", LinearConfig("q8act", 4))
    half = pack_linear(blocks("F16", 16, 64), "F16", LinearConfig("q8act", 4))
    x = torch.randn(12, 64)  # (12, K): at least prefill_rows, past q8act.cpp's FEW_ROWS (its blocked loop)
    blocked = q8act.kernel_of("Q8_0").blocked() != "scalar"
    assert LINEAR_PRODUCT.select(x, w).name == ("q8act" if blocked else "prefill")
    assert torch.equal(quantized_linear(x, w), q8act.q8act_matmul(x, w.raw, "Q8_0") if blocked
                       else naive_quantized_linear(x, w))
    assert LINEAR_PRODUCT.select(x, half).name == "prefill"
    assert torch.equal(quantized_linear(x, half), naive_quantized_linear(x, half))
    q4_k = pack_linear(blocks("Q4_K", 16, 256), "Q4_K", LinearConfig("q8act", 4))  # q8k.cpp's blocked loop
    wide = torch.randn(300, 256)  # (300, K): the K-quants take the integer GEMM at any rows
    expect = "q8act" if q8act.kernel_of("Q4_K").blocked() != "scalar" else "prefill"
    assert LINEAR_PRODUCT.select(wide, q4_k).name == expect
    monkeypatch.setitem(FORMATS, "Q8_0", dataclasses.replace(FORMATS["Q8_0"], gemm_rows=256))  # a crossover at 256
    assert LINEAR_PRODUCT.select(torch.randn(300, 64), w).name == "prefill"  # past it: the exact route
    monkeypatch.setitem(FORMATS, "Q8_0", dataclasses.replace(FORMATS["Q8_0"], gemm_rows=4))  # faster only up to 4 rows: x has 12
    assert LINEAR_PRODUCT.select(x, w).name == "prefill" and LINEAR_PRODUCT.select(x[:4], w).name == "q8act"
    assert torch.equal(quantized_linear(x, w), naive_quantized_linear(x, w))
    monkeypatch.setitem(FORMATS, "Q8_0", dataclasses.replace(FORMATS["Q8_0"], gemm_rows=float("inf")))
    blocks_kernel = q8act.KERNELS["q8act_linear"]
    monkeypatch.setitem(q8act.KERNELS, "q8act_linear", dataclasses.replace(blocks_kernel, blocked=lambda: "scalar"))
    assert LINEAR_PRODUCT.select(x, w).name == "prefill"
    assert "fewer rows than prefill_rows" in dict(LINEAR_PRODUCT.why(x[:3], w))["prefill"]


@pytest.mark.parametrize("qtype", BLOCKS)
@given(M=st.integers(2, 13), N=st.integers(1, 40), nb=st.integers(1, 7), seed=st.integers(0, 2 ** 16))
@settings(max_examples=12)
def test_the_blocked_gemm_equals_its_reference_and_the_one_row_kernel(qtype, M, N, nb, seed):
    """x of several rows: the blocked loop (panels of 8 weight rows by tiles of 4 rows of x, ragged at
    both ends) against the float64 reference, and each row against decode's one-row kernel; random
    bytes (Q8_0's -128 too)."""
    K = QK * nb
    raw = random_blocks(qtype, N, K, seed)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed)) * 2  # (M, K)
    y = q8act.q8act_matmul(x, raw, qtype)  # (M, N)
    scale = 1e-5 + 1e-6 * (x.double().abs() @ float_weight(raw, qtype).abs().t())  # (M, N): float32 sums' slack
    assert y.shape == (M, N) and ((y - q8act.kernel_of(qtype).reference(x, raw, qtype)).double().abs() <= scale).all()
    rows = torch.cat([q8act.q8act_matmul(x[i:i + 1], raw, qtype) for i in range(M)])  # (M, N): M = 1 each
    assert ((y - rows).double().abs() <= 2 * scale).all()


def _extreme_blocks(qtype: str, rows: int, width: int, byte: int) -> torch.Tensor:
    """Every code byte `byte` (0xFF: the largest codes, Q5's fifth bits all set; 0x80: Q8_0's -128),
    every fp16 field 0.01."""
    fmt = FORMATS[qtype]
    raw = torch.full((rows, width // fmt.weights, fmt.block_bytes), byte, dtype=torch.uint8)  # (rows, nb, bytes)
    for field in fmt.fields:
        if field.kind == "fp16":
            raw[:, :, field.offset:field.end] = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
    return raw.view(rows, -1)


@pytest.mark.parametrize("qtype", BLOCKS)
@pytest.mark.parametrize("byte", [0xFF, 0x80, 0x00, 0x88], ids=hex)
def test_the_largest_integer_sums_stay_exact(qtype, byte):
    """The blocked loop sums products in int16 over as many steps as their bound allows: the largest
    codes against x at +-127 (a constant row: dx = 1 / 127) give the largest sums; they equal the
    reference's (no int16 overflow, no maddubs saturation)."""
    K = 256
    raw = _extreme_blocks(qtype, 11, K, byte)
    x = torch.ones(6, K)  # (6, K)
    x[1::2] = -1  # rows at -127
    x[4, ::2] = -1  # and one alternating
    y, ref = q8act.q8act_matmul(x, raw, qtype), q8act.kernel_of(qtype).reference(x, raw, qtype)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(y[:1], q8act.q8act_matmul(x[:1], raw, qtype), rtol=1e-6, atol=1e-4)
    if qtype in X8_QTYPES:  # the panels' loops: one row, and a few rows sharing each step's codes
        raw = _extreme_blocks(qtype, 16, K, byte)
        packed, ref = pack_x8(raw, qtype), q8act.kernel_of(qtype).reference(x, raw, qtype)
        torch.testing.assert_close(x8_matmul(x, packed, qtype), ref, rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(x8_matmul(x[:1], packed, qtype), ref[:1], rtol=1e-6, atol=1e-4)


def test_the_blocked_gemm_under_compile():
    raw = blocks("Q5_1", 19, 96)

    def f(v):
        return q8act.q8act_matmul(v, raw, "Q5_1") * 2

    x = torch.randn(7, 96)
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="eager")(x), f(x))
    assert q8act.blocked_simd() in q8act.SIMD


def test_split_parts_are_the_fused_rows():
    raw = blocks("Q4_1", 70, 64)
    fused = pack_linear(raw, "Q4_1", LinearConfig("q8act", None))
    a, b = split_linear(fused, [30, 40])
    x = torch.randn(1, 64)
    y = quantized_linear(x, fused)
    assert torch.equal(torch.cat([quantized_linear(x, a), quantized_linear(x, b)], -1), y)


def test_without_the_operator_the_route_is_exact_float(monkeypatch):
    from gatherlens.ops.quant.products import linear

    w = pack_linear(blocks("Q4_0", 8, 64), "Q4_0", LinearConfig("q8act", None))
    monkeypatch.setattr(linear, "q8act_ready", lambda qtype=None: "not built")  # the table's q8act row: dequant runs
    x = torch.randn(2, 64)
    assert torch.equal(quantized_linear(x, w), naive_quantized_linear(x, w))


def test_a_kernel_that_did_not_build_sends_only_its_formats_to_the_fallback(monkeypatch):
    floats = q8act.KERNELS["floatdot_linear"]  # the kernel F16's record names, and F32's and BF16's
    monkeypatch.setitem(q8act.KERNELS, "floatdot_linear", dataclasses.replace(floats, loaded=lambda: False))
    half = pack_linear(blocks("F16", 8, 64), "F16", LinearConfig("q8act", None))
    q4_0 = pack_linear(blocks("Q4_0", 8, 64), "Q4_0", LinearConfig("q8act", None))
    x = torch.randn(2, 64)
    assert "floatdot.cpp" in q8act.ready("F16") and dict(LINEAR_PRODUCT.why(x, half))["q8act"] == q8act.ready("F16")
    assert LINEAR_PRODUCT.select(x, half).name == "dequant" and LINEAR_PRODUCT.select(x, q4_0).name == "q8act"
    assert torch.equal(quantized_linear(x, half), naive_quantized_linear(x, half))


@pytest.mark.parametrize("qtype", sorted({q8act.kernel_of(q).source: q for q in QTYPES}.values()))
def test_opcheck(qtype):
    require_native(q8act.ready(qtype))
    K = width(qtype, 256)
    raw, op = blocks(qtype, 16, K), FORMATS[qtype].kernel  # the operator the record names
    torch.library.opcheck(getattr(torch.ops.gatherlens, op).default, (torch.randn(2, K), raw, FORMATS[qtype].ggml_type),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@pytest.mark.parametrize("qtype", ROUTED)
def test_the_fake_kernels_give_the_shape_under_fake_tensors(qtype):
    K = width(qtype, 256)
    row_bytes = K // FORMATS[qtype].weights * FORMATS[qtype].block_bytes
    with FakeTensorMode():
        y = q8act.q8act_matmul(torch.empty(3, K), torch.empty(17, row_bytes, dtype=torch.uint8), qtype)
    assert y.shape == (3, 17) and y.dtype == torch.float32


def test_input_errors():
    raw, q4_1 = blocks("Q4_1", 16, 64), FORMATS["Q4_1"].ggml_type
    names = q8act.BLOCK_QTYPES
    valid = re.escape(", ".join(f"{FORMATS[q].ggml_type} ({q})" for q in names[:-1])
                      + f" or {FORMATS[names[-1]].ggml_type} ({names[-1]})")
    others = [fmt.ggml_type for q, fmt in FORMATS.items() if q not in names] + [4]  # 4: ggml's retired Q4_2
    for qtype in others:
        with pytest.raises(RuntimeError, match=f"qtype must be {valid}, got {qtype}"):
            torch.ops.gatherlens.q8act_linear(torch.randn(1, 64), raw, qtype)
    with pytest.raises(RuntimeError, match="raw must be"):
        torch.ops.gatherlens.q8act_linear(torch.randn(1, 96), raw, q4_1)
    with pytest.raises(RuntimeError, match="K must be a multiple of 32"):
        torch.ops.gatherlens.q8act_linear(torch.randn(1, 40), raw, q4_1)


def _half_at(raw: torch.Tensor, field, value: float) -> None:
    raw[0, field.offset:field.end] = torch.tensor([value], dtype=torch.float16).view(torch.uint8)


def _code_value(fmt, code: int) -> int:
    return (fmt.codebook[code] if fmt.codebook else code) - fmt.code_offset


@pytest.mark.parametrize("qtype", BLOCKS)
def test_the_operator_reads_each_format_at_its_records_layout(qtype):
    """One block, zero but for d = 1, m = 0.5 (where the format has a min), code 1 at weight 0 and, for
    the 5-bit formats, code 16 + 3 at weight 17 (nibble 3 in qs, bit 17 of qh), against x = 127 at those
    weights: y = sum of (value - code_offset) * 127 (+ 0.5 * 127 a weight), exactly (x is exact in
    8 bits), so the operator reads d, m, qs and qh where the record (and quant_formats.h) puts them."""
    fmt = FORMATS[qtype]
    raw = torch.zeros(1, fmt.block_bytes, dtype=torch.uint8)  # (1, bytes): one block
    _half_at(raw, fmt.field("d"), 1.0)
    qs = fmt.field("qs").offset
    raw[0, qs] = 1  # weight 0 (the low nibble, or an int8): code 1
    codes = {0: 1}
    if fmt.has("qh"):
        raw[0, qs + 1] = 3 << 4  # weight 17: the high nibble of byte 1
        raw[0, fmt.field("qh").offset + 2] = 1 << 1  # bit 17 of the little-endian uint32
        codes[17] = 16 + 3
    want = sum(_code_value(fmt, c) * 127.0 for c in codes.values())
    if fmt.has("m"):
        _half_at(raw, fmt.field("m"), 0.5)
        want += 0.5 * 127.0 * len(codes)
    x = torch.zeros(1, fmt.weights)
    x[0, list(codes)] = 127.0  # (1, 32): dx = 1
    ref = q8act.kernel_of(qtype).reference(x, raw, qtype)
    assert q8act.q8act_matmul(x, raw, qtype).tolist() == [[want]] == ref.tolist()
    assert float_weight(raw, qtype)[0, list(codes)].tolist() == [float(_code_value(fmt, c)) + (0.5 if fmt.has("m") else 0)
                                                                for c in codes.values()]


@pytest.mark.parametrize("qtype", ROUTED)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_value_in_a_block_of_x_makes_its_outputs_non_finite(qtype, bad):
    """Must hold (issue 29): a NaN (or inf) in x is never turned into finite numbers. Rounded kernels
    make its row's outputs NaN (as the reference); the float kernel gives what float gives (inf or NaN,
    as its reference). The other rows are unchanged."""
    K = width(qtype, 96)
    raw = blocks(qtype, 37, K)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))  # (3, K)
    clean = q8act.q8act_matmul(x, raw, qtype)  # (3, 37)
    x[1, 40] = bad  # one value of a block of row 1
    y = q8act.q8act_matmul(x, raw, qtype)  # (3, 37)
    ref = q8act.kernel_of(qtype).reference(x, raw, qtype)  # (3, 37)
    if q8act.kernel_of(qtype).x_block:
        assert torch.isnan(y[1]).all() and torch.isnan(ref[1]).all()
    else:
        assert not torch.isfinite(y[1]).any()
        torch.testing.assert_close(y[1], ref[1], equal_nan=True)
    assert torch.equal(y[[0, 2]], clean[[0, 2]])


_TWIN = """
import sys, torch
from pathlib import Path
from torch.utils import cpp_extension
from gatherlens.ops import native
src = Path(native.__file__).with_name("quant") / "products" / "q8act.cpp"
cpp_extension.load("gatherlens_q8act_twin", [str(src)], extra_cflags=[*native.FLAGS, *sys.argv[3].split()],
                   extra_ldflags=list(native.LDFLAGS), extra_include_paths=[str(src.parent), str(native.INCLUDE)],
                   is_python_module=False, build_directory=sys.argv[1])
sys.path.insert(0, sys.argv[2])
from gatherlens.ops.quant.formats.layout import LAYOUTS
from gatherlens.ops.quant.products.q8act import kernel_of
from gatherlens.ops.quant.products.x8 import _panel_order, pack_x8_reference
from test_quantized_q8act import float_weight
print("simd", torch.ops.gatherlens.q8act_simd())
for (qtype, x, raw, simd, simd_x8) in torch.load(sys.argv[4]):
    y = torch.ops.gatherlens.q8act_linear(x, raw, LAYOUTS[qtype].ggml_type)
    slack = 1e-5 + 1e-6 * (x.double().abs() @ float_weight(raw, qtype).abs().t())  # float32 sums against float64
    assert ((y - kernel_of(qtype).reference(x, raw, qtype)).double().abs() <= slack).all(), qtype
    assert ((y - simd).double().abs() <= 2 * slack).all(), qtype  # this build's loops against the SIMD ones
    if simd_x8 is not None:  # the panels' loops (q8x8_linear) too
        packed = torch.empty_like(raw)  # this build's x8_pack (the process loads no other: GATHERLENS_NATIVE=0)
        torch.ops.gatherlens.x8_pack(raw, _panel_order(qtype, raw.shape[1]), packed)
        assert torch.equal(packed, pack_x8_reference(raw, qtype)), qtype
        y8 = torch.ops.gatherlens.q8x8_linear(x, packed, LAYOUTS[qtype].ggml_type)
        assert ((y8 - kernel_of(qtype).reference(x, raw, qtype)).double().abs() <= slack).all(), qtype
        assert ((y8 - simd_x8).double().abs() <= 2 * slack).all(), qtype
print("twin ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("flag,simd,on", [("-DGATHERLENS_Q8ACT_PLAIN", 0, "avx2"),
                                          ("-DGATHERLENS_Q8ACT_VNNI_EMULATED", 2, "avx2"),
                                          ("-mno-avx512f -mno-avxvnni", 1, "vnni"),
                                          ("-mno-avx512bitalg", 2, "vnni")],
                         ids=["plain", "vnni", "avx2-on-vnni", "vnni-without-bitalg"])
def test_the_scalar_twins_and_the_vnni_loop_equal_the_reference_and_the_simd_loops(tmp_path, flag, simd, on):
    """q8act.cpp built again (a fresh build, ~20 s; the process loads no other build: GATHERLENS_NATIVE=0)
    with its scalar twins (the fallback for CPUs without AVX2), or with its VNNI loop, vpdpbusd emulated
    exactly in AVX2 (for CPUs with AVX512-VNNI or AVX-VNNI), both beside an AVX2 build; or, beside a VNNI
    build, without AVX-512 (the AVX2 loops, as a CPU with AVX2 only runs them) or without AVX512-BITALG
    (a 5-bit panel's fifth bits spread by byte shuffles, as on CPUs with VNNI but no BITALG): every
    32-weight format, one row and several (the blocked loop), against the reference and this process's
    SIMD build; the formats with panels (x8.py) through q8x8_linear too."""
    if q8act.blocked_simd() != on:
        pytest.skip(f"compares with the {on} build; this one's blocked loop is {q8act.blocked_simd()}")
    cases = []
    for i, qtype in enumerate(BLOCKS):
        for M, N, K in [(1, 37, 96), (6, 29, 160), (13, 8, 576), (1, 40, 96)]:
            raw, x = random_blocks(qtype, N, K, seed=i + M), torch.randn(M, K, generator=torch.Generator().manual_seed(M))
            panels = x8_matmul(x, pack_x8(raw, qtype), qtype) if qtype in X8_QTYPES and N % 8 == 0 else None
            cases.append((qtype, x, raw, q8act.q8act_matmul(x, raw, qtype), panels))
        for byte in (0xFF, 0x88):  # the largest codes against x at +-127: int16 pair sums at their bound
            raw, x = _extreme_blocks(qtype, 16, 256, byte), torch.ones(4, 256)
            x[1::2] = -1
            panels = x8_matmul(x, pack_x8(raw, qtype), qtype) if qtype in X8_QTYPES else None
            cases.append((qtype, x, raw, q8act.q8act_matmul(x, raw, qtype), panels))
            cases.append((qtype, x[:1], raw, q8act.q8act_matmul(x[:1], raw, qtype), None if panels is None else panels[:1]))
    torch.save(cases, tmp_path / "cases.pt")
    done = subprocess.run([sys.executable, "-c", _TWIN, str(tmp_path), str(Path(__file__).parent), flag,
                           str(tmp_path / "cases.pt")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "GATHERLENS_NATIVE": "0"})
    assert done.returncode == 0 and "twin ok" in done.stdout, done.stderr[-3000:]
    assert f"simd {simd}" in done.stdout


@pytest.mark.parametrize("qtype", [_ready(q) for q in QTYPES if q in X8_QTYPES])
def test_formats_with_panels_keep_their_bytes_in_panels_of_8_rows(qtype):
    """Rows in whole panels of 8: the route keeps the blocks' bytes repacked (pack_x8: nothing more, nothing
    rounded), every product reads the panels, and a part of whole panels is a view of them."""
    K = width(qtype, 96)
    raw = blocks(qtype, 48, K)
    w = pack_linear(raw, qtype, LinearConfig("q8act", None))
    (panels,) = w.tensors
    assert panels.shape == raw.shape and w.nbytes() == raw.numel() and torch.equal(unpack_x8(panels, qtype), raw)
    for M in (1, 3):
        x = torch.randn(M, K)
        assert torch.equal(quantized_linear(x, w), x8_matmul(x, panels, qtype))
        torch.testing.assert_close(quantized_linear(x, w), q8act.kernel_of(qtype).reference(x, raw, qtype).float(),
                                   atol=1e-4, rtol=1e-4)
    head, tail = split_linear(w, (16, 32))
    assert head.tensors[0].data_ptr() == panels.data_ptr() and torch.equal(tail.tensors[0], panels[16:])
    cut = split_linear(w, (20, 28))[0]
    assert cut.tensors == ()  # 20 rows: not whole panels, the blocks as stored


@given(st.sampled_from([q for q in X8_QTYPES if q8act.ready(q) is None]), st.integers(1, 6), st.integers(1, 5),
       st.integers(1, 4), st.integers(0, 2 ** 16))
@settings(max_examples=40, deadline=None)
def test_panels_equal_the_reference_on_any_shape(qtype, panels, blocks_, M, seed):
    """pack_x8 / unpack_x8 exact inverses; q8x8_linear (one row: the panel loop; a few: the panel loop for each,
    the codes unpacked once; more than q8act.cpp's FEW_ROWS: the blocked GEMM from panels) against the float64
    reference, as q8act_linear on the blocks as stored."""
    K, N = QK * blocks_, 8 * panels
    raw = random_blocks(qtype, N, K, seed)
    packed = pack_x8(raw, qtype)
    assert torch.equal(unpack_x8(packed, qtype), raw) and torch.equal(packed, pack_x8_reference(raw, qtype))
    ids = torch.randint(0, N, (M + 3,), generator=torch.Generator().manual_seed(seed))  # (M + 3,) repeats allowed
    assert torch.equal(x8_rows(packed, ids, qtype), raw[ids])  # rows gathered from the panels, as stored
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed))
    y = x8_matmul(x, packed, qtype)
    slack = 1e-5 + 1e-6 * (x.double().abs() @ float_weight(raw, qtype).abs().t())  # float32 sums against float64
    assert ((y - q8act.kernel_of(qtype).reference(x, raw, qtype)).double().abs() <= slack).all()
    if M > 1:  # a few rows (a server's slots): each row's outputs are its own one-row product's, bit for bit
        assert torch.equal(y, torch.cat([x8_matmul(x[i:i + 1], packed, qtype) for i in range(M)]))
    wide = torch.randn(12, K, generator=torch.Generator().manual_seed(seed))  # (12, K): past FEW_ROWS
    assert torch.equal(x8_matmul(wide, packed, qtype), q8act.q8act_matmul(wide, raw, qtype))  # the blocked GEMM:
    # the same panels, the same sums


def test_the_panel_move_refuses_an_order_it_cannot_follow():
    """q8act.cpp's x8_pack (pack_x8's move) checks its order: a unit outside the panel is an error naming it."""
    if q8act.ready("Q8_0") is not None:
        pytest.skip("q8act.cpp did not build")
    from gatherlens.ops.quant.products.x8 import _panel_order

    raw = torch.randint(0, 256, (16, 34), dtype=torch.uint8)  # two panels of one Q8_0 block
    order = _panel_order("Q8_0", 34).clone()
    torch.library.opcheck(torch.ops.gatherlens.x8_pack.default, (raw, order, torch.empty_like(raw)))
    raw = raw[:8]
    order[5] = 136  # a panel holds 136 units: 0..135
    with pytest.raises(RuntimeError, match=r"order\[5\] = 136 is outside 0..135"):
        torch.ops.gatherlens.x8_pack(raw, order, torch.empty_like(raw))
    with pytest.raises(RuntimeError, match="N a multiple of 8"):
        torch.ops.gatherlens.x8_pack(raw[:7], order, torch.empty_like(raw[:7]))
