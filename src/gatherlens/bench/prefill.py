"""`gatherlens bench prefill`: time to first token of a long prompt, dense prefill, sparse prefill, llama.cpp.

    gatherlens bench prefill                                  # SmolLM2 from its GGUF blocks, 4K / 8K / 32K
    gatherlens bench prefill --context 8K --llama-python ~/llamacpp-venv/bin/python --json prefill.json
    gatherlens bench prefill --float --rules antidiagonal,pooled --threshold 0.9
    gatherlens bench prefill --context 8K --backends auto,torch --threads 1   # the C++ operators vs torch's

Every case runs in a fresh process (bench/fresh.py), one after the other, on the same prompt ids
(the first L tokens of Emma, repeated when the book is shorter) and the same threads:
- dense: the prompt's forward as `gatherlens generate` runs it (models/generation.last_logits: chunks of
  PREFILL_CHUNK tokens into a SparseKVCache of the default pages, transformers' layers, SDPA), the
  last position's logits and their argmax;
- sparse-<rule>: the same with `use_sparse_prefill(model, preset)` (ops/prefill): the key blocks
  each query block needs, gathered; its row says the share of blocks kept and which rows of the
  prefill backend tables ran (`ran`); with --backends each backend a row, "sparse-<rule>@torch"
  for the torch paths (`PrefillConfig.backend`: block scores and attention);
- llama.cpp: its prefill of the same ids (bench/llamacpp_case.py under --llama-python's interpreter,
  as `bench generate` runs it), only when --llama-python (or $GATHERLENS_LLAMA_PYTHON) is given.
The time to first token is the best of --rounds runs; x_dense and x_llama are the dense / llama.cpp
time over the row's; attention_s is that round's time inside the layers' attention function (SDPA,
or block scores, choice and attention for a sparse row; a timer around the function registered
under the model's attention name), x_attn the dense row's over it. Past 8K the positions are beyond
SmolLM2's training: speed only.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click


from gatherlens.bench.fresh import run_fresh
from gatherlens.bench.generate_peers import gguf_of, llama_python, quantized_note, run_llamacpp
from gatherlens.bench.output import check_causal_model, check_json_path, json_option, write_results
from gatherlens.ops.sparse.geometry import ceil_div
from gatherlens.params import Int, Real, cpu_count

CONTEXTS = ("4K", "8K", "32K")
PREFILL_TABLES = ("block_prefill", "antidiagonal_scores")  # ops/prefill/attend.py's backend tables
TARGETS = {"dense": {8192: 2.0}, "llama.cpp": {8192: 2.0, 32768: 4.0}}  # sparse over each, issue 28
LLAMA = "llama.cpp"


@dataclass
class Row:
    context: int
    method: str                      # "dense", "sparse-<rule>[@<backend>]", "llama.cpp"
    ttft_s: float                    # time to first token (best of the rounds)
    kept_share: float | None = None  # key blocks gathered / allowed (sparse rows)
    x_dense: float | None = None     # dense ttft / this ttft
    x_llama: float | None = None     # llama.cpp ttft / this ttft
    quantized: bool = False
    attention_s: float | None = None  # seconds inside the attention function (the best round)
    x_attn: float | None = None      # dense attention_s / this attention_s
    ran: dict | None = None          # prefill backend table -> {row: calls} (sparse rows)


class AttentionClock:
    """Seconds spent inside a model's attention function: the function registered under the model's
    attention name is wrapped (in this process only; hf_adapter's public registry)."""

    def __init__(self, model):
        from gatherlens.models.hf_adapter import attention_function, attn_implementation, register_attention

        self.seconds = 0.0
        name = attn_implementation(model)
        inner = attention_function(name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        register_attention(name, timed)


def prompt_ids(lm, L: int) -> list[int]:
    """The first L tokens of Emma (the default corpus without Austen), repeated to L when shorter."""
    from gatherlens.eval.corpus import austen_available, load_text

    text = load_text("austen:emma" if austen_available() else "default")
    ids = lm.encode(text, truncation=False)                                   # (1, T)
    return ids.repeat(1, ceil_div(L, ids.shape[1]))[0, :L].tolist()           # L ints


def run_case(spec: dict) -> dict:
    """One case in this (fresh) process: load, prefill spec["context"] ids spec["rounds"] times; the best time."""
    import torch

    from gatherlens.models import load
    from gatherlens.models.runtime.generation import last_logits
    from gatherlens.models.runtime.decoding import SparseKVCache
    from gatherlens.models.attention.prefill import last_prefill_selections, use_sparse_prefill
    from gatherlens.ops.sparse.config import DEFAULT
    from gatherlens.ops import backends
    from gatherlens.ops.prefill.config import PRESETS
    from gatherlens.ops.prefill.fused_prefill import kernel_loaded
    from gatherlens.ops.prefill.selection import kept_share

    torch.set_num_threads(int(spec["threads"]))
    lm = load(spec["model"], **({"quantized": True} if spec["quantized"] else {}))
    ids = torch.tensor([prompt_ids(lm, int(spec["context"]))])                # (1, L)
    if spec["rule"] is not None:
        config = PRESETS[spec["rule"]].replace(keep_selection=True, backend=spec.get("backend", "auto"),
                                               **spec["changes"])
        use_sparse_prefill(lm.model, config)
        kernel_loaded()  # a first build of the C++ operators (15-30 s) is not part of the time to first token
    clock, best, attention = AttentionClock(lm.model), float("inf"), None
    backends.reset_ran()
    with torch.inference_mode():
        for _ in range(int(spec["rounds"])):
            cache = SparseKVCache(config=lm.config, page_size=DEFAULT.page_size, kv_dtype=DEFAULT.kv_dtype)
            cache.reserve(ids.shape[1] + 1)  # as `gatherlens generate` prefills: the same cache, the same chunks
            clock.seconds, t0 = 0.0, time.perf_counter()
            int(last_logits(lm.model, cache, ids).argmax())  # logits (V,)
            seconds = time.perf_counter() - t0
            del cache
            if seconds < best:
                best, attention = seconds, clock.seconds
    shared = kept_share(last_prefill_selections(lm.model).values())
    ran = {op: rows for op, rows in backends.ran().items() if op in PREFILL_TABLES}
    return {"ttft_s": best, "attention_s": attention, "kept_share": shared, "ran": ran or None,
            "ids": ids[0].tolist()}


def _rows_of_context(spec: dict, rules: list[str], llama: str | None, gguf) -> list[Row]:
    """Every case of one context, each in a fresh process: dense, each rule on each backend, llama.cpp on
    the same ids."""
    dense = run_fresh("gatherlens.bench.prefill", dict(spec, rule=None))
    rows = [Row(spec["context"], "dense", dense["ttft_s"], 1.0, quantized=spec["quantized"],
                attention_s=dense["attention_s"])]
    for rule in rules:
        for backend in spec["backends"]:
            got = run_fresh("gatherlens.bench.prefill", dict(spec, rule=rule, backend=backend))
            name = f"sparse-{rule}" + ("" if backend == "auto" else f"@{backend}")
            rows.append(Row(spec["context"], name, got["ttft_s"], got["kept_share"], quantized=spec["quantized"],
                            attention_s=got["attention_s"], ran=got["ran"]))
    if llama is not None and gguf is not None:
        got = run_llamacpp(llama, gguf, dense["ids"], int(spec["threads"]))
        rows.append(Row(spec["context"], LLAMA, got["prefill_s"]))
    llama_s = next((r.ttft_s for r in rows if r.method == LLAMA), None)
    for r in rows:
        r.x_dense = rows[0].ttft_s / r.ttft_s
        r.x_llama = llama_s / r.ttft_s if llama_s is not None else None
        r.x_attn = rows[0].attention_s / r.attention_s if r.attention_s else None
    return rows


def _parse(contexts, rules: str, backends: str) -> tuple[list[int], list[str], list[str]]:
    from gatherlens.bench.decode import parse_context
    from gatherlens.ops.prefill.config import BACKENDS, PRESETS

    names = [r.strip() for r in rules.split(",") if r.strip()]
    bad = [n for n in names if n not in PRESETS]
    if bad or not names:
        raise click.BadParameter(f"{rules!r}: give rules from {', '.join(PRESETS)}", param_hint="--rules")
    where = [b.strip() for b in backends.split(",") if b.strip()]
    if not where or any(b not in BACKENDS for b in where):
        raise click.BadParameter(f"{backends!r}: give backends from {', '.join(BACKENDS)}", param_hint="--backends")
    return [parse_context(c) for c in (contexts or CONTEXTS)], names, where


@click.command("prefill")
@click.option("--model", "model_name", default="smollm2", show_default=True,
              help='"smollm2" or a local Llama-family folder / .gguf file.')
@click.option("--context", "contexts", multiple=True,
              help="prompt length, repeatable: 4K, 8K, 32768 (default: 4K, 8K, 32K)")
@click.option("--rules", default="default", show_default=True, help="sparse prefill presets, comma-separated")
@click.option("--backends", default="auto", show_default=True,
              help="where the sparse rows' scores and attention run, comma-separated: auto, native, torch")
@click.option("--threshold", default=None, type=Real(0, 1, min_open=True),
              help="the rules' mass threshold (default: each preset's)")
@click.option("--block-size", type=Int(1), default=None, help="tokens per block (default: the preset's)")
@click.option("--float/--quantized", "use_float", default=False,
              help="float32 copy, or the GGUF blocks (default: quantized when the model is a GGUF)")
@click.option("--rounds", type=Int(1), default=1, show_default=True, help="prefills per case (best kept)")
@click.option("--threads", type=Int(1, cpu_count()), default=2, show_default=True,
              help="torch threads (and llama.cpp's)")
@click.option("--llama-python", "llama_python_option", default=None, metavar="PATH",
              help="llama-cpp-python's interpreter (its own virtualenv): adds the llama.cpp row")
@json_option("bench-prefill.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def command(model_name, contexts, rules, backends, threshold, block_size, use_float, rounds, threads,
            llama_python_option, json_path, force):
    """Time to first token: dense prefill, sparse prefill and llama.cpp on the same ids (fresh process per case)."""
    Ls, names, where = _parse(contexts, rules, backends)
    check_causal_model(model_name, "bench prefill")
    check_json_path(json_path, force)
    gguf = gguf_of(model_name)
    quantized = not use_float and gguf is not None and not quantized_note(gguf)
    llama, note = llama_python(llama_python_option)
    if note:
        click.echo(note)
    changes = {k: v for k, v in (("threshold", threshold), ("block_size", block_size)) if v is not None}
    start, rows = time.perf_counter(), []
    for L in Ls:
        spec = dict(model=model_name, quantized=quantized, context=L, threads=threads, rounds=rounds, changes=changes,
                    backends=where)
        rows += _rows_of_context(spec, names, llama, gguf)
        click.echo(f"L={L}: " + ", ".join(f"{r.method} {r.ttft_s:.2f} s" for r in rows if r.context == L))
    _print(rows)
    for line in verdicts(rows):
        click.echo(line)
    meta = dict(model=model_name, quantized=quantized, threads=threads, rounds=rounds, rules=names, backends=where,
                changes=changes, wall_s=time.perf_counter() - start, skipped=[note] if note else [],
                python=sys.version.split()[0])
    write_results(Path(json_path), "prefill", meta, rows, force=force)


def _print(rows: list[Row]) -> None:
    click.echo(f"{'context':>8} {'method':<24} {'ttft s':>9} {'kept':>6} {'x dense':>8} {'x llama':>8} "
               f"{'attn s':>8} {'x attn':>7}")
    for r in rows:
        kept = "-" if r.kept_share is None else f"{r.kept_share:.3f}"
        xl = "-" if r.x_llama is None else f"{r.x_llama:.2f}"
        attn = "-" if r.attention_s is None else f"{r.attention_s:.3f}"
        xa = "-" if r.x_attn is None else f"{r.x_attn:.2f}"
        click.echo(f"{r.context:>8} {r.method:<24} {r.ttft_s:>9.3f} {kept:>6} {r.x_dense:>8.2f} {xl:>8} "
                   f"{attn:>8} {xa:>7}")


def verdicts(rows: list[Row]) -> list[str]:
    """One line per target of issue 28 that these rows can answer (the best sparse row of each context)."""
    out = []
    for L in sorted({r.context for r in rows}):
        sparse = [r for r in rows if r.context == L and r.method.startswith("sparse")]
        if not sparse:
            continue
        best = max(sparse, key=lambda r: r.x_dense)
        for peer, field in (("dense", "x_dense"), (LLAMA, "x_llama")):
            target, got = TARGETS[peer].get(L), getattr(best, field)
            if target is not None and got is not None:
                out.append(f"target L={L}: sparse >= {target}x {peer}: {'met' if got >= target else 'NOT met'} "
                           f"({got:.2f}x, {best.method})")
    return out
