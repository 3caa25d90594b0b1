"""Sampling: the last gather of a forward pass, over the vocabulary.

    >>> config = SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    >>> token = sample(logits, config, history=ids, generator=torch.Generator().manual_seed(1))
    >>> token, rec = sample(logits, config, record=True)   # rec: the cuts, the kept ids, probs, the draw
    >>> Sampler(config, prompt=ids)(logits)                  # one sequence's sampler (its own generator)

llama.cpp's chain: penalties (repetition, frequency, presence) over the tokens so far, top-k,
top-p, min-p, temperature, the draw; temperature 0 is greedy. config.py holds the one
`SamplingConfig` (its checks in checks.py; presets GREEDY, LLAMA_CPP, OPENAI); naive.py the plain
float64 reference; fast.py the vectorized sampler (same signature, tested against it);
record.py the `SampleRecord` of what a draw kept; sampler.py the per-sequence `Sampler`.
Names load on first use (PEP 562): `config` imports without torch.
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

_EXPORTS = {
    "SamplingConfig": "config", "GREEDY": "config", "LLAMA_CPP": "config", "OPENAI": "config", "sample": "fast", "greedy": "fast",
    "naive_sample": "naive", "SampleRecord": "record", "Cut": "record", "STAGES": "record", "Sampler": "sampler",
}

__all__ = ["SamplingConfig", "GREEDY", "LLAMA_CPP", "OPENAI", "sample", "greedy", "naive_sample", "SampleRecord", "Cut",
           "STAGES", "Sampler"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
