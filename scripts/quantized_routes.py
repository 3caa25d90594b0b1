"""Decode speed of `load("smollm2", quantized=True)` per matmul route, side by side in one process.

    $ .venv/bin/python scripts/quantized_routes.py --context 4096 --routes int4/bf16,q8act --threads 2

Each route's model is loaded and its paged cache filled (bench/generate.py's fill: a real prefix,
tiled to the context), then the routes take turns, `--rounds` rounds of `--tokens` greedy tokens
of sparse decoding at `--budget`, so noise hits them alike. Prints ms per token per round and the
median. A route is models/gguf/quantized.py's ROUTE, or ROUTE/HEAD_ROUTE for another head route
("int4/bf16": the linears on PyTorch's int4 kernel, the head a bf16 copy; "auto" picks q8act where
it builds).
"""
from __future__ import annotations

import argparse
import statistics

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--routes", default="int4/bf16,q8act")
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from gatherlens.bench.generate import Method, _generate, fill_caches
    from gatherlens.models import load
    from gatherlens.models.gguf import quantized as q

    torch.set_num_threads(args.threads)
    method, runs, times = Method("quantized-sparse", "paged", args.budget), {}, {}
    for route in args.routes.split(","):
        q.ROUTE, _, head = route.partition("/")
        q.HEAD_ROUTE = head or q.ROUTE
        lm = load("smollm2", quantized=True)
        _, paged, ids = fill_caches(lm, args.context, args.tokens, False)
        with torch.inference_mode():
            _generate(lm.model, method, ids, None, paged, 2, args.context)  # warm-up
        runs[route], times[route] = (lm, paged, ids), []
    for r in range(args.rounds):
        for route, (lm, paged, ids) in runs.items():
            with torch.inference_mode():
                wall, _ = _generate(lm.model, method, ids, None, paged, args.tokens, args.context)
            times[route].append(wall * 1e3)
            print(f"round {r}  {route:8s} {wall * 1e3:6.1f} ms/token", flush=True)
    for route, ms in times.items():
        print(f"{route:8s} median {statistics.median(ms):6.1f} ms/token at L = {args.context}")


if __name__ == "__main__":
    main()
