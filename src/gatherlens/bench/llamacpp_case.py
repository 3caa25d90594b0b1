"""One llama.cpp decode case, run by llama-cpp-python's own interpreter (not gatherlens'):

    echo '{"gguf": "m.gguf", "prompt": [1, 2, ...], "threads": 2, "steps": 32}' | \
        /path/to/llamacpp-venv/bin/python llamacpp_case.py

With "greedy": N it returns llama.cpp's N greedy tokens instead; with "forced": [ids] the teacher-forced
top-1 after each; with "spawn": T (the parent's clock) the times of a fresh process's load and first
token; with "quantize": SRC, "out": DST, "ftype": "Q4_K_M" it runs llama.cpp's own quantizer. It imports only llama_cpp and the standard
library, so it runs in a virtualenv without torch or gatherlens. The timing is the one of docs/peers (`gatherlens bench generate` calls it, alternating
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


def _last_argmax(llm) -> int:
    """The argmax of the last evaluated token's logits (llama.cpp's own, before any sampler)."""
    import llama_cpp
    import numpy as np  # llama-cpp-python's own dependency

    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))  # (V,)
    return int(logits.argmax())


def forced(spec: dict) -> dict:
    """Teacher-forced top-1: prefill spec["prompt"], then feed each of spec["forced"] in turn; the argmax
    before each fed token (and after the last prompt token): {"top1": [...]} (len(forced) predictions)."""
    from llama_cpp import Llama

    prompt, feed = list(spec["prompt"]), list(spec["forced"])
    llm = Llama(model_path=spec["gguf"], n_ctx=len(prompt) + len(feed) + 8, n_threads=int(spec["threads"]),
                n_threads_batch=int(spec["threads"]), n_batch=512, verbose=False)
    llm.eval(prompt)
    top1 = [_last_argmax(llm)]
    for tok in feed[:-1]:
        llm.eval([tok])
        top1.append(_last_argmax(llm))
    return {"top1": top1}


def load(spec: dict) -> dict:
    """Load time of a fresh process: llama_cpp imported, `Llama(...)` built, then the first token after
    spec["prompt"]; seconds since spec["spawn"] (the parent's clock before it started this process)."""
    t_start = time.time()
    from llama_cpp import Llama

    t_import = time.time()
    llm = Llama(model_path=spec["gguf"], n_ctx=len(spec["prompt"]) + SLACK, n_threads=int(spec["threads"]),
                n_threads_batch=int(spec["threads"]), n_batch=512, verbose=False)
    t_loaded = time.time()
    llm.eval(list(spec["prompt"]))
    _last_argmax(llm)
    t_first = time.time()
    spawn = float(spec["spawn"])
    return {"start_s": t_start - spawn, "import_s": t_import - t_start, "load_s": t_loaded - t_import,
            "loaded_s": t_loaded - spawn, "first_token_s": t_first - spawn,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}


def quantize(spec: dict) -> dict:
    """llama.cpp's own quantizer: spec["quantize"] (src) -> spec["out"] in spec["ftype"] ("Q4_K_M", "Q8_0",
    ... : the name after LLAMA_FTYPE_MOSTLY_), with spec["threads"] threads: {"seconds", "out"}."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{spec['ftype']}")
    params.allow_requantize = True
    params.nthread = int(spec["threads"])
    t0 = time.perf_counter()
    code = llama_cpp.llama_model_quantize(spec["quantize"].encode(), spec["out"].encode(), ctypes.byref(params))
    if code != 0:
        raise RuntimeError(f"llama_model_quantize returned {code} for {spec['quantize']} -> {spec['ftype']}")
    return {"seconds": time.perf_counter() - t0, "out": spec["out"]}


def main() -> None:
    spec = json.loads(sys.stdin.read())
    actions = {"quantize": quantize, "greedy": greedy, "forced": forced, "spawn": load}
    action = next((f for key, f in actions.items() if key in spec), run)
    print(json.dumps(action(spec)))


if __name__ == "__main__":
    main()
