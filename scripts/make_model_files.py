"""Write the bench's model files: random weights at the real configs of the models people download,
as F16 GGUF (gguf's writer), then Q4_K_M and Q8_0 made by llama.cpp's own quantizer. Bench-only.

    /work/main/.venv/bin/python scripts/make_model_files.py --out /work/models \\
        --llama-python /work/llamacpp-venv/bin/python                 # all six, ~20 GB, ~15 min
    ... --only gemma3-270m --presets Q4_K_M                              # one model, one preset

The configs (sizes from each model's published config.json, source beside each) are
`gatherlens.bench.model_files.REAL_MODELS`: Gemma 3 270M and 1B, Qwen2.5 0.5B and 1.5B, Qwen3 0.6B,
Llama 3.2 1B. Files are NAME.F16.gguf, NAME.Q4_K_M.gguf, NAME.Q8_0.gguf in --out (an existing file
is kept unless --force). After each file llama.cpp loads it and greedily decodes 4 tokens (the
smoke check; --no-check skips it). llama-cpp-python runs in its own virtualenv (/work/shared/peers.md),
never in the project's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gatherlens.bench.fresh import run_script
from gatherlens.bench.generate_peers import SCRIPT
from gatherlens.bench.model_files import REAL_MODELS, write_model

PRESETS = ("Q4_K_M", "Q8_0")


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("/work/models"))
    p.add_argument("--only", nargs="*", choices=sorted(REAL_MODELS), help="these models only")
    p.add_argument("--presets", nargs="*", default=list(PRESETS), help="llama.cpp ftypes to quantize to")
    p.add_argument("--dtype", default="F16", choices=("F16", "F32"), help="the unquantized file's matrices")
    p.add_argument("--llama-python", default="/work/llamacpp-venv/bin/python")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--force", action="store_true", help="write files that exist again")
    p.add_argument("--no-check", action="store_true", help="skip llama.cpp's load-and-decode check")
    return p.parse_args(argv)


def _smoke(python: str, path: Path, threads: int) -> str:
    """llama.cpp loads `path` and decodes 4 greedy tokens after a short prompt: 'ok ...' or the error."""
    try:
        out = run_script(python, str(SCRIPT), dict(gguf=str(path), prompt=[10, 20, 30, 40], threads=threads, greedy=4))
    except Exception as e:  # noqa: BLE001 - reported in the table, the next file goes on
        return f"FAILED: {str(e).strip().splitlines()[-1][:200]}"
    return f"ok {out['tokens']}"


def _one(name: str, args) -> list[tuple[str, str, str]]:
    """Write one model's files; (file, seconds, llama.cpp check) per file."""
    rows, base = [], args.out / f"{name}.{args.dtype}.gguf"
    if args.force or not base.exists():
        t0 = time.perf_counter()
        write_model(REAL_MODELS[name], base, dtype=args.dtype)
        rows.append((base.name, f"{time.perf_counter() - t0:.0f} s", ""))
    for preset in args.presets:
        out = args.out / f"{name}.{preset}.gguf"
        if args.force or not out.exists():
            spec = dict(quantize=str(base), out=str(out), ftype=preset, threads=args.threads)
            done = run_script(args.llama_python, str(SCRIPT), spec)
            rows.append((out.name, f"{done['seconds']:.0f} s", ""))
    if not args.no_check:
        files = [base] + [args.out / f"{name}.{p}.gguf" for p in args.presets]
        rows += [(f.name, "", _smoke(args.llama_python, f, args.threads)) for f in files]
    return rows


def main(argv=None) -> None:
    args = _args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(REAL_MODELS):
        for file, seconds, check in _one(name, args):
            print(f"{file:32s} {seconds:>7s}  {check}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
