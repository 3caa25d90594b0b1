"""`gatherlens bench attention`: top-k attention against F.scaled_dot_product_attention.

    gatherlens bench attention                                   # the full grid (~10 min, 2 cores)
    gatherlens bench attention --mode decode --context 32768 --top-k 64,256 --dtype float32

Shapes:
- decode: one new query (Q = 1, is_causal=False as transformers passes it) against a cache of
  L in {4K, 32K, 128K}; 32 query heads over 8 KV heads, head_dim 128 (a Llama-3-8B layer).
- prefill: Q = L in {1K, 4K, 8K}, causal; 9 query heads over 3 KV heads, head_dim 64 (a
  SmolLM2-135M layer).
Batch 1, float32 and bfloat16, top_k in {64, 256, 1024, 2048}, 2 threads.

Every case runs in a fresh subprocess, so its peak memory is its own: the process first runs the
op once and records the rise of its peak resident set (VmHWM, reset just before) above what the
inputs already hold ("extra MiB"), then times SDPA and top-k round-robin (noise hits both alike)
and reports medians and the ratio topk / baseline (< 1: top-k is faster). SDPA's own extra memory
comes from one more fresh process per (mode, L, dtype).

The baseline is the strongest dense form measured here: for decode, SDPA with each KV group's query
heads folded into one matmul (q viewed (B, Hkv, G, D) against K (B, Hkv, L, D)), faster on this
CPU than `enable_gqa=True`, which is timed too (sdpa_gqa_s; docs/benchmarks.md); for prefill,
`F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)`. Decode also runs with
share_selection=True (one key set per KV group). `--plot` draws the ratios against the context.
"""
from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click


from gatherlens.bench import timing
from gatherlens.bench.output import check_json_path, json_option, write_results
from gatherlens.bench.plot import check_plot_path, plot_ratios

from gatherlens.bench.decode import MAX_CONTEXT
from gatherlens.bench.fresh import run_fresh
from gatherlens.params import Int, cpu_count, positive_ints

MODES = {
    # mode: (query heads, kv heads, head_dim, causal, contexts)
    "decode": (32, 8, 128, False, (4096, 32768, 131072)),
    "prefill": (9, 3, 64, True, (1024, 4096, 8192)),
}
TOP_K = (64, 256, 1024, 2048)
DTYPES = ("float32", "bfloat16")
# Cases left out of the default grid to keep it under ~12 minutes on 2 cores (still runnable
# by naming them with --context/--dtype): bfloat16 at the longest context of each mode.
SKIP = {("decode", 131072, "bfloat16"), ("prefill", 8192, "bfloat16")}


@dataclass
class Row:
    mode: str
    context: int
    dtype: str
    top_k: int
    q_heads: int
    kv_heads: int
    head_dim: int
    threads: int
    sdpa_s: float           # the baseline's time (see `baseline`)
    topk_s: float
    ratio: float            # topk_s / sdpa_s
    sdpa_extra_mib: float   # peak RSS rise of one SDPA call above the inputs
    topk_extra_mib: float   # same for one topk_attention call
    inputs_mib: float       # resident set holding the inputs (and torch)
    baseline: str = "sdpa"  # which dense form sdpa_s timed: "sdpa_folded" (decode) or "sdpa" (prefill)
    sdpa_gqa_s: float = 0.0  # decode: SDPA with enable_gqa=True, for comparison (0 for prefill)
    share_selection: bool = False


# -- inside the fresh process ----------------------------------------------------------------

def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_extra(fn) -> float:
    """MiB the peak resident set rises above the current one while fn runs once."""
    _reset_peak()
    base = _rss_mib("VmRSS")
    fn()
    return max(0.0, _rss_mib("VmHWM") - base)


def _inputs(spec):
    import torch

    dtype = getattr(torch, spec["dtype"])
    hq, hkv, d = spec["q_heads"], spec["kv_heads"], spec["head_dim"]
    L = spec["context"]
    Q = 1 if spec["mode"] == "decode" else L
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, hq, Q, d, generator=g, dtype=dtype)     # (B, Hq, Q, D)
    k = torch.randn(1, hkv, L, d, generator=g, dtype=dtype)    # (B, Hkv, L, D)
    v = torch.randn(1, hkv, L, d, generator=g, dtype=dtype)    # (B, Hkv, L, D)
    return q, k, v


def run_case(spec: dict) -> dict:
    """Run one case in this process: {'sdpa_extra', 'topk_extra', 'sdpa_s', 'topk_s', 'inputs_mib'}."""
    import torch
    import torch.nn.functional as F

    from gatherlens.ops.attention import topk_attention

    torch.set_num_threads(spec["threads"])
    q, k, v = _inputs(spec)
    causal = spec["causal"]
    gqa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    B, Hq, Q, D = q.shape
    folded = q.view(B, k.shape[1], Hq // k.shape[1] * Q, D)    # (B, Hkv, G, D) when Q = 1
    sdpa = gqa if causal else (lambda: F.scaled_dot_product_attention(folded, k, v))
    result = {"inputs_mib": _rss_mib("VmRSS")}
    with torch.inference_mode():
        if spec["top_k"] is None:
            result["sdpa_extra"] = _peak_extra(sdpa)
            return result
        topk = lambda: topk_attention(q, k, v, spec["top_k"], is_causal=causal, enable_gqa=True,
                                      share_selection=spec.get("share", False))
        result["topk_extra"] = _peak_extra(topk)
        sdpa()                                                  # warm-up
        fns = {"sdpa": sdpa, "topk": topk, **({"sdpa_gqa": gqa} if not causal else {})}
        result.update({f"{n}_s": s for n, s in timing.medians(timing.round_robin(fns, spec["repeats"])).items()})
    return result


# -- the driver --------------------------------------------------------------------------------

def _fresh(spec: dict) -> dict:
    return run_fresh("gatherlens.bench.attention", spec)


def run_grid(modes, contexts, top_ks, dtypes, repeats, threads, progress=None, share=(False, True)):
    rows = []
    for mode in modes:
        hq, hkv, d, causal, default_contexts = MODES[mode]
        for L in contexts or default_contexts:
            for dtype in dtypes:
                if contexts is None and (mode, L, dtype) in SKIP:
                    continue
                spec = dict(mode=mode, context=L, dtype=dtype, q_heads=hq, kv_heads=hkv, head_dim=d,
                            causal=causal, threads=threads, top_k=None,
                            repeats=repeats if repeats else _default_repeats(mode, L))
                base = _fresh(spec)
                for k, sh in ((k, sh) for sh in (share if mode == "decode" else (False,)) for k in top_ks):
                    r = _fresh(dict(spec, top_k=k, share=sh))
                    rows.append(Row(mode, L, dtype, k, hq, hkv, d, threads, r["sdpa_s"], r["topk_s"],
                                    r["topk_s"] / r["sdpa_s"], base["sdpa_extra"], r["topk_extra"],
                                    r["inputs_mib"], baseline="sdpa" if causal else "sdpa_folded",
                                    sdpa_gqa_s=r.get("sdpa_gqa_s", 0.0), share_selection=sh))
                    if progress:
                        progress(rows[-1])
    return rows


def _default_repeats(mode: str, L: int) -> int:
    """Timed calls per op: fewer where one call takes seconds (prefill 8K)."""
    if mode == "prefill":
        return 1 if L >= 8192 else 3
    return 5


def _ints(text):
    return tuple(int(x) for x in text.split(",") if x) if text else None


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}"


@click.command("attention")
@click.option("--mode", type=click.Choice(["decode", "prefill", "all"]), default="all", show_default=True)
@click.option("--context", help="comma-separated L values (default: decode 4096,32768,131072; "
                                "prefill 1024,4096,8192)")
@click.option("--top-k", "top_k", help="comma-separated k values (default 64,256,1024,2048)")
@click.option("--dtype", "dtypes", help="comma-separated dtypes (default float32,bfloat16)")
@click.option("--threads", type=Int(1, cpu_count()), default=2, show_default=True, help="torch threads in each case")
@click.option("--repeats", type=Int(1), default=None,
              help="timed calls per op; the median is reported (default: decode 5, prefill 3, "
                   "prefill at L >= 8K 1)")
@json_option("bench-attention.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json or --plot file")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also draw the ratios against the context (.png/.svg/.pdf)")
@click.option("--share/--no-share", default=True, show_default=True,
              help="decode also with share_selection=True (one key set per KV group)")
def command(mode, context, top_k, dtypes, threads, repeats, json_path, force, plot_path, share):
    """Time top-k attention against the strongest SDPA form (decode and prefill), with peak memory
    per fresh process."""
    from rich.console import Console

    check_json_path(json_path, force)
    check_plot_path(plot_path, force)
    dtypes = tuple(x for x in dtypes.split(",") if x) if dtypes is not None else DTYPES
    bad = [x for x in dtypes if x not in ("float32", "bfloat16", "float16", "float64")]
    if bad or not dtypes:
        raise click.BadParameter(f"{bad or dtypes!r}: choose from float32, bfloat16, float16, float64",
                                 param_hint="--dtype")
    contexts = tuple(positive_ints(context, "--context", "context", hi=MAX_CONTEXT)) if context is not None else ()
    ks = tuple(positive_ints(top_k, "--top-k", "k")) if top_k is not None else TOP_K
    if repeats is not None and repeats < 1:
        raise click.BadParameter("must be >= 1", param_hint="--repeats")
    if threads < 1:
        raise click.BadParameter("must be >= 1", param_hint="--threads")
    modes = ("decode", "prefill") if mode == "all" else (mode,)
    console = Console() if sys.stdout.isatty() else Console(width=140)  # no truncated cells in logs
    start = time.perf_counter()
    rows = run_grid(modes, contexts, ks, dtypes, repeats, threads, share=(False, True) if share else (False,),
                    progress=lambda r: console.log(f"{r.mode} L={r.context} {r.dtype} k={r.top_k}"
                                                   f"{' shared' if r.share_selection else ''}: "
                                                   f"x{r.ratio:.2f} of {r.baseline}"))
    console.print(_table(rows, threads))
    if plot_path is not None:
        plot_ratios(rows, plot_path, x="context", series=("mode", "top_k", "share_selection", "dtype"),
                    title=f"top-k attention / strongest SDPA ({threads} threads)", xlabel="context L",
                    force=force)
        console.print(f"wrote {plot_path}")
    import torch

    meta = {"torch": torch.__version__, "threads": threads, "batch": 1,
            "decode": "Q=1, is_causal=False, 32 q heads / 8 kv heads, D=128; baseline: SDPA with the KV "
                      "group's query heads folded, q (B, Hkv, G, D) against K (B, Hkv, L, D)",
            "prefill": "Q=L, causal, 9 q heads / 3 kv heads, D=64",
            "skipped": [list(s) for s in sorted(SKIP)] if contexts is None else [],
            "wall_s": time.perf_counter() - start}
    write_results(json_path, "attention", meta, rows, force=force)
    console.print(f"wrote {json_path}")


def _table(rows, threads: int):
    """The results as a rich table: times, ratio to the baseline, peak memory."""
    from rich.table import Table

    table = Table(title=f"top-k attention vs the strongest SDPA form ({threads} threads, median; ratio = "
                        "topk / baseline time, < 1 is faster; decode: SDPA with the KV group folded)")
    for col in ("mode", "L", "dtype", "k", "shared", "heads", "baseline", "base ms", "top-k ms", "ratio",
                "gqa SDPA ms", "SDPA +MiB", "top-k +MiB"):
        table.add_column(col, justify="left" if col in ("mode", "dtype", "baseline") else "right")
    for r in rows:
        table.add_row(r.mode, str(r.context), r.dtype, str(r.top_k), "yes" if r.share_selection else "",
                      f"{r.q_heads}/{r.kv_heads}x{r.head_dim}", r.baseline, _ms(r.sdpa_s), _ms(r.topk_s),
                      f"{r.ratio:.2f}", _ms(r.sdpa_gqa_s) if r.sdpa_gqa_s else "", f"{r.sdpa_extra_mib:.0f}",
                      f"{r.topk_extra_mib:.0f}")
    return table
