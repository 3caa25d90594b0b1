"""One llama.cpp decode case, run by llama-cpp-python's own interpreter (not gatherlens'):

    echo '{"gguf": "m.gguf", "prompt": [1, 2, ...], "threads": 2, "steps": 32}' | \
        /path/to/llamacpp-venv/bin/python llamacpp_case.py

It imports only llama_cpp and the standard library, so it runs in a virtualenv without torch or
gatherlens. The timing is the one of docs/peers (`gatherlens bench generate` calls it, alternating
with its own cases): `Llama(n_ctx=L+64, n_threads=T, n_threads_batch=T, n_batch=512)`, one
`llm.eval(prompt)` for the prefill, then `steps` greedy steps of `llm.sample(temp=0.0)` +
`llm.eval([tok])`, each timed alone; the median step is reported. The result is one JSON line.
"""
from __future__ import annotations

import json
import resource
import statistics
import sys
import time

SLACK = 64  # n_ctx = L + SLACK: room for the generated tokens


def rss_mb() -> float:
    """This process's resident memory now, in MB (Linux /proc; 0.0 where unreadable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


def run(spec: dict) -> dict:
    """Prefill spec["prompt"], time spec["steps"] greedy steps: ms per step (median) and memory."""
    from llama_cpp import Llama

    prompt, threads, steps = list(spec["prompt"]), int(spec["threads"]), int(spec.get("steps", 32))
    if steps >= SLACK:
        raise ValueError(f"steps must be < {SLACK}, got {steps}")
    before = rss_mb()
    llm = Llama(model_path=spec["gguf"], n_ctx=len(prompt) + SLACK, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    loaded = rss_mb()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        tok = llm.sample(temp=0.0)
        llm.eval([tok])
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {"ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
            "prefill_s": prefill, "prefill_tokens_per_s": len(prompt) / prefill, "steps": steps,
            "model_mb": loaded - before, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
            "version": getattr(sys.modules["llama_cpp"], "__version__", "?")}


def greedy(spec: dict) -> dict:
    """Prefill spec["prompt"], then spec["greedy"] greedy tokens: {"tokens": [...]} (no timing)."""
    from llama_cpp import Llama

    prompt, steps = list(spec["prompt"]), int(spec["greedy"])
    llm = Llama(model_path=spec["gguf"], n_ctx=len(prompt) + steps + 1, n_threads=int(spec["threads"]),
                n_threads_batch=int(spec["threads"]), n_batch=512, verbose=False)
    llm.eval(prompt)
    tokens = []
    for _ in range(steps):
        tokens.append(int(llm.sample(temp=0.0)))
        llm.eval([tokens[-1]])
    return {"tokens": tokens}


def main() -> None:
    spec = json.loads(sys.stdin.read())
    print(json.dumps(greedy(spec) if "greedy" in spec else run(spec)))


if __name__ == "__main__":
    main()
