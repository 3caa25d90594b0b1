"""Decode and prefill speed with one core kept busy by another program, against the quiet machine,
for each way gatherlens can meet a busy core, side by side, and llama.cpp under the same busy core.

    .venv/bin/python scripts/busy_core.py                          # ~300 and 4K tokens, every option below
    .venv/bin/python scripts/busy_core.py --contexts 300 --repeats 3 --variant "follow:" --variant "trial: ..."
    .venv/bin/python scripts/busy_core.py --json busy.json         # the rows, for a note

The options (issue 40), one variant each by default (DEFAULT_VARIANTS):
- follow   the thread count follows the cores the machine leaves free, every step and between prefill
           chunks (models/runtime/threads.py, policy "follow": the default);
- one      every thread on a quiet machine, one while anything else takes a core (policy "one");
- trial    the controller before issue 40 (CPU time against threads x wall, timed trials);
- fixed    --threads 2: no controller;
- static   the C++ tasks split evenly, one range a thread (GATHERLENS_SCHEDULE=static) instead of handed
           out from a shared counter, ~4 a thread (the default, "dynamic");
- passive  OMP_WAIT_POLICY=PASSIVE (set before libgomp starts): a waiting thread sleeps at once;
- spin     GOMP_SPINCOUNT=10000: it spins a little, then sleeps.
With --llama-python (default: /work/llamacpp-venv/bin/python when it exists) llama.cpp runs the same
file, prompt tokens and threads (bench/llamacpp_case.py) quiet and busy beside them.

A variant is "NAME: [ENV=VALUE ...] [more gatherlens generate arguments]"; the variants take turns
within each repeat, so a change in the machine's load touches them alike.

For each context and variant (prose: Pride and Prejudice from `gatherlens.eval.corpus`, cut to that many
tokens with the model's own tokenizer) it runs `gatherlens generate --quantized --max-new-tokens
64 --file <text>` quiet and then with `python -c "while True: pass"` beside it, alternating, and
prints decode tokens/s, prefill tokens/s and the busy/quiet ratio of each (the median of the
repeats), then one table of the ratios. The machine is shared: before each run it waits (up to --wait s)
until the other processes use less than --max-other cores (sampled from /proc/stat over 1 s), and each
row says the 1-minute load average at its start and how many cores the other processes (neither the
run nor the busy loop) used during it (`other`), so a disturbed row can be told from a clean one.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"generated (\d+) tokens, ([\d.]+) tokens/s; context (\d+) tokens "
                     r"\(prompt (\d+), prefill ([\d.]+) s\)")
TICK = os.sysconf("SC_CLK_TCK")
DEFAULT_VARIANTS = ["follow:", "one: GATHERLENS_THREADS_POLICY=one", "trial: GATHERLENS_THREADS_POLICY=trial",
                    "fixed: --threads 2", "static: GATHERLENS_SCHEDULE=static", "passive: OMP_WAIT_POLICY=PASSIVE",
                    "spin: GOMP_SPINCOUNT=10000"]
LLAMA_VENV = Path("/work/llamacpp-venv/bin/python")


def cpu_busy() -> tuple[float, float]:
    """(busy core-seconds, total core-seconds) since boot, from /proc/stat's cpu line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / TICK, sum(fields[:8]) / TICK


def others_now(seconds: float = 1.0) -> float:
    """Cores the machine's processes use over `seconds` (this script is asleep meanwhile)."""
    b0, _ = cpu_busy()
    time.sleep(seconds)
    return (cpu_busy()[0] - b0) / seconds


def wait_quiet(max_other: float, wait: float) -> float:
    """Wait until others use < max_other cores (at most `wait` s); the last sample."""
    end = time.monotonic() + wait
    while True:
        used = others_now()
        if used < max_other or time.monotonic() > end:
            return used


def prose(tokens: int, folder: Path) -> Path:
    """A file of Pride and Prejudice cut to about `tokens` tokens of the model's tokenizer."""
    sys.path.insert(0, str(ROOT / "src"))
    from gatherlens.eval.corpus import load_text
    from gatherlens.paths import cache_root

    text = load_text("austen")
    found = sorted((cache_root() / "models").glob("smollm2-*/tokenizer.json"))
    if found:
        from tokenizers import Tokenizer

        enc = Tokenizer.from_file(str(found[0])).encode(text[: tokens * 8])
        text = text[: enc.offsets[min(tokens, len(enc.offsets)) - 1][1]]
    else:  # no converted model yet: about 4.2 characters a token
        text = text[: int(tokens * 4.2)]
    path = folder / f"austen-{tokens}.txt"
    path.write_text(text, encoding="utf-8")
    return path


def run_once(text: Path, busy: bool, env: dict, args: list[str], new_tokens: int) -> dict:
    """One `gatherlens generate` run (with the busy loop beside it or not): its speeds and the load."""
    load1 = os.getloadavg()[0]
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    time.sleep(0.3 if busy else 0)  # the loop is running before the model starts
    b0, w0 = cpu_busy()[0], time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "gatherlens", "generate", "--quantized", "--max-new-tokens", str(new_tokens),
           "--file", str(text), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "400", **env}, cwd=ROOT)
    if loop is not None:
        loop.kill()
        loop.wait()
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - w0
    ours = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # the run and the loop
    m = SUMMARY.search(out.stderr)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"gatherlens generate failed ({out.returncode}):\n{out.stderr[-2000:]}")
    prompt, prefill = int(m[4]), float(m[5])
    return {"busy": busy, "decode_tps": float(m[2]), "prefill_tps": prompt / prefill, "prompt": prompt,
            "load1": round(load1, 2), "other": round(max(0.0, (cpu_busy()[0] - b0) - ours) / wall, 2)}


def summarize(rows: list[dict], context: int, name: str) -> dict:
    """The medians of the quiet and busy runs of one variant at one context, and the ratios."""
    def med(busy, key):
        return statistics.median(r[key] for r in rows if r["busy"] is busy)

    s = {"variant": name, "context": context, "prompt": rows[0]["prompt"]}
    for key in ("decode_tps", "prefill_tps"):
        s[f"quiet_{key}"], s[f"busy_{key}"] = med(False, key), med(True, key)
        s[f"{key}_ratio"] = s[f"busy_{key}"] / s[f"quiet_{key}"]
    return s


def variant(spec: str) -> tuple[str, dict, list[str]]:
    """"passive: OMP_WAIT_POLICY=PASSIVE --threads 2" -> (name, environment, generate arguments)."""
    name, _, rest = spec.partition(":")
    words = shlex.split(rest)
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w))
    return name.strip(), env, [w for w in words if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)]


def measure(context: int, text: Path, variants: list, o) -> list[dict]:
    """Each repeat: every variant quiet, then busy; the summaries (printed as they come)."""
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for _ in range(o.repeats):
        for name, env, args in variants:
            for busy in (False, True):
                before = wait_quiet(o.max_other, o.wait)
                r = run_once(text, busy, env, args, o.max_new_tokens)
                rows[name].append(r)
                print(f"  {context:>5} {name:>10} {'busy ' if busy else 'quiet'}: decode {r['decode_tps']:6.1f} "
                      f"tok/s, prefill {r['prefill_tps']:7.1f} tok/s (load1 {r['load1']}, others "
                      f"{before:.2f} before, {r['other']} during)", flush=True)
    out = []
    for name, _, _ in variants:
        s = summarize(rows[name], context, name)
        out.append({"summary": s, "rows": rows[name]})
        print(f"{context} tokens (prompt {s['prompt']}), {name}: decode {s['quiet_decode_tps']:.1f} -> "
              f"{s['busy_decode_tps']:.1f} tok/s busy ({s['decode_tps_ratio']:.2f}x); prefill "
              f"{s['quiet_prefill_tps']:.0f} -> {s['busy_prefill_tps']:.0f} tok/s ({s['prefill_tps_ratio']:.2f}x)",
              flush=True)
    return out


def llama_rows(context: int, text: Path, python: str, o) -> dict:
    """llama.cpp on the same file, prompt tokens and threads, quiet then busy (alternating, --repeats pairs)."""
    sys.path.insert(0, str(ROOT / "src"))
    from gatherlens.bench.fresh import run_script
    from gatherlens.bench.generate_peers import SCRIPT
    from gatherlens.models import load, resolve

    lm = load("smollm2", quantized=True)
    prompt = lm.encode(text.read_text(encoding="utf-8"), truncation=False)[0].tolist()
    spec = dict(gguf=str(resolve("smollm2").path), prompt=prompt, threads=o.threads, steps=32)
    rows = []
    for _ in range(o.repeats):
        for busy in (False, True):
            wait_quiet(o.max_other, o.wait)
            loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            time.sleep(0.3 if busy else 0)
            try:
                r = run_script(python, str(SCRIPT), spec)
            finally:
                if loop is not None:
                    loop.kill()
                    loop.wait()
            rows.append({"busy": busy, "decode_tps": 1e3 / r["ms"], "prefill_tps": r["prefill_tokens_per_s"],
                         "prompt": len(prompt)})
            print(f"  {context:>5} {'llama.cpp':>10} {'busy ' if busy else 'quiet'}: decode "
                  f"{rows[-1]['decode_tps']:6.1f} tok/s, prefill {rows[-1]['prefill_tps']:7.1f} tok/s", flush=True)
    s = summarize(rows, context, "llama.cpp")
    return {"summary": s, "rows": rows}


def print_ratios(results: list[dict]) -> None:
    """One line per variant: busy / quiet decode and prefill at each context."""
    contexts = sorted({r["summary"]["context"] for r in results})
    names = list(dict.fromkeys(r["summary"]["variant"] for r in results))
    cell = {(r["summary"]["variant"], r["summary"]["context"]): r["summary"] for r in results}
    print("\nbusy / quiet (one core kept busy by `python -c \"while True: pass\"`; goal >= 0.4x)")
    print(f"{'variant':>10} " + " ".join(f"{f'{c} decode':>12} {f'{c} prefill':>12}" for c in contexts))
    for name in names:
        parts = []
        for c in contexts:
            s = cell.get((name, c))
            parts += [f"{s['decode_tps_ratio']:>11.2f}x", f"{s['prefill_tps_ratio']:>11.2f}x"] if s else ["-", "-"]
        print(f"{name:>10} " + " ".join(f"{x:>12}" for x in parts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="300,4096", help="prompt lengths in tokens, comma-separated")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (gatherlens: all the CPUs)")
    p.add_argument("--llama-python", default=str(LLAMA_VENV) if LLAMA_VENV.exists() else None,
                   help="llama-cpp-python's interpreter (default: /work/llamacpp-venv/bin/python if it exists)")
    p.add_argument("--repeats", type=int, default=2, help="quiet/busy pairs per context and variant")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--variant", action="append", default=[], help='"NAME: [ENV=VALUE ...] [generate arguments]"')
    p.add_argument("--max-other", type=float, default=0.3, help="wait until others use fewer cores")
    p.add_argument("--wait", type=float, default=120.0, help="longest wait for a quiet machine, s")
    p.add_argument("--json", default=None, help="also write the rows and summaries here")
    o = p.parse_args()
    variants = [variant(v) for v in o.variant or DEFAULT_VARIANTS]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for context in (int(c) for c in o.contexts.split(",")):
            text = prose(context, Path(tmp))
            results += measure(context, text, variants, o)
            if o.llama_python:
                results.append(llama_rows(context, text, o.llama_python, o))
    print_ratios(results)
    if o.json:
        Path(o.json).write_text(json.dumps({"variants": o.variant, "results": results}, indent=1))


if __name__ == "__main__":
    main()
