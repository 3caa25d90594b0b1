"""`gatherlens bench embedding`: every lookup method against F.embedding and a plain copy.

    gatherlens bench embedding                                  # the full grid (~10 min, 2 cores)
    gatherlens bench embedding --vocab 49152 --dim 576 --tokens 4096 --threads 1 --json out.json

Each case (V, d, tokens, dtype, threads) times, round-robin so noise hits all alike, the forward of
every method, the default with `out=` and with bounds="off" (the check's cost), and two copies of the same bytes: into a fresh tensor
(`clone`: what any op that returns a new large tensor pays) and into an existing one (`copy_`: the
memory limit). Then the backward (autograd.grad to the table) of F.embedding, the default and the
methods named by --backward-methods (each with its own autograd: index_add_, scatter_add, ...).
GB/s counts the N rows read and written (2 * N * d * itemsize). `xF.emb` is time / F.embedding's
(<= 1.05 is the target for the default); `%copy` is the copy's time / this time, i.e. bandwidth as a
fraction of the copy's.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click


from gatherlens.bench import timing
from gatherlens.bench.output import check_json_path, human_seconds, json_option, write_results
import torch
import torch.nn.functional as F

from gatherlens.bench.plot import check_plot_path, plot_ratios
from gatherlens.ops.embedding import METHODS, embedding_lookup, get_embeddings
from gatherlens.params import Int, cpu_count, positive_ints

GRID = {"vocab": (49152, 128256), "dim": (576, 4096), "tokens": (1, 64, 4096, 32768),
        "dtype": ("float32", "bfloat16"), "threads": (1, 2)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}
ONE_HOT_LIMIT = 1 << 26  # multiply-adds (N * V * d) of the one-hot matmul; larger cases skip it
NAIVE_LIMIT = 64  # tokens; the loop reference is timed only this small


@dataclass
class Row:
    vocab: int
    dim: int
    tokens: int
    dtype: str
    threads: int
    direction: str  # "forward" | "backward"
    op: str
    median_s: float
    gbps: float
    ratio_embedding: float  # time / F.embedding's time, same direction
    copy_fresh_fraction: float  # copy-into-fresh time / time
    copy_into_fraction: float  # copy-into-existing time / time


def _medians(fns: dict, repeats: int) -> dict:
    """Median seconds per op, sampled round-robin. Ops slower than 0.1 s: their warm-up call is
    their first sample and they get 3 samples (2 above 0.5 s): the grid must finish in minutes."""
    samples = {}
    for name, fn in fns.items():  # warm-up
        once = timing.call_seconds(fn)
        samples[name] = [once] if once > 0.1 else []
    for round_ in range(repeats):
        for name, fn in fns.items():
            first = samples[name][0] if samples[name] else 0.0
            if len(samples[name]) >= (2 if first > 0.5 else 3 if first > 0.1 else repeats):
                continue
            samples[name].append(timing.sample_seconds(fn, max_calls=20000, first_counts=True))
    return timing.medians(samples)


def _forward_ops(table, ids, methods):
    vocab, dim = table.shape
    n = ids.numel()
    source = torch.empty(n, dim, dtype=table.dtype).copy_(table[:1].expand(n, dim)) if n else table[:0]
    existing = torch.empty(n, dim, dtype=table.dtype)
    out = torch.empty(n, dim, dtype=table.dtype)
    ops = {"copy_fresh": source.clone, "copy_into": lambda: existing.copy_(source),
           "F.embedding": lambda: F.embedding(ids, table)}
    for name in methods:
        if name == "one_hot" and n * vocab * dim > ONE_HOT_LIMIT:
            continue
        if name == "naive" and n > NAIVE_LIMIT:
            continue
        ops[name] = lambda name=name: embedding_lookup(ids, table, method=name)
    ids2 = ids.view(1, n)                                       # (1, N): the article's (B, S) form
    ops["get_embeddings"] = lambda: get_embeddings(ids2, table)
    ops["fast out="] = lambda: embedding_lookup(ids, table, out=out)
    ops["fast unchecked"] = lambda: embedding_lookup(ids, table, bounds="off")  # the check's cost
    return ops


def _backward_ops(table, ids, methods):
    grad = torch.ones(*ids.shape, table.shape[1], dtype=table.dtype)

    def run(lookup):
        def once():
            result = lookup()
            return torch.autograd.grad(result, table, grad)
        return once

    ops = {"F.embedding": run(lambda: F.embedding(ids, table))}
    for name in methods:
        if name == "one_hot" and ids.numel() * table.numel() > ONE_HOT_LIMIT:
            continue
        if name == "naive" and ids.numel() > NAIVE_LIMIT:
            continue
        ops[name] = run(lambda name=name: embedding_lookup(ids, table, method=name))
    return ops


def _rows(case, direction, medians, copy, nbytes):
    base = medians["F.embedding"]
    return [Row(*case, direction, op, t, nbytes / t / 1e9, t / base, copy["copy_fresh"] / t, copy["copy_into"] / t)
            for op, t in medians.items()]


def run_grid(vocab, dim, tokens, dtypes, threads, repeats, methods, backward_methods=("fast",), progress=None):
    rows = []
    for v in vocab:
        for d in dim:
            for dtype_name in dtypes:
                dtype = DTYPES[dtype_name]
                table = torch.empty(v, d, dtype=dtype).uniform_(-1, 1)  # (V, d)
                for n in tokens:
                    ids = torch.randint(0, v, (n,))  # (N,)
                    for t in threads:
                        torch.set_num_threads(t)
                        case = (v, d, n, dtype_name, t)
                        reps = repeats if n * d < (1 << 24) else max(3, repeats // 2)
                        fwd = _medians(_forward_ops(table, ids, methods), reps)
                        nbytes = 2 * n * d * table.element_size()
                        rows += _rows(case, "forward", fwd, fwd, nbytes)
                        if backward_methods:
                            table.requires_grad_(True)
                            bwd = _medians(_backward_ops(table, ids, backward_methods), max(3, reps // 2))
                            table.requires_grad_(False)
                            rows += _rows(case, "backward", bwd, fwd, nbytes)
                        if progress:
                            progress(case, rows)
                del table
    return rows


def _ints(text, hint: str, hi: int | None = None):
    """A given list of positive ints (the one rule, gatherlens.params); None when the option was not given."""
    return tuple(positive_ints(text, hint, hint.removeprefix("--"), hi=hi)) if text is not None else None


@click.command("embedding")
@click.option("--vocab", help="comma-separated V values (default 49152,128256)")
@click.option("--dim", help="comma-separated d values (default 576,4096)")
@click.option("--tokens", help="comma-separated token counts (default 1,64,4096,32768)")
@click.option("--dtype", "dtypes", help="comma-separated dtypes (default float32,bfloat16)")
@click.option("--threads", help="comma-separated torch thread counts (default 1,2)")
@click.option("--methods", default="fast,index_select,gather,indexing,one_hot,naive",
              show_default=True, help="forward methods to time (F.embedding and copies always run)")
@click.option("--backward-methods", default="fast", show_default=True,
              help="methods whose backward is timed (F.embedding's always is); '' for none")
@click.option("--repeats", type=Int(1), default=5, show_default=True, help="samples per op; the median is reported")
@click.option("--no-backward", is_flag=True, help="time the forward only")
@json_option("bench-embedding.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json or --plot file")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also draw the default's and get_embeddings' time / F.embedding's against N")
def command(vocab, dim, tokens, dtypes, threads, methods, backward_methods, repeats, no_backward, json_path,
            force, plot_path):
    """Time the embedding lookup methods against F.embedding (the baseline) and a copy of the same bytes."""
    from rich.console import Console

    check_json_path(json_path, force)
    check_plot_path(plot_path, force)
    methods = tuple(m for m in methods.split(",") if m)
    backward_methods = () if no_backward else tuple(m for m in backward_methods.split(",") if m)
    unknown = [m for m in methods + backward_methods if m not in METHODS]
    if unknown or not methods:
        raise click.BadParameter(f"unknown method(s) {unknown}; choose from {list(METHODS)}", param_hint="--methods")
    dtypes = tuple(x for x in dtypes.split(",") if x) if dtypes is not None else GRID["dtype"]
    bad = [x for x in dtypes if x not in DTYPES]
    if bad or not dtypes:
        raise click.BadParameter(f"unknown dtype(s) {bad}; choose from {list(DTYPES)}", param_hint="--dtype")
    if repeats < 1:
        raise click.BadParameter("must be >= 1", param_hint="--repeats")
    most = {"--vocab": 1 << 31, "--dim": 1 << 20, "--tokens": 1 << 31, "--threads": cpu_count()}
    given = {k: _ints(v, f"--{k}", most[f"--{k}"]) for k, v in (("vocab", vocab), ("dim", dim), ("tokens", tokens),
                                                              ("threads", threads))}
    grid = {k: v or GRID[k] for k, v in given.items()}
    console = Console()
    if not console.is_terminal:
        console = Console(width=132)
    before = torch.get_num_threads()
    meta = {"torch": torch.__version__, "threads_before": before, "repeats": repeats, "complete": False}

    written = []  # once this run has written --json, later writes replace its own file

    def save(case, rows):  # after every case, so an interrupted run keeps what it measured
        console.log("done V=%d d=%d N=%d %s threads=%d" % case)
        write_results(json_path, "embedding", meta, rows, force=force or bool(written))
        written.append(case)

    try:
        rows = run_grid(grid["vocab"], grid["dim"], grid["tokens"], dtypes, grid["threads"], repeats, methods,
                        backward_methods, progress=save)
    finally:
        torch.set_num_threads(before)
    console.print(_table(rows))
    if plot_path is not None:
        mine = [r for r in rows if r.op in ("fast", "get_embeddings")]
        plot_ratios(mine, plot_path, x="tokens", y="ratio_embedding", xlabel="N (ids per call)",
                    series=("op", "direction", "vocab", "dim", "dtype", "threads"),
                    title="embedding lookup / F.embedding (the baseline)", force=force)
        console.print(f"wrote {plot_path}")
    meta["complete"] = True
    write_results(json_path, "embedding", meta, rows, force=force or bool(written))
    console.print(f"wrote {json_path}")


def _table(rows):
    """The results as a rich table, the default in bold."""
    from rich.table import Table

    table = Table(title="embedding lookup: median time, GB/s (2*N*d*itemsize), vs F.embedding (the "
                        "baseline) and vs a copy")
    for col in ("V", "d", "N", "dtype", "thr", "dir", "op", "median", "GB/s", "xF.emb", "%copy fresh", "%copy into"):
        table.add_column(col, justify="left" if col in ("dtype", "dir", "op") else "right")
    for r in rows:
        style = "bold" if r.op == "fast" else ("dim" if r.op.startswith("copy") else None)
        table.add_row(str(r.vocab), str(r.dim), str(r.tokens), SHORT.get(r.dtype, r.dtype), str(r.threads),
                      r.direction[:3], r.op,
                      human_seconds(r.median_s), f"{r.gbps:.1f}", f"{r.ratio_embedding:.2f}",
                      f"{100 * r.copy_fresh_fraction:.0f}%", f"{100 * r.copy_into_fraction:.0f}%", style=style)
    return table

