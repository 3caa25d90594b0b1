"""`gatherlens bench decode`: page-selected sparse decode against dense SDPA, side by side.

    gatherlens bench decode                                        # 8K, 32K, 128K; float32 + bfloat16
    gatherlens bench decode --context 32K --context 128K --dtype float32 --json decode.json

Shape: batch 1, one new query (Q = 1), 32 query heads over 8 KV heads, head dim 128 (a
Llama-3-8B layer); budget 2048 tokens, page 16; 2 threads. Every (context, dtype) case runs in a
fresh process that builds one PagedKVCache and times, round-robin (noise hits all alike):

- sdpa:        F.scaled_dot_product_attention(q, K, V, enable_gqa=True) on the cache's K, V views
- sdpa_folded: the same dense attention with each KV group's 4 query heads folded into the query
               axis (q viewed (B, Hkv, G, D)), which avoids repeating K and V for GQA
- topk:        exact top-k decode, gatherlens.ops.attention.topk_attention(k = budget), if present
- sparse:      gatherlens.sparse_decode(q, cache, budget): scoring + selection + gather + attention
- select:      the selection alone (summary scoring + top-k of pages), a part of `sparse`

"x dense" is the speedup over the faster of the two SDPA forms. "MiB read" is what each method
must read from memory (K/V rows, page summaries; bf16 caches keep fp32 summaries on CPU); "bound" is the speedup that byte count allows,
for sparse 1 / (1/page + budget/L); "of bound" is the measured speedup as a fraction of it.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import click


from gatherlens.bench import timing
from gatherlens.bench.output import check_json_path, json_option, write_results

from gatherlens.bench.fresh import run_fresh
from gatherlens.ops.sparse import geometry
from gatherlens.ops.sparse.config import OP
from gatherlens.params import Int, cpu_count

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CONTEXTS = ("8K", "32K", "128K")
DTYPES = ("float32", "bfloat16")
ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
TARGETS = {32768: 3.0, 131072: 6.0}  # float32 speedup of sparse over dense (issue 6)


@dataclass
class Row:
    context: int
    dtype: str
    method: str
    ms: float            # median milliseconds per decode step
    speedup: float       # dense_ms / ms, dense = the faster SDPA form
    mib_read: float      # bytes the method must read, MiB
    bound: float         # dense bytes / method bytes: the speedup a memory-bound method could reach
    of_bound: float      # speedup / bound
    budget: int
    page_size: int
    threads: int


# -- inside the fresh process ----------------------------------------------------------------

def run_case(spec: dict) -> dict:
    """Build the cache and time every method in this process: {method: median seconds, ...}."""
    import torch
    import torch.nn.functional as F

    from gatherlens.ops.sparse import PagedKVCache, sparse_decode
    from gatherlens.ops.sparse.page_choice import pages_for_budget, select_pages

    torch.set_num_threads(spec["threads"])
    dtype = getattr(torch, spec["dtype"])
    L, P, budget = spec["context"], spec["page_size"], spec["budget"]
    B, Hq, Hkv, D = 1, Q_HEADS, KV_HEADS, HEAD_DIM
    G = Hq // Hkv
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache(B, Hkv, D, P, dtype=dtype, capacity=L)
    for s in range(0, L, 8192):  # fill in chunks: no second full-size copy of K and V
        t = min(8192, L - s)
        cache.append(torch.randn(B, Hkv, t, D, generator=g, dtype=dtype),   # (B, Hkv, t, D)
                     torch.randn(B, Hkv, t, D, generator=g, dtype=dtype))   # (B, Hkv, t, D)
    q = torch.randn(B, Hq, 1, D, generator=g, dtype=dtype)  # (B, Hq, 1, D)
    K, V = cache.keys, cache.values  # (B, Hkv, L, D) views of the paged storage, contiguous
    methods = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, K, V, enable_gqa=True),
        "sdpa_folded": lambda: F.scaled_dot_product_attention(q.view(B, Hkv, G, D), K, V),
        "sparse": lambda: sparse_decode(q, cache, budget=budget),
        "select": lambda: select_pages(q, cache, budget),
    }
    try:
        from gatherlens.ops.attention import topk_attention

        k = min(spec["top_k"], L)
        methods["topk"] = lambda: topk_attention(q, K, V, k, enable_gqa=True)
    except ImportError:
        pass
    result = {"tokens_read": geometry.tokens_read(pages_for_budget(budget, L, P), P, L)}
    with torch.inference_mode():
        for fn in methods.values():  # warm-up (allocations, oneDNN primitives)
            fn()
        result["seconds"] = timing.medians(timing.round_robin(methods, spec["repeats"]))
    return result


# -- the driver --------------------------------------------------------------------------------

def _fresh(spec: dict) -> dict:
    return run_fresh("gatherlens.bench.decode", spec)


def bytes_read(method: str, L: int, dtype: str, budget: int, page_size: int, top_k: int,
               tokens_read: int) -> float:
    """Bytes a method must read for one decode step (batch 1); the query is negligible."""
    el, Hkv, Hq, D = ELEMENT[dtype], KV_HEADS, Q_HEADS, HEAD_DIM
    n_pages = geometry.page_count(L, page_size)
    if method in ("sdpa", "sdpa_folded"):
        return 2 * Hkv * L * D * el                           # all of K and V
    summary = Hkv * n_pages * 2 * D * (4 if el < 4 else el)  # [max | min] per page (fp32 on CPU for bf16)
    if method == "select":
        return summary
    if method == "sparse":
        return summary + Hkv * 2 * tokens_read * D * el
    if method == "topk":
        return (Hkv * L * D + Hq * min(top_k, L) * D) * el    # all of K, k rows of V per head
    raise ValueError(method)


def rows_of(spec: dict, result: dict) -> list[Row]:
    sec = result["seconds"]
    dense = min(sec["sdpa"], sec["sdpa_folded"])
    L, dt = spec["context"], spec["dtype"]
    full = bytes_read("sdpa", L, dt, spec["budget"], spec["page_size"], spec["top_k"], 0)
    rows = []
    for method, s in sec.items():
        b = bytes_read(method, L, dt, spec["budget"], spec["page_size"], spec["top_k"],
                       result["tokens_read"])
        bound = full / b
        rows.append(Row(L, dt, method, s * 1e3, dense / s, b / 2**20, bound, dense / s / bound,
                        spec["budget"], spec["page_size"], spec["threads"]))
    return rows


MAX_CONTEXT = 1 << 30   # tokens: past any model's positions and any machine's memory


def parse_context(text: str) -> int:
    """'32K' -> 32768, '128k' -> 131072, '4096' -> 4096."""
    t = text.strip().upper()
    mult = 1024 if t.endswith("K") else 1024 * 1024 if t.endswith("M") else 1
    t = t.rstrip("KM")
    if not t.isascii() or not t.isdigit() or len(t) > 12 or not 0 < int(t) * mult <= MAX_CONTEXT:
        raise click.BadParameter(f"context {text!r} must be a positive integer of ASCII digits, optionally with K "
                                 f"or M (e.g. 32K), at most {MAX_CONTEXT:,} tokens", param_hint="--context")
    return int(t) * mult


@click.command("decode")
@click.option("--context", "contexts", multiple=True, help="KV cache length, repeatable: 8K, 32K, 131072 "
              "(default 8K, 32K, 128K)")
@click.option("--budget", type=Int(1), default=OP.budget, show_default=True,
              help="tokens sparse decode reads per KV head (default: sparse_decode's, the OP preset)")
@click.option("--page-size", type=Int(1), default=OP.page_size, show_default=True,
              help="tokens per page (the OP preset's)")
@click.option("--top-k", "top_k", type=Int(1), default=None, help="k of the exact top-k decode (default: budget)")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(list(ELEMENT)),
              help="repeatable (default float32 and bfloat16)")
@click.option("--threads", type=Int(1, cpu_count()), default=2, show_default=True, help="torch threads in each case")
@click.option("--repeats", type=Int(1), default=None,
              help="timed calls per method; the median is reported (default 10, 5 at L >= 128K)")
@json_option("bench-decode.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def command(contexts, budget, page_size, top_k, dtypes, threads, repeats, json_path, force):
    """Time page-selected sparse decode against dense SDPA and exact top-k (fresh process per case)."""
    from rich.console import Console
    from rich.table import Table

    check_json_path(json_path, force)
    for name, value in (("--budget", budget), ("--page-size", page_size), ("--threads", threads)):
        if value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=name)
    if repeats is not None and repeats < 1:
        raise click.BadParameter(f"must be >= 1, got {repeats}", param_hint="--repeats")
    if top_k is not None and top_k < 1:
        raise click.BadParameter(f"must be >= 1, got {top_k}", param_hint="--top-k")
    Ls = [parse_context(c) for c in (contexts or CONTEXTS)]
    dtypes = dtypes or DTYPES
    console = Console(width=None if sys.stdout.isatty() else 120)
    start = time.perf_counter()
    rows: list[Row] = []
    for L in Ls:
        for dt in dtypes:
            spec = dict(context=L, dtype=dt, budget=budget, page_size=page_size, threads=threads,
                        top_k=top_k or budget, repeats=repeats or (5 if L >= 131072 else 10))
            case = rows_of(spec, _fresh(spec))
            rows += case
            sp = {r.method: r.speedup for r in case}
            console.log(f"L={L} {dt}: sparse x{sp['sparse']:.2f} of dense")
    table = Table(title=f"sparse decode vs dense SDPA: batch 1, {Q_HEADS} q / {KV_HEADS} kv heads, "
                        f"D={HEAD_DIM}, budget {budget}, page {page_size}, {threads} threads (median)")
    for col in ("L", "dtype", "method", "ms", "x dense", "MiB read", "bound", "of bound"):
        table.add_column(col, justify="left" if col in ("dtype", "method") else "right", no_wrap=True)
    for r in rows:
        table.add_row(str(r.context), r.dtype, r.method, f"{r.ms:.4g}", f"{r.speedup:.2f}",
                      f"{r.mib_read:.1f}", f"{r.bound:.1f}", f"{r.of_bound:.2f}")
    console.print(table)
    verdicts = []
    for L, want in TARGETS.items():
        got = [r.speedup for r in rows if r.context == L and r.dtype == "float32" and r.method == "sparse"]
        if got:
            verdicts.append({"context": L, "target": want, "speedup": got[0], "met": got[0] >= want})
            console.print(f"target L={L} float32: sparse >= {want}x dense: "
                          f"{'met' if got[0] >= want else 'NOT met'} ({got[0]:.2f}x)")
    import torch

    meta = {"torch": torch.__version__, "threads": threads, "batch": 1, "q_heads": Q_HEADS,
            "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "budget": budget, "page_size": page_size,
            "dense": "the faster of sdpa (enable_gqa) and sdpa_folded", "targets": verdicts,
            "wall_s": time.perf_counter() - start}
    write_results(json_path, "decode", meta, rows, force=force)
    console.print(f"wrote {json_path}")
