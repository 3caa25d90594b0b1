"""Quality and memory of `load("smollm2", quantized=True)` against the float32 model (same weights).

    $ .venv/bin/python scripts/quantized_quality.py            # ~2 minutes on 1 thread
    $ .venv/bin/python scripts/quantized_quality.py --tokens 1000 --greedy 256 --threads 1

On Austen (gatherlens.eval's corpus reader): perplexity of `--tokens` tokens (a) as the quantized model
prefills (one forward: weights dequantized for the call, float32 GEMM) and (b) through its decode route
(one token a step: the load's default routes, q8act where it builds: x rounded to 8 bits), against the float model's one forward; how many of the
first `--greedy` next-token argmaxes agree (teacher-forced, decode route); the first token where
free-running greedy generation from the same prompt parts; resident memory of each model loaded in a
fresh process (after a short forward, so every weight was read).
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys

import torch

_RSS = """
import sys, torch
torch.set_num_threads(1)
from gatherlens.models import load
lm = load("smollm2", quantized=sys.argv[1] == "q")
with torch.no_grad():
    lm.model(lm.encode("It is a truth universally acknowledged"))
status = open("/proc/self/status").read()
print(*(int(status.split(k)[1].split()[0]) // 1024 for k in ("VmRSS:", "VmHWM:")))
"""


def nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood of ids[1:] under logits[:-1]: (S-1,)."""
    return torch.nn.functional.cross_entropy(logits[:-1].float(), ids[1:], reduction="none")  # (S-1,)


def decode_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits (S, V) fed one token a step through a DynamicCache: the decode route."""
    from transformers import DynamicCache

    cache, rows = DynamicCache(), []
    for i in range(ids.shape[0]):
        out = model(ids[i:i + 1].view(1, 1), cache=cache, use_cache=True)
        rows.append(out.logits[0, -1])  # (V,)
    return torch.stack(rows)  # (S, V)


def first_split(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (len when they never do)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def memory() -> dict:
    out = {}
    for kind in ("f", "q"):
        run = subprocess.run([sys.executable, "-c", _RSS, kind], capture_output=True, text=True, check=True)
        rss, peak = map(int, run.stdout.split()[-2:])
        out["quantized" if kind == "q" else "float32"] = (rss, peak)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--greedy", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from gatherlens.eval.corpus import load_text
    from gatherlens.models import load

    dense, quant = load("smollm2"), load("smollm2", quantized=True)
    ids = dense.encode(load_text("austen")[:20000])[0, :args.tokens]  # (S,)
    with torch.no_grad():
        ref = dense.model(ids.view(1, -1)).logits[0]  # (S, V)
        pre = quant.model(ids.view(1, -1)).logits[0]  # (S, V): the prefill route
        dec = decode_logits(quant.model, ids)  # (S, V): the decode route
    ppl = {name: math.exp(nll(lg, ids).mean().item()) for name, lg in
           (("float32", ref), ("quantized prefill", pre), ("quantized decode", dec))}
    for name, value in ppl.items():
        print(f"perplexity, {len(ids)} Austen tokens, {name:18s}: {value:.4f} "
              f"({100 * (value / ppl['float32'] - 1):+.3f}%)")
    n = args.greedy
    agree = int((ref[:n].argmax(-1) == dec[:n].argmax(-1)).sum())
    print(f"teacher-forced next-token argmax, decode route vs float32: {agree} of {n} agree")
    print(f"max |logit diff| on the first 32 positions: prefill {(pre[:32] - ref[:32]).abs().max():.2e}, "
          f"decode {(dec[:32] - ref[:32]).abs().max():.3f}")
    prompt = ids[:64].view(1, -1)  # (1, 64)
    with torch.no_grad():
        a = dense.model.generate(prompt, max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, 64:].tolist()
        b = quant.model.generate(prompt, max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, 64:].tolist()
    same = sum(x == y for x, y in zip(a, b))
    print(f"free-running greedy, {n} tokens from a 64-token Austen prompt: first difference at token "
          f"{first_split(a, b)}; {same} of {n} positions equal")
    if not args.no_memory:
        for name, (rss, peak) in memory().items():
            print(f"resident memory, fresh process, {name:9s}: {rss} MB after a forward (peak {peak} MB)")


if __name__ == "__main__":
    main()
