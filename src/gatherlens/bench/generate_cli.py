"""The "cli" rows of `gatherlens bench generate`: decode timed through the loop `gatherlens generate` runs.

    >>> spec = dict(model="smollm2", quantized=True, context=4096, tokens=8, rounds=3, threads=2,
    ...             methods=[vars(m) for m in bench.generate.cli_methods(512)])
    >>> res = run_fresh("gatherlens.bench.generate_cli", spec)      # its own fresh process
    >>> res["wall"]["cli"], res["wall"]["cli/pages"]                # s per token, as the command says

The other rows time `model.generate` over caches filled by tiling a prefix's keys; a user runs
`gatherlens generate`, whose loop is `models/streaming.stream_generate` over
`models/generation.generation_steps`: the real prefill of the prompt into a SparseKVCache, then per
token the file-watch checks, the thread controller, the forward pass, the argmax, the incremental
detokenizer and the event, streamed to `on_token` (the command writes and flushes each piece; here
a memory buffer). "cli" runs it with the page trace off, "cli/pages" with it on (`--pages`). The
prompt is the same tokens llama.cpp prefills (the tiled real prefix); the time is the command's
own: decode seconds over the tokens after the first (its tokens/s), one generation of
tokens x rounds + 1 tokens per row. The bench sets OMP_NUM_THREADS, so the thread controller is off
here as with `gatherlens generate --threads N`. Past the model's positions the command would
keep the prompt's end; these rows keep all of it (speed only, like the others).
"""
from __future__ import annotations

import io
import resource
import time

from gatherlens.bench.generate import CLI_PAGES, prompt_tokens
from gatherlens.bench.llamacpp_case import rss_mb

__all__ = ["run_case", "time_cli"]


def time_cli(lm, ids, budget: int | None, new_tokens: int, pages: bool) -> dict:
    """One `stream_generate` as the command runs it: {"wall", "cpu": s per decode token, "prefill": s,
    "tokens": generated}; the pieces go to a buffer, written and flushed one by one as the command does."""
    from gatherlens.models.runtime.streaming import stream_generate

    out, marks = io.StringIO(), {}

    def on_token(piece: str, result) -> None:
        out.write(piece)
        out.flush()
        if len(result.new_ids) == 1:  # the prefill's token: decode time starts now
            marks["cpu"] = time.process_time()

    result = stream_generate(lm, ids, budget, new_tokens, on_token=on_token, pages=pages)
    n = len(result.new_ids) - 1
    cpu = (time.process_time() - marks["cpu"]) / n if n > 0 else float("nan")
    wall = result.decode_seconds / n if n > 0 else float("nan")
    return {"wall": wall, "cpu": cpu, "prefill": result.prefill_seconds, "tokens": len(result.new_ids),
            "text": out.getvalue()}


def run_case(spec: dict) -> dict:
    """Load the model (quantized with spec["quantized"]), time each cli method on the prompt of
    spec["context"] tokens: generate_cli's result, shaped as bench.generate.run_case's."""
    import torch

    from gatherlens.models import load
    from gatherlens.models.loading import TEXT_RUNTIME

    torch.set_num_threads(spec["threads"])
    before = rss_mb()
    # as `gatherlens generate` loads it: the native runtime where it runs the file
    lm = load(spec["model"], quantized=True, runtime=TEXT_RUNTIME) if spec.get("quantized") else load(spec["model"])
    model_mb = rss_mb() - before
    ids = torch.tensor([prompt_tokens(lm, spec["context"])])  # (1, L): the tokens llama.cpp prefills
    new_tokens = spec["tokens"] * spec["rounds"] + 1
    runs = {m["name"]: time_cli(lm, ids, m["budget"], new_tokens, m["name"] == CLI_PAGES) for m in spec["methods"]}
    return {"wall": {k: r["wall"] for k, r in runs.items()}, "cpu": {k: r["cpu"] for k, r in runs.items()},
            "attention": dict.fromkeys(runs), "prefill": {k: r["prefill"] for k, r in runs.items()},
            "generated": {k: r["tokens"] for k, r in runs.items()},
            "positions": getattr(lm.config, "max_position_embeddings", None), "model_mb": model_mb,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3, "prompt": None}
