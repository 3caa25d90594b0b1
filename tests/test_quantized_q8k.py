"""The q8k matmul (llama.cpp's integer matmul on the super-block formats, q8k.cpp) against its float64
reference (the same Q8_K rounding of x) and against the float reference y = x @ dequant(W).T, with
the error bound x's rounding implies: |error| <= sum_k |w_k| dx_k / 2 per output."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf.quants import dequantize

from native_helpers import needs_native

from gatherlens.ops.quant.products import q8k
from gatherlens.ops.quant.formats.layout import LAYOUTS, QK_K, formats_taking
from gatherlens.ops.quant.products.q8k_naive import q8k_reference, quantize_q8_k
from gatherlens.ops.quant.formats.registry import FORMATS, dequantize_rows

pytestmark = needs_native(q8k)
QTYPES = q8k.Q8K_QTYPES  # the super-block formats of layout.py


def blocks(qtype: str, rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """(rows, width / 256 * block_bytes) random bytes, each fp16 scale (d, dmin) finite: N(0, 0.01)."""
    layout, nb = LAYOUTS[qtype], width // QK_K
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, nb, layout.block_bytes), dtype=np.uint8)  # (rows, nb, bytes)
    for f in layout.fields:
        if f.kind == "fp16":
            raw[:, :, f.offset:f.end] = (rng.standard_normal((rows, nb, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return torch.from_numpy(raw.reshape(rows, -1))  # (rows, row bytes)


def float_weights(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """(N, K) float32: the format's dequantizer (ops/quant), else gguf's while a format's lands."""
    if qtype in FORMATS:
        return dequantize_rows(raw, qtype)  # (N, K)
    return torch.from_numpy(dequantize(raw.numpy(), GGMLQuantizationType[qtype]).astype(np.float32))  # (N, K)


def x_rounding_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|x W^T - x' W^T| <= sum_k |W[n, k]| dx(k) / 2 for x' = x as Q8_K: (M, N), plus float32 sums' slack."""
    _, dx = quantize_q8_k(x)  # (M, K/256)
    half_step = (dx / 2).float().repeat_interleave(QK_K, dim=1)  # (M, K)
    slack = 1e-5 * (x.abs() @ w.abs().t())  # (M, N): float32 accumulation of K products
    return half_step @ w.abs().t() * (1 + 1e-4) + slack + 1e-6  # (M, N)


def errors(qtype: str, M: int, N: int, K: int, seed: int = 0):
    """(y, reference, float reference, bound, |x| @ |W|^T) for random blocks and x ~ N(0, 4)."""
    raw = blocks(qtype, N, K, seed=seed + N)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed + K)) * 2  # (M, K)
    w = float_weights(raw, qtype)  # (N, K)
    size = x.abs() @ w.abs().t()  # (M, N): the scale of the terms summed
    return q8k.q8k_matmul(x, raw, qtype), q8k_reference(x, raw, qtype), x @ w.t(), x_rounding_bound(x, w), size


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("K", [256, 512, 768])
@pytest.mark.parametrize("M", [1, 3, 7])
@pytest.mark.parametrize("N", [1, 3, 7, 97])
def test_kernel_equals_its_reference_and_stays_within_the_rounding_bound(qtype, M, N, K):
    y, ref, exact, bound, size = errors(qtype, M, N, K)
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert ((y - ref).abs() <= 1e-5 + 1e-6 * size).all()  # float32 products and sums, against float64
    err = (y - exact).abs()  # (M, N)
    assert (err <= bound).all(), f"{qtype}: worst error {float((err / bound).max()):.3f} of the bound"


@pytest.mark.parametrize("qtype", QTYPES)
def test_the_error_against_float_is_a_fraction_of_the_bound(qtype, capsys):
    """Reported: the largest error against x @ dequant(W).T, relative to the largest output and to the bound."""
    y, _, exact, bound, _ = errors(qtype, 7, 257, 768, seed=3)
    err = (y - exact).abs()  # (M, N)
    with capsys.disabled():
        print(f"\n{qtype}: max |y - x W^T| = {float(err.max()):.4g} ({float(err.max() / exact.abs().max()):.2e} of "
              f"max |y|), at most {float((err / bound).max()):.3f} of the x-rounding bound")
    assert float((err / bound).max()) < 1


@pytest.mark.parametrize("qtype", QTYPES)
def test_zero_blocks_and_large_values(qtype):
    raw = blocks(qtype, 9, 512)
    x = torch.zeros(2, 512)
    x[1, 300] = 1e4  # one block all zeros, one dominated by a single value
    torch.testing.assert_close(q8k.q8k_matmul(x, raw, qtype), q8k_reference(x, raw, qtype), atol=1e-3, rtol=1e-5)
    assert torch.equal(q8k.q8k_matmul(x[:1], raw, qtype), torch.zeros(1, 9))


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_value_in_a_block_of_x_makes_its_outputs_nan(qtype, bad):
    raw = blocks(qtype, 37, 512)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1))  # (3, 512)
    clean = q8k.q8k_matmul(x, raw, qtype)  # (3, 37)
    x[1, 300] = bad  # one value of block 1 of row 1
    y = q8k.q8k_matmul(x, raw, qtype)  # (3, 37)
    assert torch.isnan(y[1]).all() and torch.isnan(q8k_reference(x, raw, qtype)[1]).all()
    assert torch.equal(y[[0, 2]], clean[[0, 2]])


@pytest.mark.parametrize("qtype", QTYPES)
@given(M=st.integers(2, 13), N=st.integers(1, 40), nb=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
@settings(max_examples=10)
def test_the_blocked_gemm_equals_its_reference_and_the_one_row_kernel(qtype, M, N, nb, seed):
    """x of several rows: the blocked loop (panels of 8 weight rows' super-blocks by tiles of 4 rows of
    x, ragged at both ends) against the float64 reference, and each row against decode's one-row kernel."""
    raw = blocks(qtype, N, QK_K * nb, seed)
    x = torch.randn(M, QK_K * nb, generator=torch.Generator().manual_seed(seed)) * 2  # (M, K)
    y = q8k.q8k_matmul(x, raw, qtype)  # (M, N)
    slack = 1e-5 + 1e-6 * (x.abs() @ float_weights(raw, qtype).abs().t())  # (M, N): float32 sums against float64
    assert y.shape == (M, N) and ((y - q8k_reference(x, raw, qtype)).abs() <= slack).all()
    rows = torch.cat([q8k.q8k_matmul(x[i:i + 1], raw, qtype) for i in range(M)])  # (M, N): M = 1 each
    assert ((y - rows).abs() <= 2 * slack).all()


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("byte", [0xFF, 0x80, 0x00, 0x55], ids=hex)
def test_the_largest_integer_sums_stay_exact(qtype, byte):
    """The blocked loop sums a sub-block's products in int16 over as many steps as their bound allows,
    then times its scale in int32: every code byte `byte` (0xFF: the largest codes and scales), every
    fp16 field 0.01, against x at +-127 (constant rows) equals the reference."""
    layout = LAYOUTS[qtype]
    raw = np.full((11, 2, layout.block_bytes), byte, dtype=np.uint8)  # (11, nb, bytes)
    for f in layout.fields:
        if f.kind == "fp16":
            raw[:, :, f.offset:f.end] = np.array([0.01], dtype=np.float16).view(np.uint8)
    raw = torch.from_numpy(raw.reshape(11, -1))
    x = torch.ones(6, 2 * QK_K)  # (6, K)
    x[1::2] = -1
    x[4, ::2] = -1
    torch.testing.assert_close(q8k.q8k_matmul(x, raw, qtype), q8k_reference(x, raw, qtype), rtol=1e-6, atol=1e-3)


def test_empty_shapes():
    raw = blocks("Q4_K", 5, 256)
    assert q8k.q8k_matmul(torch.zeros(0, 256), raw, "Q4_K").shape == (0, 5)
    assert q8k.q8k_matmul(torch.zeros(2, 256), raw[:0], "Q4_K").shape == (2, 0)


def test_input_errors():
    raw, q4_k = blocks("Q4_K", 4, 256), LAYOUTS["Q4_K"].ggml_type
    with pytest.raises(RuntimeError, match="K must be a multiple of 256 \\(the super-block\\), got 128"):
        torch.ops.gatherlens.q8k_linear(torch.randn(1, 128), raw, q4_k)
    with pytest.raises(RuntimeError, match="raw must be \\(N, 288\\) uint8"):
        torch.ops.gatherlens.q8k_linear(torch.randn(1, 512), raw, q4_k)
    with pytest.raises(RuntimeError, match="x must be \\(M, K\\) float32"):
        torch.ops.gatherlens.q8k_linear(torch.randn(1, 256).double(), raw, q4_k)
    others = [layout.ggml_type for q, layout in LAYOUTS.items() if q not in QTYPES] + [15]  # 15: Q8_K itself
    for qtype in others:
        with pytest.raises(RuntimeError, match=f"qtype must be 12 \\(Q4_K\\), .* or 23 \\(IQ4_XS\\), got {qtype}"):
            torch.ops.gatherlens.q8k_linear(torch.randn(1, 256), raw, qtype)


def test_the_kernel_takes_the_super_block_formats_of_the_table():
    assert set(QTYPES) == {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
    assert set(QTYPES) <= set(formats_taking("q8act"))  # each record names the route this kernel runs


def test_opcheck_and_the_fake_kernel_under_compile():
    raw, qtype = blocks("Q6_K", 16, 512), LAYOUTS["Q6_K"].ggml_type
    x = torch.randn(3, 512)
    torch.library.opcheck(torch.ops.gatherlens.q8k_linear.default, (x, raw, qtype),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))

    def f(v):
        return q8k.q8k_matmul(v, raw, "Q6_K") * 2

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), f(x))


def test_a_strided_and_non_float_x_is_made_float_contiguous():
    raw = blocks("IQ4_XS", 7, 512)
    x = torch.randn(512, 3).t()  # (3, 512) not contiguous
    assert torch.equal(q8k.q8k_matmul(x, raw, "IQ4_XS"), q8k.q8k_matmul(x.contiguous(), raw, "IQ4_XS"))
    assert torch.equal(q8k.q8k_matmul(x.double(), raw, "IQ4_XS"), q8k.q8k_matmul(x.contiguous(), raw, "IQ4_XS"))


_PLAIN = """
import sys, torch
from pathlib import Path
from torch.utils import cpp_extension
from gatherlens.ops import native
src = Path(native.__file__).with_name("quant") / "products" / "q8k.cpp"
cpp_extension.load("gatherlens_q8k_twin", [str(src)], extra_cflags=[*native.FLAGS, *sys.argv[3].split()],
                   extra_ldflags=list(native.LDFLAGS), extra_include_paths=[str(src.parent), str(native.INCLUDE)],
                   is_python_module=False, build_directory=sys.argv[1])
sys.path.insert(0, sys.argv[2])
from test_quantized_q8k import QTYPES, blocks, float_weights
from gatherlens.ops.quant.formats.layout import LAYOUTS
from gatherlens.ops.quant.products.q8k_naive import q8k_reference
assert torch.ops.gatherlens.q8k_simd() == int(sys.argv[4])
for qtype in QTYPES:
    for M in (1, 6):  # one row; several: the blocked loop's twin
        raw, x = blocks(qtype, 37, 768, seed=5), torch.randn(M, 768)
        y = torch.ops.gatherlens.q8k_linear(x, raw, LAYOUTS[qtype].ggml_type)
        slack = 1e-5 + 1e-6 * (x.abs() @ float_weights(raw, qtype).abs().t())  # float32 sums against float64
        assert ((y - q8k_reference(x, raw, qtype)).abs() <= slack).all(), (qtype, M)
print("plain ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("flags,simd", [("-DGATHERLENS_Q8K_PLAIN", 0), ("-mno-avx512f", 1)], ids=["plain", "avx2"])
def test_the_plain_loops_equal_the_reference(tmp_path, flags, simd):
    """The fallback for CPUs without AVX2, built here with GATHERLENS_Q8K_PLAIN; and, where this build runs
    the AVX-512 one-row loop, the AVX2 loops a CPU without AVX-512 runs (a fresh build, ~15 s; the process
    loads no other build of q8k.cpp: GATHERLENS_NATIVE=0)."""
    if simd == 1 and q8k.row_simd() != "avx512":
        pytest.skip(f"this build's one-row loop is already {q8k.row_simd()}")
    done = subprocess.run([sys.executable, "-c", _PLAIN, str(tmp_path), str(Path(__file__).parent), flags, str(simd)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "GATHERLENS_NATIVE": "0"}, timeout=600)
    assert done.returncode == 0 and "plain ok" in done.stdout, done.stderr[-3000:]
