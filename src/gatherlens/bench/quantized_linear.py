"""`gatherlens bench qlinear`: linears held as GGUF blocks, every route against F.linear on float32.

    gatherlens bench qlinear                              # SmolLM2's blocks if installed; M = 1 and 64
    gatherlens bench qlinear --gguf path/to/model.gguf --rows 1 --json qlinear.json
    gatherlens bench qlinear --gguf synthetic             # gguf's quantizer on normal data instead
    gatherlens bench qlinear --gguf synthetic --qtype Q5_0 --routes q8act,dequant --rows 32,256,1024
                                                          # the prefill's crossover (a record's gemm_rows)

One process, side by side. Shapes: SmolLM2-135M's four Q4_1 linears (N x K: 576x576 for q/o,
192x576 for k/v, 1536x576 for gate/up, 576x1536 for down), the fused q|k|v and gate|up, and the tied
Q8_0 head (49152x576), read from layer 0 of the file. Each (shape, M) times every route round-robin:

- hot: one weight, called again and again (the weight stays in cache: a micro-benchmark's figure);
- cold: a loop over `--copies` separate copies of the weight (30 = SmolLM2's layers, fewer for the head,
  capped at --cold-mib of weights), so each call reads its weight from memory, as a decode step does.

`x f32` is time / float32 F.linear's (route "float32": today's way) in the same mode. Errors are
against the reference (blocks -> float32 -> F.linear, x ~ N(0, 1)): the largest |y - ref|, and
||y - ref|| / ||ref||. Figures on a shared machine are rough: rerun quietly before quoting them.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import partial

import click

import torch

from gatherlens.bench import timing
from gatherlens.bench.output import check_json_path, human_seconds, json_option, write_results
from gatherlens.ops.quant.products.linear import LinearConfig, pack_linear, quantized_linear
from gatherlens.ops.quant.products.linear_naive import naive_quantized_linear
from gatherlens.ops.quant.formats.sizes import SIZES
from gatherlens.params import Int, Real, cpu_count, positive_ints

# name -> (tensors of layer 0 side by side along N, qtype when synthetic, N, K)
SHAPES = {
    "q/o": (("blk.0.attn_q.weight",), "Q4_1", 576, 576),
    "k/v": (("blk.0.attn_k.weight",), "Q4_1", 192, 576),
    "gate/up": (("blk.0.ffn_gate.weight",), "Q4_1", 1536, 576),
    "down": (("blk.0.ffn_down.weight",), "Q4_1", 576, 1536),
    "qkv": (("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"), "Q4_1", 960, 576),
    "gate|up": (("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"), "Q4_1", 3072, 576),
    "head": (("token_embd.weight",), "Q8_0", 49152, 576),
}
LINEAR_ROUTES = ("float32", "int4", "q8act", "bf16", "int8_row", "dequant", "int4_f32")
HEAD_ROUTES = ("float32", "int4", "q8act", "bf16", "int8_row", "int4_requant", "dequant")
SLOW = {"int4_f32": 1}  # routes timed only up to this many rows (a scalar loop: ~10x the others)
PER_LAYER = {"q/o": 2, "k/v": 2, "gate/up": 2, "down": 1}  # SmolLM2's seven linears a layer


@dataclass
class Row:
    shape: str
    n: int
    k: int
    qtype: str
    rows: int  # M, rows of x
    route: str
    hot_s: float
    cold_s: float
    copies: int
    ratio_hot: float  # hot_s / float32's hot_s
    ratio_cold: float
    max_abs_err: float
    rel_err: float
    max_abs_ref: float
    packed_mib: float  # what the route keeps beside the blocks (dequant: nothing)
    threads: int
    hot_min_s: float  # the fastest sample: on a busy machine, nearer to a quiet run than the median
    cold_min_s: float


def _synthetic(qtype: str, n: int, k: int) -> torch.Tensor:
    """gguf's own quantizer on N(0, 0.05) weights: (n, row bytes) uint8; where gguf has none (IQ4_NL,
    the K-quants), random codes with every fp16 field (scales, mins) a small finite half."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import QuantError, quantize

    from gatherlens.ops.quant import FORMATS

    rng = np.random.default_rng(0)
    try:
        return torch.from_numpy(quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32),
                                         GGMLQuantizationType[qtype]))
    except (NotImplementedError, QuantError):
        pass
    fmt = FORMATS[qtype]
    raw = rng.integers(0, 256, (n, k // fmt.weights, fmt.block_bytes), dtype=np.uint8)  # (n, nb, bytes)
    for field in (f for f in fmt.fields if f.kind == "fp16"):
        raw[:, :, field.offset:field.end] = (rng.standard_normal((n, k // fmt.weights, 1)) * 0.003
                                             ).astype(np.float16).view(np.uint8)
    return torch.from_numpy(raw.reshape(n, -1))  # (n, row bytes)


def load_blocks(source: str | None, names: tuple[str, ...], qtype: str | None = None) -> dict:
    """{shape name: (raw blocks, qtype)} from a .gguf (a path or "smollm2") or synthetic (None): each
    shape's own format, or `qtype` for all of them."""
    if source is None:
        return {s: (_synthetic(qtype or SHAPES[s][1], *SHAPES[s][2:]), qtype or SHAPES[s][1]) for s in names}
    from gatherlens.models.files.registry import resolve
    from gatherlens.ops.quant import QuantizedTable

    path = resolve(source).path
    out = {}
    for s in names:
        tables = [QuantizedTable.from_gguf(path, t) for t in SHAPES[s][0]]
        out[s] = (torch.cat([t.raw for t in tables]), tables[0].qtype)  # (N, row bytes): fused along N
    return out


def _timers(weights: list, x: torch.Tensor):
    """(hot, cold): one call on weights[0]; one call on each copy, per call."""
    def hot():
        quantized_linear(x, weights[0])

    def cold():
        for w in weights:
            quantized_linear(x, w)
    return hot, cold, len(weights)


def _errors(x, weight) -> tuple[float, float, float]:
    y, ref = quantized_linear(x, weight).double(), naive_quantized_linear(x, weight).double()  # (M, N)
    diff = y - ref  # (M, N)
    return diff.abs().max().item(), (diff.norm() / ref.norm()).item(), ref.abs().max().item()


def _copies(raw, qtype, route, copies: int, cold_mib: float) -> list:
    """`copies` weights packed from separate copies of the blocks, fewer if they pass cold_mib."""
    first = pack_linear(raw, qtype, LinearConfig(route, prefill_rows=None))
    size = max(first.nbytes(), raw.numel())  # bytes a call reads: packed, or the blocks (dequant)
    count = max(1, min(copies, int(cold_mib * 2**20 // size)))
    return [first] + [pack_linear(raw.clone(), qtype, LinearConfig(route, prefill_rows=None))
                      for _ in range(count - 1)]


def time_case(shape, raw, qtype, rows, routes, copies, cold_mib, repeats, threads) -> list[Row]:
    """Every route on one (shape, M): medians of `repeats` round-robin samples, hot and cold."""
    routes = [r for r in routes if rows <= SLOW.get(r, rows)]
    elems, nbytes = SIZES[qtype]
    x = torch.randn(rows, raw.shape[1] // nbytes * elems, generator=torch.Generator().manual_seed(rows))  # (M, K)
    timers, info = {}, {}
    for route in routes:
        weights = _copies(raw, qtype, route, copies, cold_mib)
        hot, cold, count = _timers(weights, x.to(weights[0].activation_dtype))  # as the decode step feeds it
        timers[route] = (hot, cold, count)
        info[route] = (_errors(x, weights[0]), weights[0].nbytes() / 2**20, weights[0].shape)
    fns = {(r, mode): fn for r, (hot, cold, _) in timers.items() for mode, fn in (("hot", hot), ("cold", cold))}
    drawn = timing.round_robin(fns, repeats, sample=partial(timing.sample_seconds, max_calls=2000))
    samples = {r: (drawn[r, "hot"], [s / count for s in drawn[r, "cold"]]) for r, (_, _, count) in timers.items()}
    medians = {r: (statistics.median(h), statistics.median(c)) for r, (h, c) in samples.items()}
    base = medians.get("float32", next(iter(medians.values())))
    return [Row(shape, info[r][2][0], info[r][2][1], qtype, rows, r, hot, cold, timers[r][2],
                hot / base[0], cold / base[1], *info[r][0], info[r][1], threads,
                min(samples[r][0]), min(samples[r][1]))
            for r, (hot, cold) in medians.items()]


def per_token(rows: list[Row], route: str, mode: str) -> float | None:
    """Seconds of SmolLM2's 30 x 7 linears at M = 1 on `route` (mode: cold, hot, cold_min, hot_min)."""
    times = {r.shape: getattr(r, f"{mode}_s") for r in rows if r.route == route and r.rows == 1}
    if not all(s in times for s in PER_LAYER):
        return None
    return 30 * sum(count * times[s] for s, count in PER_LAYER.items())


def _ints(text: str) -> tuple[int, ...]:
    """--rows' positive ints (the one rule, gatherlens.params)."""
    return tuple(positive_ints(text, "--rows", "row count", hi=1 << 20))


@click.command("qlinear")
@click.option("--gguf", "source", default="smollm2", show_default=True,
              help="a .gguf path or a model name whose layer-0 blocks to use; 'synthetic': gguf's quantizer")
@click.option("--shapes", default=",".join(SHAPES), show_default=True, help="comma-separated shape names")
@click.option("--qtype", default=None, help="with --gguf synthetic: every shape in this block format "
              "(default: each its own, Q4_1 and the Q8_0 head)")
@click.option("--rows", "rows_text", default="1,64", show_default=True, help="M values: rows of x")
@click.option("--routes", default=",".join(LINEAR_ROUTES), show_default=True, help="routes for the Q4_1 linears")
@click.option("--head-routes", default=",".join(HEAD_ROUTES), show_default=True, help="routes for the head")
@click.option("--copies", type=Int(1), default=30, show_default=True, help="weight copies in the cold loop")
@click.option("--cold-mib", default=256.0, show_default=True, type=Real(0, 1 << 20, min_open=True),
              help="cap on one route's copies, MiB")
@click.option("--repeats", type=Int(1), default=7, show_default=True,
              help="round-robin samples; the median is reported")
@click.option("--threads", type=Int(1, cpu_count()), default=2, show_default=True, help="torch threads")
@json_option("bench-qlinear.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def command(source, shapes, qtype, rows_text, routes, head_routes, copies, cold_mib, repeats, threads, json_path,
            force):
    """Time quantized linears (GGUF blocks) against F.linear on float32, hot and from memory."""
    from rich.console import Console

    check_json_path(json_path, force)
    names, m_values = _options(shapes, rows_text, routes, head_routes, copies, repeats, threads)
    _check_qtype(qtype, source)
    console = Console() if Console().is_terminal else Console(width=150)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    meta = {"torch": torch.__version__, "source": source, "qtype": qtype, "threads": threads, "copies": copies,
            "repeats": repeats, "complete": False}
    rows = []
    try:
        blocks = load_blocks(None if source == "synthetic" else source, names, qtype)
        for name in names:
            raw, fmt = blocks[name]
            for m in m_values:
                chosen = (head_routes if name == "head" else routes).split(",")
                rows += time_case(name, raw, fmt, m, chosen, copies, cold_mib, repeats, threads)
                console.log(f"done {name} M={m}")
                write_results(json_path, "qlinear", meta, rows, force=force or (name, m) != (names[0], m_values[0]))
    finally:
        torch.set_num_threads(before)
    console.print(_table(rows))
    _print_per_token(console, rows)
    meta["complete"] = True
    write_results(json_path, "qlinear", meta, rows, force=force or bool(names and m_values))  # replaces its own
    console.print(f"wrote {json_path}")


def _options(shapes, rows_text, routes, head_routes, copies, repeats, threads):
    from gatherlens.ops.quant.products.matmul import ROUTES

    names = tuple(s for s in shapes.split(",") if s)
    unknown = [s for s in names if s not in SHAPES]
    if unknown or not names:
        raise click.BadParameter(f"unknown shape(s) {unknown}; choose from {list(SHAPES)}", param_hint="--shapes")
    for hint, text in (("--routes", routes), ("--head-routes", head_routes)):
        bad = [r for r in text.split(",") if r not in ROUTES]
        if bad:
            raise click.BadParameter(f"unknown route(s) {bad}; choose from {list(ROUTES)}", param_hint=hint)
    for hint, value in (("--copies", copies), ("--repeats", repeats), ("--threads", threads)):
        if value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=hint)
    return names, _ints(rows_text)


def _check_qtype(qtype: str | None, source: str) -> None:
    from gatherlens.ops.quant import FORMATS

    if qtype is not None and (source != "synthetic" or qtype not in FORMATS):
        raise click.BadParameter(f"{qtype!r}: --qtype takes a block format ({', '.join(FORMATS)}) with --gguf "
                                 f"synthetic", param_hint="--qtype")


def _print_per_token(console, rows) -> None:
    for route in dict.fromkeys(r.route for r in rows):
        ms = [per_token(rows, route, mode) for mode in ("cold", "hot", "cold_min", "hot_min")]
        if ms[0] is not None:
            console.print("SmolLM2's 210 linears at M = 1, route %s: %.1f ms from memory, %.1f ms hot "
                          "(fastest samples: %.1f, %.1f)" % (route, *(1e3 * t for t in ms)))


def _table(rows):
    from rich.table import Table

    table = Table(title="quantized linear: median per call; x f32 = time / float32 F.linear's (same mode)")
    for col in ("shape", "N x K", "q", "M", "route", "hot", "x f32", "cold", "x f32 ", "copies",
                "max|err|", "rel err", "MiB"):
        table.add_column(col, justify="left" if col in ("shape", "q", "route") else "right")
    for r in rows:
        table.add_row(r.shape, f"{r.n}x{r.k}", r.qtype, str(r.rows), r.route, human_seconds(r.hot_s),
                      f"{r.ratio_hot:.2f}", human_seconds(r.cold_s), f"{r.ratio_cold:.2f}", str(r.copies),
                      f"{r.max_abs_err:.2e}", f"{r.rel_err:.1e}", f"{r.packed_mib:.1f}",
                      style="bold" if r.route == "int4" else None)
    return table

