"""`gatherlens bench models FILE.gguf ...`: real-size models run from their blocks beside llama.cpp on the
same file and threads, in one run: decode, prefill, load, memory and agreement with the float model.

    gatherlens bench models /work/models/gemma3-270m.Q4_K_M.gguf --llama-python /work/llamacpp-venv/bin/python
    gatherlens bench models m.Q4_K_M.gguf m.Q8_0.gguf --context 512 --context 4K --json models.json

Every case is a fresh process (ours: bench/models_case.py under this interpreter; llama.cpp:
bench/llamacpp_case.py under llama-cpp-python's), one after the other, ours first each time:

- load, cold and warm: the file's pages dropped from the page cache first (posix_fadvise DONTNEED:
  nothing else may map it), then WARM_RUNS times right after (the median kept); the seconds from starting
  the process to the model loaded and to the first token of a short prompt, and `load()`'s (or `Llama()`'s)
  own.
- decode at each --context (default 512, 4K, 8K): the real prefill of that many prompt tokens (the
  same ids for both), then --tokens greedy tokens: ms per token (ours: the loop of `gatherlens
  generate --quantized`, sparse at --budget; llama.cpp: the median step), prefill seconds, the
  process's peak resident memory. "x" is llama.cpp's figure over ours (above 1: ours is faster or
  smaller... for memory, ours over llama.cpp's: below 1.3 meets issue 36's target).
- agreement: the float model (the F16 file beside it, NAME.F16.gguf, or --reference; transformers'
  modules in float32) over --agree-prefix + --agree-steps tokens of Emma, teacher-forced; each
  quantized run decodes the same ids a token at a time, and "agree" is the share of steps whose top-1
  equals the float model's, llama.cpp's beside it (its arithmetic, the same blocks); "before" /
  "after" split the steps at the model's sliding window, where it has one; "gap" is ours less
  llama.cpp's with its paired 95% interval (the table's cell: ours (llama.cpp's) gap +- half-width).

Timings from a busy machine are noise: run it alone (OpenMP collapses beside another process).
`scripts/make_model_files.py` writes the files (random weights at the published configs).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import click

from gatherlens.bench.fresh import run_fresh, run_script
from gatherlens.bench.generate_peers import SCRIPT, llama_python
from gatherlens.bench.output import check_json_path, json_option, write_results
from gatherlens.params import Int

CONTEXTS = ("512", "4K", "8K")
TARGETS = {512: 1.0, 4096: 1.5, 8192: 2.0}  # decode, ours over llama.cpp (issue 36)
CASE = "gatherlens.bench.models_case"


def evict(path: Path) -> bool:
    """Drop the file's pages from the page cache (a cold load reads it from disk); False where the
    system has no posix_fadvise."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def _ours(case: str, **spec) -> dict:
    return run_fresh(CASE, dict(case=case, **spec))


def _theirs(python: str, **spec) -> dict:
    return run_script(python, str(SCRIPT), spec)


WARM_RUNS = 3  # warm loads a file takes, ours and llama.cpp's alternating: the median of each is reported


def load_cells(path: Path, threads: int, python: str | None) -> dict:
    """A cold load (the file evicted first), ours then llama.cpp's, then WARM_RUNS warm ones alternating: the
    cold figures and the warm medians (one warm start moves by ~0.5 s on a busy host; ours kept beside)."""
    ours, theirs = {"cold": [], "warm": []}, {"cold": [], "warm": []}
    prompt = None
    for kind in ("cold",) + ("warm",) * WARM_RUNS:
        if kind == "cold":
            evict(path)
        ours[kind].append(_ours("load", gguf=str(path), threads=threads, spawn=time.time()))
        prompt = prompt or ours[kind][-1]["prompt"]
        if python is not None:
            if kind == "cold":
                evict(path)
            theirs[kind].append(_theirs(python, gguf=str(path), threads=threads, prompt=prompt, spawn=time.time()))
    row = {"load_warm_runs_s": [r["loaded_s"] for r in ours["warm"]]}
    for kind in ("cold", "warm"):
        row.update({f"load_{kind}_s": _median(ours[kind], "loaded_s"),
                    f"first_token_{kind}_s": _median(ours[kind], "first_token_s"),
                    f"load_call_{kind}_s": _median(ours[kind], "load_s")})
        if theirs[kind]:
            row.update({f"llama_load_{kind}_s": _median(theirs[kind], "loaded_s"),
                        f"llama_first_token_{kind}_s": _median(theirs[kind], "first_token_s")})
    return row


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def decode_cells(path: Path, L: int, tokens: int, budget: int, threads: int, python: str | None) -> dict:
    """Our decode and prefill at L tokens, then llama.cpp's on the same prompt ids."""
    ours = _ours("decode", gguf=str(path), threads=threads, context=L, tokens=tokens, budget=budget)
    row = {f"ms_{L}": ours["ms"], f"prefill_s_{L}": ours["prefill_s"], f"rss_mb_{L}": ours["rss_mb"]}
    if python is not None:
        theirs = _theirs(python, gguf=str(path), prompt=ours["prompt"], threads=threads, steps=tokens)
        row.update({f"llama_ms_{L}": theirs["ms"], f"llama_prefill_s_{L}": theirs["prefill_s"],
                    f"llama_rss_mb_{L}": theirs["rss_mb"], f"x_decode_{L}": theirs["ms"] / ours["ms"],
                    f"x_prefill_{L}": theirs["prefill_s"] / ours["prefill_s"],
                    f"rss_over_llama_{L}": ours["rss_mb"] / theirs["rss_mb"]})
    return row


def _share(ours: list[int], reference: list[int], picked: range) -> float | None:
    steps = [i for i in picked if i < len(reference)]
    return sum(ours[i] == reference[i] for i in steps) / len(steps) if steps else None


def agree_cells(path: Path, reference: dict, spec: dict, window: int | None, python: str | None) -> dict:
    """The share of teacher-forced steps whose top-1 equals the float model's: ours, llama.cpp's."""
    ids, prefix, steps = reference["ids"], spec["prefix"], spec["steps"]
    runs = {"": _ours("forced", gguf=str(path), ids=ids, **spec)["top1"]}
    if python is not None:
        runs["llama_"] = _theirs(python, gguf=str(path), prompt=ids[:prefix], forced=ids[prefix:],
                                 threads=spec["threads"])["top1"]
    split = max(0, min(steps, (window or 0) - prefix))  # steps before the window's edge (position < window)
    row = {"agree_steps": steps}
    for who, top1 in runs.items():
        row[f"{who}agree"] = _share(top1, reference["top1"], range(steps))
        if window:
            row[f"{who}agree_before"] = _share(top1, reference["top1"], range(split))
            row[f"{who}agree_after"] = _share(top1, reference["top1"], range(split, steps))
    if "llama_" in runs:
        row["agree_gap"], row["agree_gap_half"] = _paired_gap(runs[""], runs["llama_"], reference["top1"], steps)
    return row


def _paired_gap(ours: list[int], theirs: list[int], reference: list[int], steps: int) -> tuple:
    """Our agreement less llama.cpp's over the same steps, and its 95% interval's half-width (normal, paired:
    per step (ours right) - (theirs right), in -1..1). At 128 steps one token moves a share by 0.008 and the
    half-width is ~0.05: Qwen2.5 0.5B read 0.500 against 0.523 there and 0.514 against 0.516 over 512."""
    n = min(steps, len(reference), len(ours), len(theirs))
    if n == 0:
        return None, None  # no step to compare (as `_share` gives None)
    d = [int(ours[i] == reference[i]) - int(theirs[i] == reference[i]) for i in range(n)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(1, n - 1)
    return mean, 1.96 * (var / n) ** 0.5


def reference_of(path: Path, option: Path | None) -> Path | None:
    """The float file: --reference, else NAME.F16.gguf (or .F32) beside NAME.PRESET.gguf, else None."""
    if option is not None:
        return option
    stem = path.name.removesuffix(".gguf").rsplit(".", 1)[0]
    found = [path.with_name(f"{stem}.{kind}.gguf") for kind in ("F16", "F32")]
    return next((f for f in found if f.is_file() and f != path), None)


def _window(path: Path) -> int | None:
    from gatherlens.models.gguf.config import metadata_value, open_gguf

    reader = open_gguf(path)
    arch = metadata_value(reader, "general.architecture")
    return metadata_value(reader, f"{arch}.attention.sliding_window")


def model_row(path: Path, Ls: list[int], opts: dict, python: str | None, references: dict) -> dict:
    """Every case of one file: load, decode at each context, agreement (the reference run once per file)."""
    row = {"file": path.name, "file_mb": path.stat().st_size / 1e6}
    row.update(load_cells(path, opts["threads"], python))
    for L in Ls:
        row.update(decode_cells(path, L, opts["tokens"], opts["budget"], opts["threads"], python))
    ref = reference_of(path, opts["reference"])
    if ref is None:
        row["agree_note"] = "no float file beside it (NAME.F16.gguf) and no --reference: agreement skipped"
        return row
    spec = dict(prefix=opts["prefix"], steps=opts["steps"], threads=opts["threads"], budget=opts["budget"])
    if ref not in references:
        references[ref] = _ours("reference", reference=str(ref), **spec)
    row.update(agree_cells(path, references[ref], spec, _window(path), python))
    return row


def _agree_cell(r: dict) -> str:
    cell = f"{_fmt(r.get('agree'), 3)} ({_fmt(r.get('llama_agree'), 3)})"
    return cell if r.get("agree_gap") is None else f"{cell} {r['agree_gap']:+.3f} ±{r['agree_gap_half']:.3f}"


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[dict], Ls: list[int]) -> list[str]:
    """The README's table: one line per file, ours (llama.cpp, x) in each cell."""
    from gatherlens.bench.presets import context_label

    head = ["file", *[f"decode {context_label(L)} ms" for L in Ls], f"prefill {context_label(Ls[-1])} s",
            "load warm / cold s", f"peak RSS {context_label(Ls[-1])} MB", "agree"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        def pair(key, digits=1, ratio=None):
            ours, theirs = r.get(key), r.get(f"llama_{key}")
            x = f", {r[ratio]:.2f}x" if ratio and r.get(ratio) is not None else ""
            return f"{_fmt(ours, digits)} ({_fmt(theirs, digits)}{x})"
        last = Ls[-1]
        cells = [r["file"], *[pair(f"ms_{L}", 1, f"x_decode_{L}") for L in Ls],
                 pair(f"prefill_s_{last}", 1, f"x_prefill_{last}"),
                 f"{_fmt(r.get('load_warm_s'), 1)} / {_fmt(r.get('load_cold_s'), 1)} "
                 f"({_fmt(r.get('llama_load_warm_s'), 1)} / {_fmt(r.get('llama_load_cold_s'), 1)})",
                 pair(f"rss_mb_{last}", 0), _agree_cell(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


@click.command("models")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--context", "contexts", multiple=True, help="prompt length, repeatable (default 512 4K 8K)")
@click.option("--tokens", type=Int(1, 4096), default=16, show_default=True, help="tokens generated per decode case")
@click.option("--budget", default=None, type=Int(1), help="the sparse budget (default: generate's)")
@click.option("--threads", type=Int(1, 1024), default=2, show_default=True,
              help="torch threads in each case (and llama.cpp's)")
@click.option("--agree-prefix", "prefix", type=Int(1), default=448, show_default=True,
              help="tokens before the forced steps")
@click.option("--agree-steps", "steps", type=Int(1), default=512, show_default=True,
              help="teacher-forced steps compared (512: a share's 95% interval about +-0.04; 128 gave +-0.08)")
@click.option("--reference", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="the float file for every FILE (default: NAME.F16.gguf beside NAME.PRESET.gguf)")
@click.option("--llama-python", "llama_python_option", default=None, metavar="PATH",
              help="the python of a virtualenv with llama-cpp-python (default: $GATHERLENS_LLAMA_PYTHON)")
@json_option("bench-models.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def command(files, contexts, tokens, budget, threads, prefix, steps, reference, llama_python_option, json_path,
            force):
    """Real-size models from their blocks beside llama.cpp: decode, prefill, load, memory, agreement."""
    from rich.console import Console

    from gatherlens.bench.decode import parse_context
    from gatherlens.ops.sparse.config import DEFAULT

    check_json_path(json_path, force)
    _check_files([*files, *([reference] if reference is not None else [])])
    Ls = [parse_context(c) for c in (contexts or CONTEXTS)]
    python, note = llama_python(llama_python_option)
    console = Console(width=None if sys.stdout.isatty() else 200)
    if note:
        console.print(note)
    opts = dict(tokens=tokens, budget=budget or DEFAULT.budget, threads=threads, prefix=prefix, steps=steps,
                reference=reference)
    start, rows, references = time.perf_counter(), [], {}
    for path in files:
        rows.append(model_row(path, Ls, opts, python, references))
        console.log(f"{path.name}: " + ", ".join(f"{L}: {rows[-1][f'ms_{L}']:.1f} ms" for L in Ls))
    console.print("\n".join(markdown(rows, Ls)), markup=False)
    meta = dict(contexts=Ls, cpu=_cpu(), skipped=[note] if note else [], wall_s=time.perf_counter() - start,
                **{k: (str(v) if isinstance(v, Path) else v) for k, v in opts.items()})
    write_results(json_path, "models", meta, rows, force)


def _check_files(paths: list[Path]) -> None:
    """Every FILE and --reference a GGUF model file, each named in a one-line error before anything slow."""
    from gatherlens.errors import GatherValueError
    from gatherlens.models.files.registry import resolve

    for path in paths:
        try:
            source = resolve(path)
        except GatherValueError as e:
            raise click.ClickException(str(e)) from None
        if source.kind != "gguf":
            raise click.ClickException(f"{str(path)!r} is not a .gguf model file; bench models runs GGUF files")


def _cpu() -> str:
    """The CPU's model name and whether it has AVX-512 VNNI (every figure says which path it came from)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    said = f"{name}; {'AVX-512 VNNI' if 'avx512_vnni' in info else 'AVX2' if 'avx2' in info else 'no AVX2'}"
    chosen = [f"{key}={os.environ[key]}" for key in ("GATHERLENS_NATIVE_CFLAGS", "ATEN_CPU_CAPABILITY")
              if os.environ.get(key)]  # a narrower path asked for (the AVX2 loops on an AVX-512 machine)
    return f"{said}; {', '.join(chosen)}" if chosen else said
