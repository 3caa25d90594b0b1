"""Bytes of K/V one decode step reads, and holds, per layer kind of a sliding-window model.

    .venv/bin/python scripts/window_bytes.py                      # the table in docs/bench/notes.md
    .venv/bin/python scripts/window_bytes.py --context 4096 --window 512 --budget 256

A random Gemma-3-shaped text model (5 local layers : 1 global, 4 query heads on one KV head of
256, fp32) is prefilled with `--context` tokens, then decodes a few
tokens with `use_sparse_decoding`. Measured, not computed from the config: every local step's
WindowKV (the ring it reads) and every global step's PageSelection (the pages it gathers, plus
the page summaries it scores), from the tensors handed to the ops; what a layer holds is its
cache's storage after the run. "before" is the full-attention path, as if there were no window:
every layer reads (and holds) its whole K and V, as a dense DynamicCache without a window does.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import transformers

import gatherlens.models.attention.sparse as sparse_attention
from gatherlens.models.runtime.decoding import observe_sparse, use_sparse_decoding


def build(window: int):
    torch.manual_seed(0)
    types = ["sliding_attention"] * 5 + ["full_attention"]
    cfg = transformers.Gemma3TextConfig(vocab_size=100, hidden_size=64, intermediate_size=64, num_hidden_layers=6,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                        sliding_window=window, layer_types=types, max_position_embeddings=1 << 16,
                                        pad_token_id=0, bos_token_id=None, eos_token_id=None)
    return transformers.Gemma3ForCausalLM(cfg).eval()


def measure(context: int, window: int, budget: int, steps: int, page_size: int, share: bool) -> dict:
    model = build(window)
    use_sparse_decoding(model, budget=budget, page_size=page_size, dense_layers=0, share_selection=share)
    reads = defaultdict(list)  # kind -> bytes per layer step
    plain = sparse_attention.window_decode

    def counting(query, kv, *args):  # a local step: the ring rows it reads
        reads["local"].append(kv.keys.nbytes + kv.values.nbytes)
        return plain(query, kv, *args)

    def pages(call):  # a global step: the gathered pages and the scored summaries
        c, sel = call.cache, call.selection
        rows = sel.pages.numel() * c.page_size  # (B, Hsel, n) pages of P tokens
        item = c.keys.element_size()
        reads["global"].append(rows * (c.head_dim + c.values.shape[-1]) * item + c.summaries.nbytes)

    sparse_attention.window_decode = counting
    try:
        ids = torch.randint(1, 100, (1, context), generator=torch.Generator().manual_seed(1))
        with torch.no_grad(), observe_sparse(pages):
            out = model.generate(ids, max_new_tokens=steps + 1, do_sample=False, return_dict_in_generate=True)
    finally:
        sparse_attention.window_decode = plain
    held = {"local": [], "global": []}
    for layer in out.cache.layers:
        kind = "local" if layer.is_sliding else "global"
        held[kind].append(layer.keys.nbytes + layer.values.nbytes)
    L = context + steps
    k = out.cache.layers[0].keys  # (B, Hkv, n, D)
    full = 2 * k.shape[0] * k.shape[1] * L * k.shape[3] * k.element_size()  # K and V of L tokens
    return {"reads": {k_: max(v) for k_, v in reads.items()}, "held": {k_: max(v) for k_, v in held.items()},
            "full": full, "L": L}


def table(r: dict, args) -> str:
    mib = lambda b: f"{b / 2**20:.2f} MiB"
    share = "shared" if args.share_selection else "per query head"
    rows = [f"| layer kind | read per step, before | read per step, after | held, before | held, after |",
            "|---|---|---|---|---|",
            f"| local (window {args.window}) | {mib(r['full'])} | {mib(r['reads']['local'])} | {mib(r['full'])} | "
            f"{mib(r['held']['local'])} |",
            f"| global (budget {args.budget}, pages {share}) | {mib(r['full'])} | {mib(r['reads']['global'])} | {mib(r['full'])} | "
            f"{mib(r['held']['global'])} |"]
    return "\n".join(rows) + f"\n\n(L = {r['L']} tokens at the last step, fp32, 1 KV head x 256)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--share-selection", action="store_true", help="a KV group's query heads read the same pages")
    args = p.parse_args()
    r = measure(args.context, args.window, args.budget, args.steps, args.page_size, args.share_selection)
    print(table(r, args))


if __name__ == "__main__":
    main()
