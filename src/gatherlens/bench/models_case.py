"""The cases of `gatherlens bench models` that run gatherlens, each in a fresh process (bench/fresh.py).

    >>> run_fresh("gatherlens.bench.models_case", dict(case="load", gguf=path, threads=2, spawn=time.time()))
    {"load_s": 1.2, "first_token_s": 4.0, "rss_mb": 610.0, ...}

- load: a fresh interpreter imports gatherlens, runs `load(file, quantized=True)` and one forward pass of a
  short prompt; the times since the parent started the process (`spawn`, the parent's clock) and
  `load()`'s own.
- decode: the loop `gatherlens generate --quantized` runs (bench/generate_cli.py's `time_cli`: the real
  prefill of `context` prompt tokens, then greedy decode), its prefill seconds and decode seconds per
  token; the prompt's ids go back for llama.cpp to prefill the same tokens.
- reference: the float model (`load(F16 file)`, transformers' modules in float32, uncached) over a
  text, teacher-forced: its top-1 at each of `steps` positions after a `prefix`, and the ids.
- forced: the quantized model decoding those ids teacher-forced the way `generate` decodes (sparse
  decoding over a SparseKVCache, one token a step): its top-1 at the same positions.
"""
from __future__ import annotations

import resource
import time

__all__ = ["run_case", "text_ids"]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def load_case(spec: dict) -> dict:
    t_start = time.time()
    import torch

    from gatherlens.models import load
    from gatherlens.models.loading import TEXT_RUNTIME
    from gatherlens.models.runtime.generation import generation_steps

    torch.set_num_threads(spec["threads"])
    t_import = time.time()
    lm = load(spec["gguf"], quantized=True, runtime=TEXT_RUNTIME)  # as `gatherlens generate` loads it
    t_loaded = time.time()
    ids = lm.encode("The cat sat on the mat.")  # (1, S)
    with torch.inference_mode():  # the first token as generate makes it (either runtime)
        list(generation_steps(lm, ids, budget=None, max_new_tokens=1))
    t_first, spawn = time.time(), float(spec["spawn"])
    return {"start_s": t_start - spawn, "import_s": t_import - t_start, "load_s": lm.seconds,
            "loaded_s": t_loaded - spawn, "first_token_s": t_first - spawn, "rss_mb": _peak_mb(),
            "prompt": ids[0].tolist()}


def decode_case(spec: dict) -> dict:
    import torch

    from gatherlens.bench.generate import prompt_tokens
    from gatherlens.bench.generate_cli import time_cli
    from gatherlens.models import load
    from gatherlens.models.loading import TEXT_RUNTIME

    torch.set_num_threads(spec["threads"])
    lm = load(spec["gguf"], quantized=True, runtime=TEXT_RUNTIME)  # as `gatherlens generate` loads it
    ids = torch.tensor([prompt_tokens(lm, spec["context"])])  # (1, L)
    run = time_cli(lm, ids, spec["budget"], spec["tokens"] + 1, pages=False)
    return {"ms": run["wall"] * 1e3, "cpu_ms": run["cpu"] * 1e3, "prefill_s": run["prefill"],
            "rss_mb": _peak_mb(), "prompt": ids[0].tolist()}


def text_ids(lm, n: int) -> list[int]:
    """The first n tokens of Austen's Emma (the default corpus where Austen is not installed)."""
    from gatherlens.eval.corpus import austen_available, load_text

    text = load_text("austen:emma" if austen_available() else "default")
    return lm.encode(text[: 40 * n], truncation=False)[0, :n].tolist()


def reference_case(spec: dict) -> dict:
    """The float model's teacher-forced top-1 after each of ids[prefix - 1 : prefix + steps - 1]."""
    import torch
    from transformers import DynamicCache

    from gatherlens.models import load

    torch.set_num_threads(spec["threads"])
    lm = load(spec["reference"], use_cache_dir=False)
    prefix, steps = spec["prefix"], spec["steps"]
    ids = torch.tensor([text_ids(lm, prefix + steps)])  # (1, P + n)
    cache, top1, chunk = DynamicCache(config=lm.model.config), [], 128
    with torch.inference_mode():
        for start in range(0, prefix + steps - 1, chunk):
            piece = ids[:, start:min(start + chunk, prefix + steps - 1)]  # (1, c)
            logits = lm.model(input_ids=piece, past_key_values=cache, use_cache=True).logits[0]  # (c, V)
            top1 += logits.argmax(-1).tolist()
    return {"ids": ids[0].tolist(), "top1": top1[prefix - 1:], "rss_mb": _peak_mb()}


def forced_case(spec: dict) -> dict:
    """The quantized model's teacher-forced top-1, decoding as `generate` does (sparse, a token a step)."""
    import torch

    from gatherlens.models import load
    from gatherlens.models.runtime.decoding import (SparseKVCache, sparse_settings, use_dense_decoding,
                                                    use_sparse_decoding)
    from gatherlens.models.runtime.generation import last_logits

    torch.set_num_threads(spec["threads"])
    lm = load(spec["gguf"], quantized=True)
    ids, prefix = spec["ids"], spec["prefix"]
    model = lm.model
    use_sparse_decoding(model, budget=spec["budget"])
    settings = sparse_settings(model)
    cache = SparseKVCache(config=model.config, page_size=settings.page_size, kv_dtype=settings.kv_dtype)
    cache.reserve(len(ids))
    with torch.inference_mode():
        top1 = [int(last_logits(model, cache, torch.tensor([ids[:prefix]])).argmax())]
        for tok in ids[prefix:-1]:
            top1.append(int(last_logits(model, cache, torch.tensor([[tok]])).argmax()))
    use_dense_decoding(model)
    return {"top1": top1, "rss_mb": _peak_mb()}


CASES = {"load": load_case, "decode": decode_case, "reference": reference_case, "forced": forced_case}


def run_case(spec: dict) -> dict:
    return CASES[spec["case"]](spec)
