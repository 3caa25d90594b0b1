"""Quantized linears: every route against the reference (blocks -> float32 -> F.linear), odd sizes.

Blocks come from gguf's own quantizer (`gguf.quants.quantize`, the formats it can write) and, for
Q4_K, from random bytes with finite fp16 scales. Where a route's arithmetic equals the reference's it
is torch.equal; where it rounds (bf16 scales, activations and outputs; re-quantized codes) the error
is held to a bound derived from those roundings, never to a hand-picked tolerance. The int4 kernel's
convention is pinned by reading its effective weights back (x = the identity matrix).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.quant import FORMATS, QTYPES
from gatherlens.ops.quant.products.int4 import INT4_QTYPES, affine_groups
from gatherlens.ops.quant.products.linear import LinearConfig, pack_linear, quantized_linear
from gatherlens.ops.quant.products.linear_naive import naive_quantized_linear
from test_quantized_table import GGUF_QUANTIZES

EPS = 2.0 ** -8  # bf16's relative rounding bound (2^-9), doubled for the few roundings in a row
# float32 kernel weights bit-equal (see below): every int4 format but the K-quants (d*sc*q - dmin*mn)
EXACT_INT4 = tuple(q for q in INT4_QTYPES if not FORMATS[q].has("dmin"))


def blocks(qtype: str, rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """(rows, row bytes) uint8: gguf's quantizer on normal data, or (K-quants, which gguf-py cannot
    write) random bytes with small finite fp16 scales."""
    rng = np.random.default_rng(seed)
    fmt = FORMATS[qtype]
    if qtype in GGUF_QUANTIZES:
        data = (rng.standard_normal((rows, width)) * 0.05).astype(np.float32)
        return torch.from_numpy(quantize(data, GGMLQuantizationType[qtype]))
    nb, halves = width // fmt.weights, [f for f in fmt.fields if f.kind == "fp16"]
    raw = rng.integers(0, 256, (rows, nb, fmt.block_bytes), dtype=np.uint8)
    values = (rng.random((rows, nb, len(halves))) * 1e-2).astype(np.float16)  # d (and dmin)
    for k, field in enumerate(halves):
        raw[..., field.offset:field.end] = values[..., k:k + 1].view(np.uint8)
    return torch.from_numpy(raw.reshape(rows, -1))


def width_for(qtype: str) -> int:
    return max(96, 2 * FORMATS[qtype].weights)  # 3 blocks of 32, or 2 super-blocks of 256


def weight(qtype: str, rows: int, route: str, prefill_rows=None):
    return pack_linear(blocks(qtype, rows, width_for(qtype)), qtype, LinearConfig(route, prefill_rows))


def effective(w) -> torch.Tensor:
    """The weights the route multiplies by, read back through x = I: (N, K) float32."""
    eye = torch.eye(w.shape[1], dtype=torch.bfloat16 if w.route == "int4" else torch.float32)  # (K, K)
    return quantized_linear(eye, w).float().t()  # (N, K)


def per_weight(groups: torch.Tensor) -> torch.Tensor:
    """(N, K/32) -> (N, K): each group's value on its 32 weights."""
    return groups.repeat_interleave(32, dim=1)  # (N, K)


@pytest.mark.parametrize("qtype", INT4_QTYPES)
def test_int4_f32_kernel_weights_are_the_reference(qtype):
    """(c - 8) s + z with float32 s, z: the codes as stored give back gguf's values.

    Bit-equal when every term is exact in float32: always for Q4_0/Q5_0/Q8_0 (power-of-two zeros),
    and for Q4_1/Q5_1 whenever m and 8d are within 2^13 of each other (every block a quantizer writes:
    m is the block's min, d its range / 15). Q4_K's d*sc*q - dmin*mn is reassociated: one rounding.
    """
    w = weight(qtype, 40, "int4_f32")
    got, want = effective(w), w.dequantize()  # (N, K) each
    if qtype in EXACT_INT4:
        assert torch.equal(got, want)
    else:  # two float32 roundings (of z + 8s and of the FMA), each within 2^-24 of its operands
        _, _, s, z = affine_groups(w.raw, qtype)  # (N, K/32) x2
        assert ((got - want).abs() <= per_weight(2.0 ** -23 * (16 * s.abs() + z.abs()))).all()


@pytest.mark.parametrize("qtype", INT4_QTYPES)
def test_int4_bf16_kernel_weights_follow_the_convention(qtype):
    """bf16 kernel: w = (l - 8) bf16(s) + bf16(z + 8s) [+ h bf16(16 s)], summed in float32, rounded once."""
    w = weight(qtype, 40, "int4")
    low, high, s, z = affine_groups(w.raw, qtype)  # (N, K), (N, K) | None, (N, K/32) x2
    bf = lambda t: per_weight(t.bfloat16().float())  # noqa: E731
    want = (low.float() - 8) * bf(s) + bf(z + 8 * s)  # (N, K)
    if high is not None:
        want = want + high.float() * bf(16 * s)  # (N, K): the high plane, codes h + 8
    assert torch.equal(effective(w), want.bfloat16().float())


def bound(x, w, err) -> torch.Tensor:
    """|y - ref| allowed: per-weight error `err` (N, K), x and y rounded at 2^-8 relative."""
    ax = x.abs().float().reshape(-1, w.shape[1])  # (M, K)
    dense = w.dequantize().abs()  # (N, K)
    return ax @ (err + EPS * dense).t() + EPS * (ax @ dense.t()) + 1e-30  # (M, N)


def int4_error(w) -> torch.Tensor:
    """Per-weight bound of the bf16 int4 route: |c - 8| <= 8 times s's rounding, plus the zero's."""
    low, high, s, z = affine_groups(w.raw, w.qtype)
    err = EPS * (8 * s.abs() + (z + 8 * s).abs())  # (N, K/32)
    if high is not None:
        err = err + EPS * 8 * 16 * s.abs()
    return per_weight(err)  # (N, K)


def requant_error(w) -> torch.Tensor:
    """Half a step of the re-quantization, plus bf16 rounding of its scale and zero."""
    dense = w.dequantize()  # (N, K)
    if w.route == "int8_row":
        step = (dense.abs().amax(dim=1, keepdim=True) / 127).expand_as(dense)  # (N, K)
        return 0.5 * step + EPS * 127 * step
    groups = dense.view(dense.shape[0], -1, 32)  # (N, K/32, 32)
    low, step = groups.amin(-1), (groups.amax(-1) - groups.amin(-1)) / 15  # (N, K/32) each
    return per_weight(0.5 * step + EPS * (8 * step + (low + 8 * step).abs()))  # (N, K)


ROUTES_ALL = ("int4", "int4_f32", "bf16", "float32", "dequant", "int8_row", "int4_requant")


@pytest.mark.parametrize("rows", [1, 16, 40])  # 40: not a multiple of the kernel's 16 (padded)
@pytest.mark.parametrize("batch", [(1,), (7,), (2, 3), ()])
@pytest.mark.parametrize("route", ROUTES_ALL)
@pytest.mark.parametrize("qtype", INT4_QTYPES)  # every route of ROUTES_ALL takes these
def test_route_against_the_reference(qtype, route, batch, rows):
    w = weight(qtype, rows, route)
    x = torch.randn(*batch, w.shape[1], generator=torch.Generator().manual_seed(rows))  # (..., K)
    y, ref = quantized_linear(x, w), naive_quantized_linear(x, w)
    assert y.shape == ref.shape == (*batch, rows) and y.dtype == torch.float32
    if route in ("float32", "dequant"):
        assert torch.equal(y, ref)
        return
    if route == "int4_f32":  # the reference's weights (above), float32 sums in another order
        ax = x.abs().reshape(-1, w.shape[1])  # (M, K)
        slack = (1e-5 * (ax @ w.dequantize().abs().t()) + 1e-30).view(ref.shape)
    else:
        err = {"int4": int4_error, "bf16": lambda w: EPS * w.dequantize().abs()}.get(route, requant_error)(w)
        slack = bound(x, w, err).view(ref.shape)
    assert ((y - ref).abs() <= slack).all(), ((y - ref).abs() / slack).max()


@pytest.mark.parametrize("route", ["int4", "bf16", "int8_row"])
def test_rows_from_prefill_rows_on_take_the_exact_route(route):
    w = weight("Q4_1", 40, route, prefill_rows=5)
    prefill, decode = torch.randn(7, 96), torch.randn(4, 96)  # (7, K): >= 5 rows; (4, K): fewer
    assert torch.equal(quantized_linear(prefill, w), naive_quantized_linear(prefill, w))
    assert not torch.equal(quantized_linear(decode, w), naive_quantized_linear(decode, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_x_gives_16_bit_y(dtype):
    w = weight("Q4_1", 16, "int4")
    x = torch.randn(3, 96).to(dtype)
    y = quantized_linear(x, w)
    assert y.dtype == dtype and y.shape == (3, 16)


@pytest.mark.parametrize("route", ROUTES_ALL)
def test_no_rows_give_no_rows(route):
    w = weight("Q8_0", 16, route)
    assert quantized_linear(torch.zeros(0, 96), w).shape == (0, 16)


def test_fused_projection_is_the_separate_ones_side_by_side():
    """q|k|v as one weight (blocks are rows): each output depends only on its own row's blocks."""
    parts = [blocks("Q4_1", n, 96, seed=n) for n in (48, 16, 16)]
    x = torch.randn(5, 96)
    fused = quantized_linear(x, pack_linear(torch.cat(parts), "Q4_1"))  # (5, 80)
    alone = [quantized_linear(x, pack_linear(p, "Q4_1")) for p in parts]
    assert torch.equal(fused, torch.cat(alone, dim=-1))


@pytest.mark.parametrize("qtype", ["Q5_0", "Q8_0", "Q4_1"])
def test_a_weight_held_only_by_its_panels_gives_what_its_blocks_give(qtype):
    """`without_raw` (a loader's copy of the blocks let go once the panels hold them): the products, the
    prefill's tiles, the dequantized weight, the blocks read back and the parts a split cuts (inside a
    panel too) equal the weight's with its blocks; the raw copy is gone (meta)."""
    from gatherlens.ops.quant.products.linear import split_linear
    from gatherlens.ops.quant.products.tiled import tiled_dequant_matmul
    raw = blocks(qtype, 40, 96)
    full = pack_linear(raw, qtype, LinearConfig("q8act", 16))
    bare = full.without_raw()
    assert bare.raw.is_meta and bare.device == full.device and bare.shape == full.shape
    assert torch.equal(bare.blocks(), raw) and torch.equal(bare.blocks(3, 21), raw[3:21])
    torch.testing.assert_close(bare.dequantize(), full.dequantize(), rtol=0, atol=0)
    for M in (1, 5, 33):  # decode, a few rows, the prefill row
        x = torch.randn(M, 96)
        assert torch.equal(quantized_linear(x, bare), quantized_linear(x, full)), M
    x = torch.randn(7, 96)
    assert torch.equal(tiled_dequant_matmul(x, bare, rows=12), tiled_dequant_matmul(x, full, rows=12))
    for sizes in ((16, 24), (13, 27)):  # whole panels (views), then cut inside one (their blocks unpacked)
        for a, b in zip(split_linear(bare, sizes), split_linear(full, sizes)):
            assert torch.equal(a.blocks(), b.blocks()) and torch.equal(quantized_linear(x, a), quantized_linear(x, b))


def test_packed_bytes():
    w = weight("Q4_1", 48, "int4")  # (48, 96): codes K/2 bytes per row, (K/32, N, 2) bf16 scales
    assert w.nbytes() == 48 * 48 + 3 * 48 * 2 * 2
    assert weight("Q8_0", 48, "int4").nbytes() == 48 * 96 + 6 * 48 * 2 * 2  # two planes


RAW = blocks("Q4_1", 16, 96)


@pytest.mark.parametrize("call,error,words", [
    (lambda: pack_linear(RAW.numpy(), "Q4_1"), GatherTypeError, "raw must be a uint8 torch.Tensor"),
    (lambda: pack_linear(RAW.float(), "Q4_1"), GatherValueError, "raw must be 2-D uint8"),
    (lambda: pack_linear(RAW[0], "Q4_1"), GatherValueError, "raw must be 2-D uint8"),
    (lambda: pack_linear(RAW, "Q4_2"), GatherValueError, "qtype must be one of"),
    (lambda: pack_linear(RAW[:, :50], "Q4_1"), GatherValueError, "raw of Q4_1 rows must be a whole number of 20-byte blocks; got 50"),
    (lambda: pack_linear(RAW, "Q4_1", LinearConfig("int3")), GatherValueError, "route must be one of"),
    (lambda: pack_linear(torch.zeros(16, FORMATS["Q6_K"].block_bytes, dtype=torch.uint8), "Q6_K"), GatherValueError,
     "route 'int4' takes qtype"),
    (lambda: pack_linear(RAW, "Q4_1", LinearConfig(prefill_rows=0)), GatherValueError, "prefill_rows"),
    (lambda: quantized_linear(torch.zeros(2, 96), RAW), GatherTypeError, "weight must be a QuantizedWeight"),
    (lambda: quantized_linear([0.0] * 96, pack_linear(RAW, "Q4_1")), GatherTypeError, "x must be a torch.Tensor"),
    (lambda: quantized_linear(torch.zeros(2, 96, dtype=torch.int64), pack_linear(RAW, "Q4_1")),
     GatherTypeError, "x must be float32"),
    (lambda: quantized_linear(torch.zeros(2, 95), pack_linear(RAW, "Q4_1")), GatherValueError,
     r"K = 96 \(the weight's in-features\), got shape \(2, 95\)"),
    (lambda: quantized_linear(torch.tensor(1.0), pack_linear(RAW, "Q4_1")), GatherValueError, "x must be"),
], ids=["raw-type", "raw-dtype", "raw-1d", "qtype", "raw-width", "route", "route-qtype", "prefill_rows",
        "weight-type", "x-type", "x-dtype", "x-width", "x-0d"])
def test_errors_name_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


@pytest.mark.parametrize("qtype", QTYPES)
def test_every_format_takes_the_dense_routes(qtype):
    """The bf16 route (a dense copy) takes every format of the table, restricted routes or not."""
    fmt = FORMATS[qtype]
    raw = torch.zeros(16, fmt.block_bytes, dtype=torch.uint8)  # (16, bytes): one block a row, all zero
    w = pack_linear(raw, qtype, LinearConfig("bf16"))
    assert torch.equal(quantized_linear(torch.ones(2, fmt.weights), w), torch.zeros(2, 16))


def test_reference_is_f_linear_on_the_dequantized_blocks():
    w = weight("Q4_1", 16, "dequant")
    x = torch.randn(3, 96)
    assert torch.equal(naive_quantized_linear(x, w), F.linear(x, w.dequantize()))


def test_bench_qlinear_tiny_run_writes_json(tmp_path):
    import json

    from click.testing import CliRunner

    from gatherlens.bench.quantized_linear import command

    out = tmp_path / "q.json"
    args = ["--gguf", "synthetic", "--shapes", "k/v", "--rows", "1,3", "--routes", "float32,int4,int4_f32",
            "--copies", "2", "--repeats", "1", "--threads", "1", "--json", str(out)]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rows"], r["route"]) for r in rows] == [(1, "float32"), (1, "int4"), (1, "int4_f32"),
                                                       (3, "float32"), (3, "int4")]  # int4_f32: M = 1 only
    for r in rows:
        assert (r["n"], r["k"], r["qtype"], r["copies"]) == (192, 576, "Q4_1", 2)
        assert r["hot_s"] > 0 and r["cold_s"] > 0
        assert r["ratio_hot"] == pytest.approx(r["hot_s"] / rows[0 if r["rows"] == 1 else 3]["hot_s"])
        assert (r["max_abs_err"] == 0) == (r["route"] == "float32")
    assert "wrote" in result.output and CliRunner().invoke(command, args).exit_code != 0  # no overwrite


@pytest.mark.parametrize("qtype", ["IQ4_NL", "Q6_K"])  # gguf has no quantizer for them: random codes
def test_bench_qlinear_times_one_format_for_every_shape(tmp_path, qtype):
    """--qtype: the synthetic shapes in one block format, the integer GEMM against dequant + float32
    (how the records' gemm_rows were measured)."""
    import json

    from click.testing import CliRunner

    from gatherlens.bench.quantized_linear import command

    out = tmp_path / "q.json"
    args = ["--gguf", "synthetic", "--qtype", qtype, "--shapes", "down", "--rows", "5", "--routes", "q8act,dequant",
            "--copies", "1", "--repeats", "1", "--threads", "1", "--json", str(out)]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["route"], r["qtype"], r["n"], r["k"], r["rows"]) for r in rows] == [
        ("q8act", qtype, 576, 1536, 5), ("dequant", qtype, 576, 1536, 5)]
    assert rows[1]["max_abs_err"] == 0 and 0 < rows[0]["rel_err"] < 0.02  # x rounded to 8 bits


@pytest.mark.parametrize("args", [["--shapes", "lm_head"], ["--routes", "int3"], ["--rows", "0"],
                                  ["--rows", "a"], ["--copies", "0"], ["--head-routes", "fp8"], ["--qtype", "Q9_9"]],
                         ids=lambda a: " ".join(a))
def test_bench_qlinear_rejects_bad_options(tmp_path, args):
    from click.testing import CliRunner

    from gatherlens.bench.quantized_linear import command

    result = CliRunner().invoke(command, args + ["--gguf", "synthetic", "--json", str(tmp_path / "x.json")])
    assert result.exit_code != 0 and not (tmp_path / "x.json").exists()
