"""The Triton sparse-decode kernel, run by Triton's interpreter on CPU (TRITON_INTERPRET=1),
against the torch path and the float64 reference. Skipped when triton does not import.

Triton reads TRITON_INTERPRET when it is imported, so the kernel runs in one child process
started with it set (this file run as a script); the comparisons happen here, per case.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from triton_helpers import interpreted_results
import torch

from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.naive import dense_decode_reference, sparse_attention_reference

CASES = {
    # id: (B, Hq, Hkv, L, D, P, budget, share, dtype, num_splits)
    "small-gqa": (1, 4, 2, 37, 8, 4, 12, True, "float32", None),
    "batch2-shared": (2, 8, 2, 300, 64, 16, 64, True, "float32", None),
    "batch2-per-head": (2, 8, 2, 300, 64, 16, 64, False, "float32", None),
    "head-dim-24": (1, 3, 1, 50, 24, 8, 20, True, "float32", None),
    "bench-heads-32q-8kv-D128": (1, 32, 8, 600, 128, 16, 128, True, "float32", None),
    "one-partial-page": (2, 4, 4, 5, 16, 16, 100, True, "float32", None),
    "page-5-per-head": (1, 6, 3, 129, 32, 5, 40, False, "float32", None),
    "full-budget-dense": (2, 8, 2, 77, 32, 16, 77, True, "float32", None),
    "bf16-gqa": (2, 8, 2, 300, 64, 16, 64, True, "bfloat16", None),
    "bf16-per-head": (1, 6, 3, 129, 32, 5, 40, False, "bfloat16", None),
    "splits-1": (1, 4, 2, 200, 16, 4, 60, True, "float32", 1),
    "splits-2": (1, 4, 2, 200, 16, 4, 60, True, "float32", 2),
    "splits-64-mostly-empty": (1, 4, 2, 200, 16, 4, 60, True, "float32", 64),
}


def inputs(case):
    B, Hq, Hkv, L, D, P, budget, share, dtype, splits = case
    dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(L)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    q = torch.randn(B, Hq, 1, D, generator=g).to(dtype)  # (B, Hq, 1, D)
    cache = PagedKVCache(B, Hkv, D, page_size=P, dtype=dtype)
    cache.append(k, v)
    return q, k, v, cache


def _child(out_path: str) -> None:
    """Run every case through the Triton kernel (interpreted) and save the results."""
    import math

    from gatherlens.ops.sparse.decode import sparse_decode_triton
    from gatherlens.ops.sparse.page_choice import select_pages
    from gatherlens.ops.sparse.triton_decode import triton_attend_pages

    results = {}
    for name, case in CASES.items():
        q, k, v, cache = inputs(case)
        budget, share, splits = case[6], case[7], case[9]
        if splits is None:
            out, lse, sel = sparse_decode_triton(q, cache, budget, share_selection=share,
                                                 return_lse=True, return_selection=True)
            pages = sel.pages
        else:
            pages, _ = select_pages(q, cache, budget, share_selection=share)
            out, lse = triton_attend_pages(q, cache, pages, 1 / math.sqrt(q.shape[-1]),
                                           num_splits=splits, block_n=16)
        results[name] = {"out": out, "lse": lse, "pages": pages}
        if splits is None:  # the scoring kernel against the torch scoring
            from gatherlens.ops.sparse.triton_decode import triton_page_bounds

            for score in ("max", "sum"):
                results[name][f"bounds_{score}"] = triton_page_bounds(q, cache, share, score)
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory):
    return interpreted_results(__file__, tmp_path_factory)


@pytest.mark.slow  # a subprocess: Triton's interpreter
@pytest.mark.parametrize("name", list(CASES))
def test_triton_matches_torch_path_and_reference(kernel_results, name):
    case = CASES[name]
    q, k, v, cache = inputs(case)
    B, Hq, Hkv, L, D, P, budget, share, dtype, splits = case
    got = kernel_results[name]
    o_t, l_t, sel = sparse_decode(q, cache, budget, share_selection=share, return_lse=True,
                                  return_selection=True, backend="torch")
    if dtype == "float32":
        assert torch.equal(got["pages"], sel.pages)
    else:  # bf16 bounds: the kernel accumulates in fp32, torch's bf16 matmul rounds; near-ties may swap
        assert (got["pages"] == sel.pages).float().mean() > 0.9
        o_t, l_t = sparse_attention_reference(q, k, v, got["pages"], P)
    assert got["out"].shape == (B, Hq, 1, D) and got["out"].dtype == q.dtype
    tol = 1e-5 if dtype == "float32" else 2e-2
    torch.testing.assert_close(got["out"].float(), o_t.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(got["lse"], l_t, atol=1e-5 if dtype == "float32" else 1e-2, rtol=1e-5)
    ref, ref_lse = sparse_attention_reference(q, k, v, got["pages"], P)
    torch.testing.assert_close(got["out"].float(), ref.float(), atol=tol, rtol=tol)
    if splits is None:
        from gatherlens.ops.sparse.page_choice import select_pages

        for score in ("max", "sum"):
            _, bounds = select_pages(q, cache, budget, share_selection=share, group_score=score)
            btol = 1e-4 if dtype == "float32" else 0.1
            torch.testing.assert_close(got[f"bounds_{score}"], bounds, atol=btol, rtol=btol)
    if budget >= L:
        dense, _ = dense_decode_reference(q, k, v)
        torch.testing.assert_close(got["out"], dense, atol=tol, rtol=tol)


if __name__ == "__main__":
    _child(sys.argv[1])
