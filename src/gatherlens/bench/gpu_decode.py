"""GPU benchmark of page-selected sparse decode: the Triton kernel and the torch path vs SDPA.

    $ PYTHONPATH=src python -m gatherlens.bench.gpu_decode gpu_decode.json [--contexts 32768,131072]

Needs only torch (CUDA) and triton: no click or rich, so it runs on a bare GPU machine.
Batch 8, 32 query heads over 8 KV heads, head dim 128, bfloat16, budget 2048, page 16.
Checks correctness first (Triton vs the torch path, and both vs the float64 reference on a small
case), then times each method with CUDA events (median), L2 flushed between calls. Whole run is
bounded (--deadline seconds, default 150): cases that would start after it are skipped, every
error is caught and written to the JSON, which is written even if a case fails.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.config import OP
from gatherlens.ops.sparse.geometry import page_count
from gatherlens.ops.sparse.naive import sparse_attention_reference
from gatherlens.ops.sparse.page_choice import select_pages
from gatherlens.ops.sparse.torch_decode import attend_pages


def _time_ms(fn, warmup: int = 10, iters: int = 50) -> float:
    """Median milliseconds of fn() over `iters` runs, L2 flushed before each."""
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def torch_attend(q, cache, pages):
    """The torch path's gather + exact attention over given pages (B, Hsel, n)."""
    out, lse = attend_pages(q, cache, pages, 1 / math.sqrt(q.shape[-1]))  # (B, Hq, 1, D), (B, Hq, 1)
    return out.to(q.dtype), lse


def check_small() -> dict:
    """Triton == torch path == float64 reference on small odd shapes, fp32 and bf16."""
    torch.manual_seed(0)
    worst = {}
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        for B, Hq, Hkv, L, D, P, budget, share in [(2, 8, 2, 1000, 64, 16, 256, True),
                                                   (3, 6, 3, 77, 128, 8, 24, False),
                                                   (1, 4, 4, 50, 32, 16, 4096, True)]:
            cache = PagedKVCache(B, Hkv, D, P, dtype=dtype, device="cuda")
            k = torch.randn(B, Hkv, L, D, device="cuda", dtype=dtype)
            v = torch.randn(B, Hkv, L, D, device="cuda", dtype=dtype)
            cache.append(k, v)
            q = torch.randn(B, Hq, 1, D, device="cuda", dtype=dtype)
            o_k, l_k, sel = sparse_decode(q, cache, budget, share_selection=share, return_lse=True,
                                          return_selection=True, backend="triton")
            o_t, l_t = torch_attend(q, cache, sel.pages)  # torch path on the kernel's pages
            o_r, l_r = sparse_attention_reference(q, k, v, sel.pages, P)
            err = max((o_k.float() - o_t.float()).abs().max().item(),
                      (o_k.float() - o_r.float()).abs().max().item(),
                      (l_k - l_r).abs().max().item())
            name = f"{str(dtype)[6:]} B{B} Hq{Hq} Hkv{Hkv} L{L} D{D} P{P} budget{budget} share{share}"
            worst[name] = err
            if not err <= tol:
                raise AssertionError(f"triton differs from torch/reference by {err} > {tol} on {name}")
    return worst


def _graphed(fn):
    """Capture fn() in a CUDA graph (after warm-up on a side stream); return its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def filled_cache(L: int, B: int, Hkv: int, D: int, P: int, dtype) -> PagedKVCache:
    """A (B, Hkv, L, D) random cache, appended in chunks (no second full-size copy)."""
    cache = PagedKVCache(B, Hkv, D, P, dtype=dtype, device="cuda", capacity=L)
    chunk = 16384
    for s in range(0, L, chunk):
        t = min(chunk, L - s)
        cache.append(torch.randn(B, Hkv, t, D, device="cuda", dtype=dtype),
                     torch.randn(B, Hkv, t, D, device="cuda", dtype=dtype))
    return cache


def check_case(q, cache, budget: int, row: dict) -> None:
    """Correctness at this size, into `row`: triton vs the torch path, full budget vs SDPA."""
    B, Hq, _, D = q.shape
    Hkv, L = cache.kv_heads, cache.length
    o_k, l_k, sel = sparse_decode(q, cache, budget, return_lse=True, return_selection=True,
                                  backend="triton")
    o_t, l_t = torch_attend(q, cache, sel.pages)
    _, sel_t = sparse_decode(q, cache, budget, return_selection=True, backend="torch")
    row["page_agreement_triton_vs_torch_scoring"] = (sel.pages == sel_t.pages).float().mean().item()
    row["max_abs_err_triton_vs_torch"] = (o_k.float() - o_t.float()).abs().max().item()
    row["max_abs_err_lse"] = (l_k - l_t).abs().max().item()
    if not row["max_abs_err_triton_vs_torch"] < 5e-2:
        raise AssertionError(f"triton vs torch error {row['max_abs_err_triton_vs_torch']} at L={L}")
    dense = F.scaled_dot_product_attention(q.view(B, Hkv, Hq // Hkv, D), cache.keys,
                                           cache.values).view(B, Hq, 1, D)
    full = sparse_decode(q, cache, L, backend="triton")
    row["max_abs_err_full_budget_vs_sdpa"] = (full.float() - dense.float()).abs().max().item()


def methods_for(q, cache, budget: int, row: dict) -> dict:
    """name -> a no-argument call to time: dense SDPA, both sparse paths and their pieces."""
    from gatherlens.ops.sparse.triton_decode import (triton_attend_pages, triton_page_bounds,
                                                     triton_select_pages)

    B, Hq, _, D = q.shape
    Hkv, K, V = cache.kv_heads, cache.keys, cache.values  # (B, Hkv, L, D) views of the paged storage
    G = Hq // Hkv
    pages, _ = select_pages(q, cache, budget)
    methods = {
        "sdpa_gqa": lambda: F.scaled_dot_product_attention(q, K, V, enable_gqa=True),
        "sdpa_folded": lambda: F.scaled_dot_product_attention(q.view(B, Hkv, G, D), K, V),
        "sparse_triton": lambda: sparse_decode(q, cache, budget, backend="triton"),
        "sparse_torch": lambda: sparse_decode(q, cache, budget, backend="torch"),
        "select_torch": lambda: select_pages(q, cache, budget),
        "select_triton": lambda: triton_select_pages(q, cache, budget),
        "bounds_kernel_only": lambda: triton_page_bounds(q, cache),
        "triton_kernel_only": lambda: triton_attend_pages(q, cache, pages, 1 / math.sqrt(D)),
    }
    try:  # the same step replayed from a CUDA graph: what it costs without Python/launch overhead
        methods["sparse_triton_cudagraph"] = _graphed(lambda: sparse_decode(q, cache, budget, backend="triton"))
        methods["sdpa_gqa_cudagraph"] = _graphed(lambda: F.scaled_dot_product_attention(q, K, V, enable_gqa=True))
    except Exception as e:
        row["error_cudagraph"] = repr(e)
    return methods


def time_methods(methods: dict, row: dict) -> None:
    """Median ms of each method, and its speedup over the faster dense SDPA, into `row`."""
    times = {}
    for name, fn in methods.items():
        try:
            times[name] = _time_ms(fn)
        except Exception as e:  # keep the other methods' numbers
            times[name] = None
            row[f"error_{name}"] = repr(e)
    row["ms"] = times
    base = min(t for n, t in times.items() if n in ("sdpa_gqa", "sdpa_folded") and t is not None)
    row["dense_ms"] = base
    row["speedup_vs_dense"] = {n: (base / t if t else None) for n, t in times.items()}


def run_case(L: int, args) -> dict:
    """One context length: correctness, then timings, then the bytes each method must read."""
    B, Hq, Hkv, D, P, budget = args.batch, 32, 8, 128, OP.page_size, args.budget
    torch.manual_seed(0)
    cache = filled_cache(L, B, Hkv, D, P, torch.bfloat16)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    row = {"context": L, "batch": B, "budget": budget, "page_size": P, "dtype": "bfloat16"}
    check_case(q, cache, budget, row)
    time_methods(methods_for(q, cache, budget, row), row)
    el, n_pages = 2, page_count(L, P)
    row["bytes_dense"] = 2 * B * Hkv * L * D * el
    row["bytes_sparse"] = B * Hkv * n_pages * 2 * D * el + 2 * B * Hkv * budget * D * el
    row["bound"] = 1 / (1 / P + budget / L)
    return row


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="?", default="gpu_decode.json")
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", type=int, default=OP.budget)  # sparse_decode's default (the OP preset)
    ap.add_argument("--deadline", type=float, default=150.0)
    return ap.parse_args(argv)


def why_not_run(report: dict) -> str | None:
    """Why this machine cannot run the benchmark (no CUDA, no triton), or None; notes versions."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import triton
    except Exception as e:
        return f"triton not importable: {e!r}"
    report["triton"] = triton.__version__
    report["device"] = torch.cuda.get_device_name()
    return None


def print_table(report: dict) -> None:
    print(f"{report['device']}  torch {report['torch']}  triton {report.get('triton')}")
    print(f"{'context':>8} {'method':>20} {'ms':>9} {'x dense':>8}")
    for row in report["rows"]:
        for name, ms in row["ms"].items():
            sp = row["speedup_vs_dense"][name]
            print(f"{row['context']:>8} {name:>20} {ms if ms is None else round(ms, 4):>9} "
                  f"{'' if sp is None else round(sp, 2):>8}")
        print(f"{'':>8} bound {row['bound']:.1f}x, err triton-vs-torch "
              f"{row['max_abs_err_triton_vs_torch']:.2e}, full-budget-vs-sdpa "
              f"{row['max_abs_err_full_budget_vs_sdpa']:.2e}")


def run_cases(args, report: dict, write, t0: float) -> None:
    """Every context within the deadline; a failing case is recorded, the others still run."""
    for L in [int(x) for x in args.contexts.split(",")]:
        if time.time() - t0 > args.deadline:
            report["errors"].append(f"skipped context {L}: past the {args.deadline}s deadline")
            continue
        try:
            report["rows"].append(run_case(L, args))
        except Exception:
            report["errors"].append(traceback.format_exc())
            print(report["errors"][-1])
        torch.cuda.empty_cache()
        write()


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.path.exists(args.json):
        print(f"{args.json} exists; remove it or name another file")
        return 2
    t0 = time.time()
    report = {"torch": torch.__version__, "python": platform.python_version(), "rows": [], "errors": []}

    def write():
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)

    skipped = why_not_run(report)
    if skipped:
        report["skipped"] = skipped
        write()
        print(f"{skipped}: nothing to benchmark")
        return 0
    try:
        report["small_checks_max_err"] = check_small()
        print("correctness (triton vs torch vs float64 reference): ok")
    except Exception:
        report["errors"].append(traceback.format_exc())
        print(report["errors"][-1])
        write()
        return 1
    run_cases(args, report, write, t0)
    print_table(report)
    report["wall_s"] = time.time() - t0
    write()
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
