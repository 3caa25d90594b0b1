"""`gatherlens bench dist`: sparse decode over a KV cache split by sequence over 1, 2 and 4 ranks.

    gatherlens bench dist                                  # 128K context, budget 2048, 1/2/4 ranks
    gatherlens bench dist --context 32K --ranks 1 --ranks 2 --json dist.json

Shape as `bench decode`: batch 1, 32 query heads over 8 KV heads, head dim 128, float32, page 16.
Each world size is one set of gloo processes on this machine, ONE thread each: every rank holds
context / W tokens, and the step time is the slowest rank's (per step, then the median). With
one thread per rank on a shared CPU this shows what sharding costs (checks, three all_gathers, the
merge), not a speedup; a speedup needs a device per rank. Per rank it reports the bytes it sends
per step (the payload it puts into the collectives, and (W - 1) x that for a ring all-gather), the
memory of its part of the cache and its peak resident memory. The baseline, timed side by side in
the one-rank run, is `sparse_decode` on the whole cache in one process; "dense" rows read every
page (budget = context) with the same code.
"""
from __future__ import annotations

import resource
import statistics
import sys
import time
from dataclasses import dataclass

import click


from gatherlens.bench.decode import HEAD_DIM, KV_HEADS, Q_HEADS, parse_context
from gatherlens.bench.output import check_json_path, json_option, write_results
from gatherlens.ops.sparse.config import OP
from gatherlens.params import Int

RANKS = (1, 2, 4)


@dataclass
class Row:
    ranks: int
    mode: str              # "sparse" (budget) or "dense" (every page); "one process" = the baseline
    ms: float              # median step time, the slowest rank of each step
    x_one_process: float   # ms / the one-process sparse_decode (or dense) ms
    sent_bytes: int        # payload each rank puts into the step's collectives
    wire_bytes: int        # what a ring all-gather sends from each rank: (W - 1) x payload
    cache_mib: float       # this rank's part of the cache (K, V, page summaries), the largest rank
    rss_mib: float         # peak resident memory of the largest rank's process
    context: int
    budget: int


def _build(spec: dict, rank: int, world: int):
    """This rank's PagedKVCache (its part of a seeded sequence, filled in chunks) and the query."""
    import torch

    from gatherlens.dist.layout import split_sequence
    from gatherlens.ops.sparse import PagedKVCache

    L, P = spec["context"], spec["page_size"]
    lengths = split_sequence(L, world, P)
    n = lengths[rank]
    cache = PagedKVCache(1, KV_HEADS, HEAD_DIM, P, capacity=max(n, 1))
    g = torch.Generator().manual_seed(1000 + sum(lengths[:rank]))
    for s in range(0, n, 8192):  # no second full-size copy of K and V
        t = min(8192, n - s)
        cache.append(torch.randn(1, KV_HEADS, t, HEAD_DIM, generator=g),
                     torch.randn(1, KV_HEADS, t, HEAD_DIM, generator=g))  # (B, Hkv, t, D)
    q = torch.randn(1, Q_HEADS, 1, HEAD_DIM, generator=torch.Generator().manual_seed(7))  # (B, Hq, 1, D)
    return cache, q


def _timed(fn, group_barrier) -> float:
    group_barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_rank(spec: dict) -> dict:
    """One rank: times of every step per mode, bytes sent, cache and peak memory."""
    import torch
    import torch.distributed as dist

    from gatherlens.dist import count_traffic, sparse_decode_sharded
    from gatherlens.ops.sparse import sparse_decode

    rank, world = dist.get_rank(), dist.get_world_size()
    cache, q = _build(spec, rank, world)
    budgets = {"sparse": spec["budget"], "dense": spec["context"]}
    calls = {m: (lambda b=b: sparse_decode_sharded(q, cache, b)) for m, b in budgets.items()}
    if world == 1:  # the baseline, side by side: the one-process op on the same whole cache
        for m, b in budgets.items():
            calls[f"{m} one process"] = lambda b=b: sparse_decode(q, cache, b)
    out = {"times": {m: [] for m in calls}, "sent": {}}
    with torch.inference_mode():
        for m, fn in calls.items():  # warm-up; count one step's traffic
            with count_traffic() as traffic:
                fn()
            out["sent"][m] = (traffic.payload_bytes, traffic.wire_bytes)
        for _ in range(spec["repeats"]):
            for m, fn in calls.items():
                out["times"][m].append(_timed(fn, dist.barrier))
    summaries = cache.summaries
    out["cache_mib"] = (2 * cache.keys.numel() * cache.keys.element_size()
                        + summaries.numel() * summaries.element_size()) / 2**20
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def rows_of(spec: dict, world: int, ranks: list[dict], base: dict) -> list[Row]:
    """Per mode: the step time (slowest rank per step, median over steps) and the per-rank figures."""
    rows = []
    for mode in ("sparse", "dense"):
        steps = [max(r["times"][mode][i] for r in ranks) for i in range(spec["repeats"])]
        ms = statistics.median(steps) * 1e3
        sent, wire = ranks[0]["sent"][mode]
        rows.append(Row(world, mode, ms, ms / base[mode], sent, wire, max(r["cache_mib"] for r in ranks),
                        max(r["rss_mib"] for r in ranks), spec["context"], spec["budget"]))
    return rows


def _run(spec: dict, worlds) -> list[Row]:
    from gatherlens.dist import run_ranks

    rows, base = [], {}
    for world in sorted(set(worlds) | {1}):  # the one-rank run holds the baseline
        ranks = run_ranks(run_rank, world, spec, timeout=spec["timeout"], threads=1)
        if world == 1:
            one = ranks[0]
            for mode in ("sparse", "dense"):
                base[mode] = statistics.median(one["times"][f"{mode} one process"]) * 1e3
                rows.append(Row(0, f"{mode} one process", base[mode], 1.0, 0, 0, one["cache_mib"],
                                one["rss_mib"], spec["context"], spec["budget"]))
        if world in worlds:
            rows += rows_of(spec, world, ranks, base)
    return rows


@click.command("dist")
@click.option("--context", default="128K", show_default=True, help="KV cache length: 32K, 131072, ...")
@click.option("--budget", type=Int(1), default=OP.budget, show_default=True,
              help="tokens sparse decode reads per KV head (default: sparse_decode's, the OP preset)")
@click.option("--page-size", type=Int(1), default=OP.page_size, show_default=True,
              help="tokens per page (the OP preset's)")
@click.option("--ranks", "worlds", type=Int(1, 64), multiple=True, help="world sizes, repeatable (default 1, 2, 4)")
@click.option("--repeats", type=Int(1), default=10, show_default=True,
              help="timed steps per mode; the median is reported")
@click.option("--timeout", type=Int(1), default=1800, show_default=True, help="seconds before every rank is stopped")
@json_option("bench-dist.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def command(context, budget, page_size, worlds, repeats, timeout, json_path, force):
    """Time sparse decode over a sequence-sharded KV cache on 1, 2 and 4 gloo ranks (one thread each)."""
    check_json_path(json_path, force)
    for name, value in (("--budget", budget), ("--page-size", page_size), ("--repeats", repeats)):
        if value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=name)
    worlds = tuple(worlds) or RANKS
    if any(w < 1 or w > 64 for w in worlds):
        raise click.BadParameter(f"world sizes must be in [1, 64], got {list(worlds)}", param_hint="--ranks")
    spec = dict(context=parse_context(context), budget=budget, page_size=page_size, repeats=repeats,
                timeout=timeout)
    start = time.perf_counter()
    rows = _run(spec, worlds)
    _print(rows, spec)
    import torch

    meta = {"torch": torch.__version__, "backend": "gloo", "threads_per_rank": 1, "batch": 1,
            "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "float32",
            "context": spec["context"], "budget": budget, "page_size": page_size, "repeats": repeats,
            "baseline": "sparse_decode on the whole cache in one process (ranks = 0 rows)",
            "wall_s": time.perf_counter() - start}
    write_results(json_path, "dist", meta, rows, force=force)
    print(f"wrote {json_path}")


def _print(rows: list[Row], spec: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sharded decode: {spec['context']} tokens, batch 1, {Q_HEADS} q / {KV_HEADS} kv heads, "
                        f"D={HEAD_DIM}, budget {spec['budget']}, page {spec['page_size']}, 1 thread per rank")
    for col in ("ranks", "mode", "ms", "x one process", "sent B/rank", "ring B/rank", "cache MiB/rank",
                "peak RSS MiB"):
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True)
    for r in rows:
        table.add_row(str(r.ranks or "-"), r.mode, f"{r.ms:.4g}", f"{r.x_one_process:.2f}", str(r.sent_bytes),
                      str(r.wire_bytes), f"{r.cache_mib:.0f}", f"{r.rss_mib:.0f}")
    Console(width=None if sys.stdout.isatty() else 140).print(table)
