"""ops/quant/products/tiled.py: the prefill's product with the weight dequantized a tile of rows at a time,
against the "dequant" route (the whole weight dequantized, F.linear), on odd sizes and every q8act format."""
from __future__ import annotations

import pytest
import torch

from gatherlens.ops.quant.products.linear import LinearConfig, pack_linear
from gatherlens.ops.quant.products.matmul import ROUTES
from gatherlens.ops.quant.formats.sizes import SIZES
from gatherlens.ops.quant.products.tiled import tiled_dequant_matmul


def _finite_scales(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """Q4_0 / Q4_1 / Q8_0: each block's float16 fields set to small finite values."""
    elems, nbytes = SIZES[qtype]
    blocks = raw.view(raw.shape[0], -1, nbytes).clone()  # (N, nb, bytes)
    halves = 2 if qtype == "Q4_1" else 1
    scales = (torch.rand(blocks.shape[0], blocks.shape[1], halves) * 0.02).to(torch.float16)  # (N, nb, h)
    blocks[..., : 2 * halves] = scales.view(torch.uint8).view(blocks.shape[0], blocks.shape[1], 2 * halves)
    return blocks.view(raw.shape[0], -1)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("N,rows", [(5, 256), (300, 256), (257, 64), (64, 64), (1000, 7), (300, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_equals_the_whole_weight_route(qtype, N, rows, dtype):
    K = 96
    weight = pack_linear(_finite_scales(torch.randint(0, 256, (N, K // 32 * SIZES[qtype][1]), dtype=torch.uint8,
                                                      generator=torch.Generator().manual_seed(N)), qtype),
                         qtype, LinearConfig(route="dequant"))
    x = torch.randn(37, K).to(dtype)  # (M, K)
    ref = ROUTES["dequant"].matmul(x, weight)  # (M, N)
    got = tiled_dequant_matmul(x, weight, rows=rows)
    assert got.shape == ref.shape == (37, N) and got.dtype == ref.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding of a float32 sum summed in another order
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    if dtype == torch.float32 and (rows is None or N <= rows):
        assert torch.equal(got, ref)  # one tile: the reference's own call


def test_tiled_takes_no_rows_and_one_row():
    weight = pack_linear(_finite_scales(torch.randint(0, 256, (70, 2 * 20), dtype=torch.uint8), "Q4_1"), "Q4_1",
                         LinearConfig(route="dequant"))
    for M in (0, 1):
        x = torch.randn(M, 64)  # (M, K)
        torch.testing.assert_close(tiled_dequant_matmul(x, weight, rows=16), ROUTES["dequant"].matmul(x, weight))


def test_the_prefill_row_runs_tiled_and_a_large_weight_is_tiled(monkeypatch):
    """linear.LINEAR_PRODUCT's "prefill" row is tiled_dequant_matmul; a weight over TILE_BYTES is dequantized
    in tiles (never whole), with the same result."""
    import gatherlens.ops.quant.products.tiled as tiled
    from gatherlens.ops.quant.products.linear import LINEAR_PRODUCT

    assert LINEAR_PRODUCT.by_name["prefill"].run is tiled_dequant_matmul
    raw = _finite_scales(torch.randint(0, 256, (700, 2 * 20), dtype=torch.uint8), "Q4_1")  # (700, 40): K = 64
    weight = pack_linear(raw, "Q4_1", LinearConfig(route="dequant"))
    seen, real = [], tiled.dequantize_rows
    monkeypatch.setattr(tiled, "dequantize_rows", lambda r, q: seen.append(r.shape[0]) or real(r, q))
    monkeypatch.setattr(tiled, "TILE_BYTES", 256 * 64 * 4)  # 256 rows of K = 64 float32
    x = torch.randn(9, 64)  # (M, K)
    torch.testing.assert_close(tiled_dequant_matmul(x, weight), ROUTES["dequant"].matmul(x, weight))
    assert seen == [256, 256, 188]
