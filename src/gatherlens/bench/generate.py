"""`gatherlens bench generate`: a real model's decode speed inside `generate`, dense against sparse.

    gatherlens bench generate                                  # SmolLM2, 2K .. 32K, ~10 min on 2 cores
    gatherlens bench generate --context 8K --budgets 512 --tokens 4 --rounds 2 --json g.json
    gatherlens bench generate --ablation                       # also HF's own layers over the paged cache

For every context (each in a fresh process) the same model decodes `--tokens` greedy tokens with
`model.generate` after a filled cache, round-robin over the methods (noise hits all alike; the
median round is reported):

- hf:         transformers' default: DynamicCache (torch.cat of the whole cache every step) + SDPA
- paged:      the best dense path here: gatherlens' paged cache (appends in place, no copy) and
              dense attention over it with each KV group's query heads folded into one call
- sparse-B:   page-selected sparse decoding reading B tokens per KV head (use_sparse_decoding's
              default settings); below the budget it is the dense path
- quantized-dense, quantized-sparse-B: the same two paths on `gatherlens.load(name, quantized=True)`
  (the model running from its GGUF blocks), in a fresh process of its own
- llama.cpp: llama-cpp-python on the same GGUF with the same threads (--llama-python or
  $GATHERLENS_LLAMA_PYTHON; skipped with a note otherwise), prefilling the same prompt tokens, in a
  fresh process after ours (bench/llamacpp_case.py; x llama.cpp = its ms / ms)
- cli, cli/pages: the loop `gatherlens generate` runs (streaming, detokenizing; the page trace off,
  then on), on the quantized model where there is one, after its real prefill of the same prompt
  tokens, in a fresh process of its own (bench/generate_cli.py; off with --no-cli)
- with --ablation, paged/hf-layers and sparse-1024/hf-layers: the same over transformers' own
  decoder layers and output projection (step="hf"), to show what the planned decode step wins; and
  sparse-1024/hf-head: the planned step with F.linear's output projection (what the transposed head wins)

How the caches are filled: a short prefix of real text (256 tokens) is prefilled once; each
layer's keys and values are tiled to the context length and written into the DynamicCache and
the paged cache directly (decode cost depends on the cache's size, not on what it holds). Past
the model's trained positions (8K for SmolLM2) the text is meaningless but the cost is real: those
rows are speed only. Memory: each case's peak resident set (its process) and what loading the model
added to it. "attention" is the time of the 30 layers' cache appends and attention calls
alone, timed on the same caches; "share" is its part of a step.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click


from gatherlens.bench.fresh import run_fresh
from gatherlens.bench.generate_peers import gguf_of, llama_python, quantized_note, run_llamacpp
from gatherlens.bench.llamacpp_case import rss_mb
from gatherlens.bench.output import (
    check_causal_model, check_json_path, check_output, json_option, write_results,
)
from gatherlens.bench.plot import save_figure
from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse.geometry import ceil_div
from gatherlens.params import Int, cpu_count
from gatherlens.params import budget_list as budgets_of  # make_plan takes a `budget_list`

CONTEXTS = ("2K", "4K", "8K", "16K", "32K")
BUDGETS = (512, 1024, 2048)
PREFIX = 256
PREFIX_CHARS = 16 * PREFIX  # characters encoded for the PREFIX tokens (real_prefix)
TARGETS = {4096: 1.3, 8192: 2.0, 32768: 3.0}  # sparse over HF dense, issue 10
LLAMA_TARGETS = {4096: 1 / 1.3, 8192: 1.0, 32768: 2.5}  # quantized sparse over llama.cpp, issue 18
CLI_TARGETS = {512: 1.0, 2048: 1.0, 4096: 1.5, 8192: 2.0, 32768: 4.5}  # the cli row over llama.cpp, issue 27
CLI_SLACK = 1.05  # the cli row's ms within 5% of the bench's quantized sparse row (same budget), issue 27
LLAMA = "llama.cpp"
CLI, CLI_PAGES = "cli", "cli/pages"  # the loop of `gatherlens generate`, page trace off / on (bench/generate_cli.py)


@dataclass
class Method:
    name: str
    kind: str               # "hf" or "paged"
    budget: int | str | None = None  # tokens, "auto" or None (dense)
    lean: bool = True       # the decode-step table's fastest row (False: step="hf", transformers' layers)
    head: bool = True       # the head's transposed copy (models/runtime/head.py) in the planned step


@dataclass
class Row:
    context: int
    method: str
    ms: float               # median milliseconds per generated token (wall)
    tokens_per_s: float
    cpu_ms: float           # process CPU time per token (all threads)
    speedup: float          # hf ms / ms, same context, same rounds
    attention_ms: float | None     # cache appends + attention calls of every layer, per step
    attention_share: float | None  # attention_ms / ms (None for llama.cpp: not split)
    budget: int | str | None
    lean: bool
    speed_only: bool        # past the model's trained positions
    threads: int
    case: str = "float"     # the process it ran in: "float", "quantized" or "llama.cpp"
    rss_mb: float = 0.0     # that process's peak resident memory
    model_mb: float = 0.0   # what loading the model added to its resident memory
    x_llama: float | None = None  # llama.cpp ms / ms, same context, same run


def methods(budgets, ablation: bool) -> list[Method]:
    """hf, paged, one sparse method per budget (and the hf-layers variants with ablation)."""
    out = [Method("hf", "hf"), Method("paged", "paged")]
    out += [Method(f"sparse-{b}", "paged", b) for b in budgets]
    if ablation:
        b = 1024 if 1024 in budgets else budgets[0]
        out += [Method("paged/hf-layers", "paged", None, False), Method(f"sparse-{b}/hf-layers", "paged", b, False),
                Method(f"sparse-{b}/hf-head", "paged", b, True, False)]
    return out


def quantized_methods(budgets) -> list[Method]:
    """Our dense and sparse paths on the quantized model (its own fresh process)."""
    return [Method("quantized-dense", "paged")] + [Method(f"quantized-sparse-{b}", "paged", b) for b in budgets]


def cli_methods(budget: int) -> list[Method]:
    """The command's loop with the page trace off and on, at `budget` (bench/generate_cli.py runs them)."""
    return [Method(CLI, "cli", budget), Method(CLI_PAGES, "cli", budget)]


# -- inside the fresh process ----------------------------------------------------------------

def run_case(spec: dict) -> dict:
    """Load the model (quantized with spec["quantized"]), fill the caches to spec["context"], time
    every method: {"wall": {name: s}, ...}; with spec["prompt"] also the prompt tokens (for llama.cpp)."""
    import resource

    import torch

    from gatherlens.models import load

    torch.set_num_threads(spec["threads"])
    before = rss_mb()
    lm = load(spec["model"], quantized=True) if spec.get("quantized") else load(spec["model"])
    model_mb = rss_mb() - before
    ms = [Method(**m) for m in spec["methods"]]
    hf_cache, paged_cache, ids = fill_caches(lm, spec["context"], spec["tokens"], any(m.kind == "hf" for m in ms))
    wall = {m.name: [] for m in ms}
    cpu = {m.name: [] for m in ms}
    with torch.inference_mode():
        for m in ms:  # warm-up: allocations, the first step of each path
            _generate(lm.model, m, ids, hf_cache, paged_cache, 2, spec["context"])
        for r in range(spec["rounds"]):
            for m in ms[r % len(ms):] + ms[:r % len(ms)]:  # rotate who goes first
                w, c = _generate(lm.model, m, ids, hf_cache, paged_cache, spec["tokens"], spec["context"])
                wall[m.name].append(w)
                cpu[m.name].append(c)
        attn = {m.name: attention_ms(lm.model, m, hf_cache, paged_cache, spec["context"]) for m in ms}
        prof = {m.name: profile_step(lm.model, m, ids, hf_cache, paged_cache, spec["context"])
                for m in ms if m.name in spec.get("profile", ())}
    return {"wall": {k: statistics.median(v) for k, v in wall.items()},
            "cpu": {k: statistics.median(v) for k, v in cpu.items()}, "attention": attn, "profile": prof,
            "positions": getattr(lm.config, "max_position_embeddings", None), "model_mb": model_mb,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
            "prompt": prompt_tokens(lm, spec["context"]) if spec.get("prompt") else None}


def profile_step(model, m: Method, ids, hf_cache, paged_cache, L: int, steps: int = 3, top: int = 12) -> list:
    """torch.profiler over `steps` decode steps: the top ops by self CPU time, per step; then one
    row per native operator's backend table (ops/backends.describe(): which row ran, why others did not)."""
    from torch.profiler import ProfilerActivity, profile

    from gatherlens.ops import backends

    backends.reset_ran()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _generate(model, m, ids, hf_cache, paged_cache, steps, L)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ops)
    calls = {name: sum(c.values()) for name, c in backends.ran().items()}
    ran = [{"op": f"backend {line}", "ms": 0.0, "calls": calls[line.split(":")[0]] / steps, "share": 0.0}
           for line in backends.describe().splitlines()]
    return [{"op": e.key, "ms": e.self_cpu_time_total / 1e3 / steps, "calls": e.count / steps,
             "share": e.self_cpu_time_total / total} for e in ops[:top]] + ran


def real_prefix(lm):
    """The first PREFIX tokens of the default corpus, (1, PREFIX): what every cache is filled from. Only the
    corpus's first PREFIX_CHARS characters are encoded (prose: ~4 per token), not all of it: the whole
    corpus's encoding raised a case's peak RSS by ~100 MB, the bench's own cost, not the model's."""
    from gatherlens.eval.corpus import load_text

    ids = lm.encode(load_text("default")[:PREFIX_CHARS], truncation=False)[:, :PREFIX]  # (1, 256)
    assert ids.shape[1] == PREFIX, f"the default corpus's first {PREFIX_CHARS} characters make {ids.shape[1]} tokens"
    return ids


def prompt_tokens(lm, L: int) -> list[int]:
    """The real prefix tiled to L tokens: llama.cpp prefills these, as our caches hold their keys."""
    prefix = real_prefix(lm)  # (1, 256)
    return prefix.repeat(1, ceil_div(L, prefix.shape[1]))[0, :L].tolist()  # L ints


def fill_caches(lm, L: int, tokens: int, hf_too: bool = True):
    """A DynamicCache (None without hf_too) and a SparseKVCache holding L tokens (a real prefix's keys,
    tiled); prompt ids (1, L+1)."""
    import torch
    from transformers import DynamicCache

    from gatherlens.models.runtime.decoding import SparseKVCache

    model, cfg = lm.model, lm.config
    prefix = real_prefix(lm)  # (1, 256)
    seed = DynamicCache(config=cfg)
    with torch.inference_mode():
        model(input_ids=prefix, cache=seed, use_cache=True, logits_to_keep=1)
    from gatherlens.ops.sparse.config import DEFAULT

    # pages stored as every method decodes them (no re-store, which would drop the reserved room)
    hf = DynamicCache(config=cfg) if hf_too else None
    paged = SparseKVCache(config=cfg, page_size=DEFAULT.page_size, kv_dtype=DEFAULT.kv_dtype)  # the CLI's pages
    reps = ceil_div(L, prefix.shape[1])
    paged.reserve(L + tokens + 2)  # made with room: decode appends in place, never regrows mid-run
    for i, layer in enumerate(seed.layers):
        k = layer.keys.repeat(1, 1, reps, 1)[:, :, :L].contiguous()  # (1, Hkv, L, D)
        v = layer.values.repeat(1, 1, reps, 1)[:, :, :L].contiguous()  # (1, Hkv, L, D)
        if hf is not None:
            hf.update(k, v, i)
        paged.update(k, v, i)
    ids = prefix[:, :1].repeat(1, L + 1)  # (1, L+1): generate feeds only the last one
    return hf, paged, ids


def _switch(model, m: Method) -> None:
    from gatherlens.models.runtime.step import install_step
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding

    if m.kind == "hf":
        use_dense_decoding(model)
    else:
        use_sparse_decoding(model, budget=m.budget, step="auto" if m.lean else "hf")
        if not m.head:
            install_step(model, transposed=False)


def _generate(model, m: Method, ids, hf_cache, paged_cache, tokens: int, L: int) -> tuple[float, float]:
    """Seconds per token (wall, CPU) of `tokens` greedy tokens; the caches are reset to L after."""
    import torch

    _switch(model, m)
    cache = hf_cache if m.kind == "hf" else paged_cache
    w0, c0 = time.perf_counter(), time.process_time()
    model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, generation_config=_no_stop(model, tokens))
    w, c = (time.perf_counter() - w0) / tokens, (time.process_time() - c0) / tokens
    if m.kind == "hf":
        cache.crop(L - cache.get_seq_length())  # a negative count: drop what generate appended
    else:
        cache.truncate(L)
    return w, c


def _no_stop(model, tokens: int):
    """The model's generation config without an end token: every run makes exactly `tokens` tokens,
    with no per-step min_new_tokens processor (a scan of the vocabulary that `generate` users do
    not pay, and llama.cpp's loop does not either)."""
    import copy

    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=None, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    return config


def attention_ms(model, m: Method, hf_cache, paged_cache, L: int, repeats: int = 3) -> float:
    """Median ms per step of every layer's cache append + attention call, on the same caches."""
    import torch

    from gatherlens.models.hf_adapter import sdpa_attention
    from gatherlens.models.runtime.decoding import decode_attention

    sdpa_attention_forward = sdpa_attention()

    _switch(model, m)
    layers = [layer.self_attn for layer in model.model.layers]
    a = layers[0]
    Hq, Hkv, D = model.config.num_attention_heads, model.config.num_key_value_heads, a.head_dim
    q, k, v = torch.randn(1, Hq, 1, D), torch.randn(1, Hkv, 1, D), torch.randn(1, Hkv, 1, D)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i, attn in enumerate(layers):
            if m.kind == "hf":
                K, V = hf_cache.layers[i].update(k, v)  # torch.cat of the whole layer cache
                sdpa_attention_forward(attn, q, K, V, None, scaling=attn.scaling)
            else:
                decode_attention(attn, q, paged_cache.layers[i].append(k, v), None, attn.scaling)
        times.append(time.perf_counter() - start)
        hf_cache.crop(L - hf_cache.get_seq_length()) if m.kind == "hf" else paged_cache.truncate(L)
    return statistics.median(times) * 1e3


# -- the driver --------------------------------------------------------------------------------

def rows_of(spec: dict, result: dict, hf_s: float | None = None, case: str = "float") -> list[Row]:
    """One row per method of one case, with its speedup over hf (this case's, else `hf_s`)."""
    L, wall = spec["context"], result["wall"]
    hf = hf_s if hf_s is not None else wall["hf"]
    positions = result.get("positions")
    rows = []
    for m in spec["methods"]:
        s = wall[m["name"]]
        attn = result["attention"][m["name"]]  # None: not split (the cli rows)
        share = None if attn is None else attn / (s * 1e3)
        rows.append(Row(L, m["name"], s * 1e3, 1 / s, result["cpu"][m["name"]] * 1e3, hf / s, attn, share,
                        m["budget"], m["lean"], bool(positions and L > positions),
                        spec["threads"], case, result.get("rss_mb", 0.0), result.get("model_mb", 0.0)))
    return rows


def llama_row(L: int, result: dict, hf_s: float, threads: int, positions: int | None) -> Row:
    """llama.cpp's row of one context (bench/llamacpp_case.py's result); no attention split."""
    s = result["ms"] / 1e3
    return Row(L, LLAMA, result["ms"], 1 / s, result["cpu_ms"], hf_s / s, None, None, None, True,
               bool(positions and L > positions), threads, LLAMA, result["rss_mb"], result["model_mb"])


def with_llama_ratios(rows: list[Row]) -> list[Row]:
    """Fill x_llama (llama.cpp ms / ms) on every row whose context has a llama.cpp row."""
    llama = {r.context: r.ms for r in rows if r.method == LLAMA}
    for r in rows:
        r.x_llama = llama[r.context] / r.ms if r.context in llama else None
    return rows


def _check_options(budgets: str, tokens: int, rounds: int, threads: int) -> list:
    """The budgets: "auto" first where listed, then the ints sorted; a clear error for any option out of range."""
    for name, value in (("--tokens", tokens), ("--rounds", rounds), ("--threads", threads)):
        if value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=name)
    return budgets_of(budgets, "--budgets", hi=1 << 30)


@dataclass(frozen=True)
class Plan:
    """What runs at every context: our float case, our quantized case, llama.cpp (None: skipped)."""

    base: dict                 # model, tokens, rounds, threads
    float_methods: list
    quantized_methods: list | None
    cli_methods: list | None   # the command's loop (bench/generate_cli.py), on the quantized model if any
    profiled: tuple
    llama_python: str | None
    gguf: Path | None


def run_context(plan: Plan, L: int) -> tuple[list[Row], dict, dict]:
    """Every case of one context, each in a fresh process, one after the other (never together):
    ours in float32, ours quantized, then llama.cpp on the prompt tokens ours used. (rows, profiles, llama)."""
    spec = dict(plan.base, context=L, methods=plan.float_methods, profile=plan.profiled,
                prompt=plan.llama_python is not None)
    res = run_fresh("gatherlens.bench.generate", spec)
    hf_s, rows, profiles, llama = res["wall"]["hf"], rows_of(spec, res), dict(res.get("profile", {})), {}
    if plan.quantized_methods:
        qspec = dict(spec, methods=plan.quantized_methods, quantized=True, prompt=False)
        qres = run_fresh("gatherlens.bench.generate", qspec)
        rows += rows_of(qspec, qres, hf_s, "quantized")
        profiles.update(qres.get("profile", {}))
    if plan.cli_methods:
        cspec = dict(plan.base, context=L, methods=plan.cli_methods, quantized=bool(plan.quantized_methods))
        rows += rows_of(cspec, run_fresh("gatherlens.bench.generate_cli", cspec), hf_s, "cli")
    if plan.llama_python is not None:
        llama = run_llamacpp(plan.llama_python, plan.gguf, res["prompt"], plan.base["threads"])
        rows.append(llama_row(L, llama, hf_s, plan.base["threads"], res.get("positions")))
    return with_llama_ratios(rows), profiles, llama


def make_plan(model_name, budget_list, ablation, profile, llama_python_option, base,
              cli: bool = True) -> tuple[Plan, list[str]]:
    """The cases to run and the one-line notes for those skipped."""
    gguf = gguf_of(model_name)
    q_note = quantized_note(gguf)
    python, l_note = llama_python(llama_python_option)
    if python is not None and gguf is None:
        python, l_note = None, "llama.cpp row skipped: the model is not a GGUF file"
    b0 = budget_list[0]
    profiled = ("hf", f"sparse-{b0}", f"quantized-sparse-{b0}") if profile else ()
    plan = Plan(base, [vars(m) for m in methods(budget_list, ablation)],
                None if q_note else [vars(m) for m in quantized_methods(budget_list)],
                [vars(m) for m in cli_methods(b0)] if cli else None, profiled, python, gguf)
    return plan, [n for n in (q_note, l_note) if n]


@click.command("generate")
@click.option("--model", "model_name", default="smollm2", show_default=True,
              help='"smollm2" or a local Llama-family folder / .gguf file')
@click.option("--context", "contexts", multiple=True, help="cache length, repeatable: 2K, 8K, 32768 "
              "(default 2K 4K 8K 16K 32K)")
@click.option("--budgets", default="auto,512,1024,2048", show_default=True,
              help="sparse budgets, comma-separated: tokens, or auto (the default SparseConfig's)")
@click.option("--tokens", type=Int(1), default=8, show_default=True, help="tokens generated per timed run")
@click.option("--rounds", type=Int(1), default=3, show_default=True,
              help="timed runs per method (the median is reported)")
@click.option("--threads", type=Int(1, cpu_count()), default=2, show_default=True,
              help="torch threads in each case (and llama.cpp's)")
@click.option("--ablation", is_flag=True, help="also time HF's own decoder layers over the paged cache")
@click.option("--cli/--no-cli", "cli", default=True, show_default=True,
              help="also time the loop `gatherlens generate` runs (a real prefill of the prompt, its own process)")
@click.option("--profile", "profile_path", is_flag=False, flag_value="", default=None, type=click.Path(dir_okay=False),
              help="profile one decode step of hf, sparse and quantized sparse (the first budget); print the "
              "top ops and write them to this file (default: the --json path with .profile.md)")
@click.option("--llama-python", "llama_python_option", default=None, metavar="PATH",
              help="the python of a virtualenv with llama-cpp-python, for the llama.cpp row "
              "(default: $GATHERLENS_LLAMA_PYTHON; skipped when neither is set)")
@json_option("bench-generate.json")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the ms/token plot (.png or .svg; default: the --json path with .png)")
@click.option("--force", is_flag=True, help="overwrite existing --json / --plot / --profile files")
def command(model_name, contexts, budgets, tokens, rounds, threads, ablation, cli, profile_path, llama_python_option,
            json_path, plot_path, force):
    """Decode speed of a real model in `generate`: llama.cpp, HF dense, paged dense, sparse, quantized
    (fresh process per case)."""
    from rich.console import Console

    from gatherlens.bench.decode import parse_context

    budget_list = _check_options(budgets, tokens, rounds, threads)
    check_causal_model(model_name, "bench generate")
    check_json_path(json_path, force)
    plot_path = check_output(plot_path or json_path.with_suffix(".png"), force, "--plot", (".png", ".svg"))
    if profile_path is not None:
        profile_path = check_output(Path(profile_path or json_path.with_suffix(".profile.md")), force, "--profile")
    Ls = [parse_context(c) for c in (contexts or CONTEXTS)]
    console = Console(width=None if sys.stdout.isatty() else 140)
    base = dict(model=model_name, tokens=tokens, rounds=rounds, threads=threads)
    plan, notes = make_plan(model_name, budget_list, ablation, profile_path is not None, llama_python_option, base,
                            cli)
    for note in notes:
        console.print(note)
    start, rows, profiles, prefill = time.perf_counter(), [], {}, {}
    for L in Ls:
        case, profiles[L], llama = run_context(plan, L)
        rows += case
        if llama:
            prefill[str(L)] = llama["prefill_tokens_per_s"]
        console.log(f"L={L}: " + ", ".join(f"{r.method} {r.ms:.1f}" for r in case if "/" not in r.method)
                    + " ms/token")
    print_profiles(console, profiles, profile_path, force)
    meta = dict(base, wall_s=time.perf_counter() - start, profiles={str(k): v for k, v in profiles.items() if v},
                skipped=notes, llama_prefill_tokens_per_s=prefill)
    _report(console, rows, json_path, plot_path, meta, force)


def _report(console, rows: list[Row], json_path: Path, plot_path: Path, meta: dict, force: bool) -> None:
    import os

    import torch

    print_rows(console, rows, meta)
    verdicts, llama_verdicts = target_verdicts(rows), llama_target_verdicts(rows)
    for v in verdicts:
        console.print(f"target L={v['context']}: best sparse >= {v['target']}x HF dense: "
                      f"{'met' if v['met'] else 'NOT met'} ({v['speedup']:.2f}x, {v['method']})")
    for v in llama_verdicts:
        console.print(f"target L={v['context']}: best quantized sparse >= {v['target']:.2f}x llama.cpp: "
                      f"{'met' if v['met'] else 'NOT met'} ({v['x_llama']:.2f}x, {v['method']})")
    cli = cli_verdicts(rows)
    for v in cli:
        console.print(f"target L={v['context']}: cli {v['ms']:.1f} ms within {CLI_SLACK:.2f}x of {v['bench']} "
                      f"{v['bench_ms']:.1f}: {'met' if v['near'] else 'NOT met'}"
                      + ("" if v["met"] is None else f"; >= {v['target']:.2f}x llama.cpp: "
                         f"{'met' if v['met'] else 'NOT met'} ({v['x_llama']:.2f}x)"))
    meta.update(torch=torch.__version__, load_average=os.getloadavg()[0], targets=verdicts,
                llama_targets=llama_verdicts, cli_targets=cli,
                cli="the loop of `gatherlens generate` (stream_generate: real prefill, detokenizer, file checks), "
                    "its tokens/s over tokens x rounds decode steps; cli/pages with --pages' page trace",
                fill=f"a {PREFIX}-token prefix of real text prefilled once, each layer's K/V tiled to the context",
                hf="transformers' DynamicCache + SDPA (the default)",
                paged="gatherlens' paged cache, dense attention in place with GQA folded, planned decode step",
                quantized="gatherlens.load(model, quantized=True): the model run from its GGUF blocks",
                llama="llama-cpp-python on the same GGUF and threads: the same prompt tokens prefilled, median "
                      "of 32 greedy llm.sample(temp=0) + llm.eval([tok]) steps, run alone after our cases",
                memory="rss_mb: the case's peak resident set; model_mb: what loading the model added",
                attention="cache appends + attention calls of every layer per step, timed alone")
    write_results(json_path, "generate", meta, rows, force=force)  # refused if made meanwhile, without --force
    plot_rows(rows, plot_path, force=force)
    console.print(f"wrote {json_path} and {plot_path}")


def print_profiles(console, profiles: dict, path: Path | None = None, force: bool = True) -> None:
    """One table per (context, method): the ops that took most of a decode step; with a path, also
    written there as markdown (`gatherlens.outputs.write_output`: a file made meanwhile is refused)."""
    from rich.table import Table

    from gatherlens.bench.page import markdown_table
    from gatherlens.outputs import write_output

    text = []
    for L, by_method in profiles.items():
        for name, ops in by_method.items():
            title = f"one decode step, L={L}, {name}: top ops by self CPU time (torch.profiler)"
            table = Table(title=title)
            for col in ("op", "ms/step", "calls/step", "share"):
                table.add_column(col, justify="left" if col == "op" else "right")
            for op in ops:
                table.add_row(op["op"], f"{op['ms']:.2f}", f"{op['calls']:.0f}", f"{100 * op['share']:.0f}%")
            console.print(table)
            text += [f"## {title}", ""] + markdown_table(ops) + [""]
    if path is not None:
        try:
            write_output(path, "\n".join(text or ["no step was profiled (every profiled method was skipped)"]),
                         "--profile", force=force)
        except GatherValueError as e:
            raise click.ClickException(str(e)) from None
        console.print(f"wrote the profile to {path}")


def target_verdicts(rows: list[Row]) -> list[dict]:
    """Issue 10's targets: the best sparse method against HF dense at 4K, 8K and 32K."""
    out = []
    for L, want in TARGETS.items():
        cands = [r for r in rows if r.context == L and r.method.startswith("sparse") and "/" not in r.method]
        if cands:
            best = max(cands, key=lambda r: r.speedup)
            out.append({"context": L, "target": want, "speedup": best.speedup, "method": best.method,
                        "met": best.speedup >= want})
    return out


def llama_target_verdicts(rows: list[Row]) -> list[dict]:
    """Issue 18's targets: the best quantized sparse method against llama.cpp at 4K, 8K and 32K."""
    out = []
    for L, want in LLAMA_TARGETS.items():
        cands = [r for r in rows if r.context == L and r.method.startswith("quantized-sparse") and r.x_llama]
        if cands:
            best = max(cands, key=lambda r: r.x_llama)
            out.append({"context": L, "target": want, "x_llama": best.x_llama, "method": best.method,
                        "met": best.x_llama >= want})
    return out


def cli_verdicts(rows: list[Row]) -> list[dict]:
    """Issue 27's targets for the cli row: its ms within CLI_SLACK of the bench's quantized sparse row
    of its budget (else the float sparse one), and its ratio to llama.cpp (CLI_TARGETS) where timed."""
    out = []
    for cli in (r for r in rows if r.method == CLI):
        by_name = {r.method: r for r in rows if r.context == cli.context}
        bench = by_name.get(f"quantized-sparse-{cli.budget}") or by_name.get(f"sparse-{cli.budget}")
        if bench is None:
            continue
        want = CLI_TARGETS.get(cli.context)
        out.append({"context": cli.context, "ms": cli.ms, "bench": bench.method, "bench_ms": bench.ms,
                    "near": cli.ms <= CLI_SLACK * bench.ms, "x_llama": cli.x_llama, "target": want,
                    "met": None if cli.x_llama is None or want is None else cli.x_llama >= want})
    return out


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_rows(console, rows: list[Row], meta: dict) -> None:
    """The results table; rows past the trained positions are marked speed only."""
    from rich.table import Table

    table = Table(title=f"{meta['model']} decode in generate: {meta['tokens']} tokens x {meta['rounds']} rounds, "
                        f"{meta['threads']} threads (median); x HF = HF dense ms / ms; x llama.cpp = its ms / ms")
    for col in ("context", "method", "ms/token", "tokens/s", "x HF", "x llama.cpp", "attention ms", "share",
                "CPU ms/token", "peak RSS MB", "model MB"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=True)
    for r in rows:
        ctx = f"{r.context}" + (" (speed only)" if r.speed_only else "")
        share = None if r.attention_share is None else 100 * r.attention_share
        table.add_row(ctx, r.method, f"{r.ms:.1f}", f"{r.tokens_per_s:.2f}", f"{r.speedup:.2f}",
                      _num(r.x_llama, ".2f"), _num(r.attention_ms, ".1f"), _num(share, ".0f"), f"{r.cpu_ms:.1f}",
                      f"{r.rss_mb:.0f}", f"{r.model_mb:.0f}")
    console.print(table)
    if any(r.speed_only for r in rows):
        console.print("speed only: past the model's trained positions the text is meaningless, the cost is real")


def plot_rows(rows: list[Row], path: Path, force: bool = True) -> Path:
    """ms/token against context, one line per method (log-log), dashed past the trained positions
    (written by `gatherlens.outputs.open_output`: without force, a file made meanwhile is refused)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in dict.fromkeys(r.method for r in rows):
        mine = sorted((r for r in rows if r.method == name), key=lambda r: r.context)
        ax.plot([r.context for r in mine], [r.ms for r in mine], "o-", label=name)
    trained = [r.context for r in rows if not r.speed_only]
    if trained and any(r.speed_only for r in rows):
        ax.axvline(max(trained), ls="--", color="gray", lw=1)
        ax.text(max(trained), ax.get_ylim()[1], " trained positions end", va="top", fontsize=8, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens in the cache)")
    ax.set_ylabel("ms per generated token")
    ax.set_title("decode speed in generate (lower is faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, force)
