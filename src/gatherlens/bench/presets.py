"""`gatherlens bench presets FILE.gguf ...`: the GGUF presets people download, each run from its blocks
and set beside llama.cpp on the same file, in one run.

    gatherlens bench presets m.Q4_K_M.gguf m.Q8_0.gguf --llama-python ../llamacpp-venv/bin/python
    gatherlens bench presets m.Q6_K.gguf --context 4K --context 8K --json presets.json

For each file, every case in a fresh process of its own (bench/fresh.py), one after the other:

- inventory: `load(file, quantized=True)`; the route of every tensor type (the embedding is a row
  gather of its blocks; each linear's product route), the resident weight bytes (the file's blocks,
  mapped in place, plus every packed copy a route keeps plus the float norms), against the file's size;
  the perplexity of 1,000 tokens of Austen's *Emma* (one prefill, teacher-forced); 64 greedy tokens
  after a real prompt
- decode: ms per token of quantized sparse decoding (budget --budget) after a cache filled to each
  --context, as `bench generate` times it (its `run_case`)
- llama.cpp (with --llama-python): the same file, threads and prompt tokens (bench/llamacpp_case.py):
  its ms per token, and its 64 greedy tokens after the same prompt; "agree" counts the leading tokens
  the two greedy runs share (near-ties make some divergence normal: the weights are the same blocks,
  the arithmetic is not)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from gatherlens.bench.fresh import run_fresh
from gatherlens.bench.generate_peers import llama_python, run_llamacpp_greedy, run_llamacpp
from gatherlens.bench.output import check_json_path, json_option, write_results
from gatherlens.params import Int, cpu_count

PPL_TOKENS = 1000  # tokens of Emma whose perplexity each preset reports
GREEDY = 64  # greedy tokens compared with llama.cpp's
PROMPT = 64  # tokens of Emma the greedy runs start from


def _emma_ids(lm, n: int):
    """The first n tokens of Austen's Emma (the default corpus where Austen is not installed), (1, n)."""
    from gatherlens.eval.corpus import austen_available, load_text

    text = load_text("austen:emma" if austen_available() else "default")
    return lm.encode(text, truncation=False)[:, :n]  # (1, n)


def _mapped(path: Path) -> tuple[list[tuple[int, int]], int]:
    """The address ranges this process maps `path` at and the bytes of them resident now (Linux
    /proc/self/smaps; ([], 0) where unreadable)."""
    target, ranges, resident, inside = str(Path(path).resolve()), [], 0, False
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return ranges, resident
    for line in lines:
        parts = line.split(maxsplit=5)
        if "-" in parts[0] and len(parts) >= 5:  # a mapping's header line
            inside = len(parts) == 6 and parts[5] == target
            if inside:
                ranges.append(tuple(int(x, 16) for x in parts[0].split("-")))
        elif inside and parts[0] == "Rss:":
            resident += int(parts[1]) * 1024  # kB
    return ranges, resident


def _tensors(model):
    """Every tensor a quantized model holds: blocks, packed copies, parameters and buffers."""
    from gatherlens.models.gguf.layers import QuantizedEmbedding, QuantizedLinear

    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            yield module.qweight.raw
            yield from module.qweight.tensors
        elif isinstance(module, QuantizedEmbedding):
            yield module.table.raw
    yield from model.parameters()
    yield from model.buffers()


def resident_bytes(model, path: Path) -> dict[str, int]:
    """What a quantized model keeps in memory, in bytes: "file", the pages of the GGUF mapped in place
    resident now (blocks read there: an embedding's rows, formats without panels; the load lets the
    rest go, memory.release_mapping), and "copies", every tensor whose memory is not that mapping
    (the blocks repacked in panels, fused or un-permuted rows, float norms and biases, buffers), each
    storage counted once."""
    (ranges, mapped), seen, copies = _mapped(path), set(), 0
    for t in _tensors(model):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen or any(lo <= ptr < hi for lo, hi in ranges):
            continue
        seen.add(ptr)
        copies += storage.nbytes()
    return {"file": mapped, "copies": copies}


def routes_by_type(model) -> dict[str, list[str]]:
    """{ggml type: [routes its tensors take]}: "gather" for the embedding table."""
    from gatherlens.models.gguf.layers import QuantizedEmbedding, QuantizedLinear

    out: dict[str, set] = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            out.setdefault(module.qweight.qtype, set()).add(module.qweight.route)
        elif isinstance(module, QuantizedEmbedding):
            out.setdefault(module.table.qtype, set()).add("gather")
    return {k: sorted(v) for k, v in sorted(out.items())}


def _perplexity(model, ids) -> float:
    """exp of the mean next-token loss over ids (1, n), one prefill."""
    import math

    import torch
    import torch.nn.functional as F

    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, :-1].float()  # (n-1, V)
    return math.exp(F.cross_entropy(logits, ids[0, 1:]).item())


def _greedy(model, ids, steps: int) -> list[int]:
    """`steps` greedy tokens after ids (1, n), with no end token (exactly `steps`)."""
    import copy

    import torch

    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=None, max_new_tokens=steps, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)  # (1, n+steps)
    return out[0, ids.shape[1]:].tolist()


def run_case(spec: dict) -> dict:
    """Inside the fresh process: the inventory case of one file (see the module doc), or the float
    model's perplexity (spec["case"] == "float")."""
    import torch

    from gatherlens.bench.llamacpp_case import rss_mb
    from gatherlens.models import load

    if spec.get("case") == "float":
        return float_case(spec)
    torch.set_num_threads(spec["threads"])
    before = rss_mb()
    t0 = time.perf_counter()
    lm = load(spec["gguf"], quantized=True)
    load_s = time.perf_counter() - t0
    loaded_mb = rss_mb() - before
    prompt = _emma_ids(lm, spec["prompt"])  # (1, PROMPT)
    return {"routes": routes_by_type(lm.model), "resident": resident_bytes(lm.model, Path(spec["gguf"])), "load_s": load_s,
            "loaded_mb": loaded_mb, "ppl": _perplexity(lm.model, _emma_ids(lm, spec["ppl_tokens"])),
            "prompt": prompt[0].tolist(), "greedy": _greedy(lm.model, prompt, spec["greedy"])}


def float_case(spec: dict) -> dict:
    """The float model's perplexity on the same tokens (the reference the presets are compared with)."""
    import torch

    from gatherlens.models import load

    torch.set_num_threads(spec["threads"])
    lm = load(spec["model"])
    return {"ppl": _perplexity(lm.model, _emma_ids(lm, spec["ppl_tokens"]))}


def agree(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy runs share.

        >>> agree([1, 2, 3], [1, 2, 4])
        2
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def preset_row(path: Path, contexts: list[int], budget: int, threads: int, python: str | None, tokens: int) -> dict:
    """Every case of one file: its inventory, its decode rows and llama.cpp's beside them."""
    from gatherlens.bench.generate import quantized_methods

    spec = dict(gguf=str(path), threads=threads, prompt=PROMPT, greedy=GREEDY, ppl_tokens=PPL_TOKENS)
    inv = run_fresh("gatherlens.bench.presets", spec)
    row = dict(file=path.name, file_mb=path.stat().st_size / 1e6, **inv, decode={})
    if python is not None:
        theirs = run_llamacpp_greedy(python, path, inv["prompt"], threads, GREEDY)
        row.update(llama_greedy=theirs["tokens"], agree=agree(inv["greedy"], theirs["tokens"]))
    method = [m for m in quantized_methods([budget]) if m.budget == budget]
    for L in contexts:
        case = dict(model=str(path), tokens=tokens, rounds=3, threads=threads, context=L, quantized=True,
                    methods=[vars(m) for m in method], prompt=python is not None)
        ours = run_fresh("gatherlens.bench.generate", case)
        cell = {"ms": ours["wall"][method[0].name] * 1e3, "rss_mb": ours["rss_mb"]}
        if python is not None:
            theirs = run_llamacpp(python, path, ours["prompt"], threads)
            cell.update(llama_ms=theirs["ms"], llama_rss_mb=theirs["rss_mb"], x_llama=theirs["ms"] / cell["ms"])
        row["decode"][str(L)] = cell
    return row


def _resident_mb(row: dict) -> float:
    return sum(row["resident"].values()) / 1e6


def context_label(L: int) -> str:
    """4096 -> "4K", 512 -> "512"."""
    return f"{L // 1024}K" if L % 1024 == 0 else str(L)


def print_rows(console, rows: list[dict], float_ppl: float | None) -> None:
    """The README's table: one line per preset."""
    from rich.table import Table

    contexts = sorted({int(L) for r in rows for L in r["decode"]})
    table = Table(title="GGUF presets run from their blocks (quantized sparse decoding) beside llama.cpp")
    for col in ["preset", "routes per type", "file MB", "resident MB", "ppl", "agree/64",
                "copies MB",
                *[f"{context_label(L)} ms (llama.cpp, x)" for L in contexts]]:
        table.add_column(col)
    for r in rows:
        routes = ", ".join(f"{t}: {'/'.join(v)}" for t, v in r["routes"].items())
        cells = []
        for L in contexts:
            c = r["decode"].get(str(L), {})
            cells.append(f"{c['ms']:.1f} ({c['llama_ms']:.1f}, {c['x_llama']:.2f}x)" if "llama_ms" in c
                         else f"{c.get('ms', float('nan')):.1f}")
        table.add_row(r["file"], routes, f"{r['file_mb']:.0f}", f"{_resident_mb(r):.0f}", f"{r['ppl']:.2f}",
                      str(r.get("agree", "-")), f"{r['resident']['copies'] / 1e6:.0f}", *cells)
    console.print(table)
    if float_ppl is not None:
        console.print(f"float model (smollm2, dequantized from the shipped Q4_1 file): ppl {float_ppl:.2f} "
                      f"on the same {PPL_TOKENS} tokens")


def _check_files(files) -> None:
    """One `Error:` line naming the first file that is not a GGUF quantized=True runs (not a GGUF,
    empty, truncated, damaged, of a type it cannot run), from its header: before the first slow case."""
    from gatherlens.errors import GatherLensError
    from gatherlens.models.files.registry import check_quantizable, resolve
    from gatherlens.models.gguf.check import open_checked

    for path in files:
        try:
            check_quantizable(resolve(path), "bench presets")
            open_checked(path, quantized=True)
        except GatherLensError as err:
            raise click.ClickException(str(err)) from None
        except (ValueError, OSError) as err:   # a header gguf's reader cannot parse: its own words
            raise click.ClickException(f"model file {str(path)!r} could not be read (damaged or truncated?): "
                                       f"{err}") from None


@click.command("presets")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--context", "contexts", multiple=True, help="cache length, repeatable (default 4K 8K)")
@click.option("--budget", default=512, show_default=True, type=Int(1), help="the sparse budget (tokens per KV head)")
@click.option("--tokens", default=16, show_default=True, type=Int(1), help="tokens generated per timed run")
@click.option("--threads", default=min(2, cpu_count()), show_default=True, type=Int(1, cpu_count()),
              help="torch threads in each case (and llama.cpp's)")
@click.option("--llama-python", "llama_python_option", default=None, metavar="PATH",
              help="the python of a virtualenv with llama-cpp-python (default: $GATHERLENS_LLAMA_PYTHON)")
@json_option("bench-presets.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def command(files, contexts, budget, tokens, threads, llama_python_option, json_path, force):
    """GGUF presets run from their blocks beside llama.cpp on the same file: routes, memory, quality, speed."""
    from rich.console import Console

    from gatherlens.bench.decode import parse_context

    check_json_path(json_path, force)
    Ls = [parse_context(c) for c in (contexts or ("4K", "8K"))]
    _check_files(files)   # every file a GGUF the quantized path runs, before any slow case
    python, note = llama_python(llama_python_option)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if note:
        console.print(note)
    start = time.perf_counter()
    ppl = run_fresh("gatherlens.bench.presets", dict(threads=threads, model="smollm2", ppl_tokens=PPL_TOKENS,
                                                     case="float"))["ppl"]
    rows = []
    for path in files:
        rows.append(preset_row(path, Ls, budget, threads, python, tokens))
        console.log(f"{path.name}: " + ", ".join(f"{L} {c['ms']:.1f} ms" for L, c in rows[-1]["decode"].items()))
    print_rows(console, rows, ppl)
    meta = dict(budget=budget, threads=threads, tokens=tokens, wall_s=time.perf_counter() - start, float_ppl=ppl,
                ppl_tokens=PPL_TOKENS, greedy=GREEDY, skipped=[note] if note else [])
    write_results(json_path, "presets", meta, rows, force)
