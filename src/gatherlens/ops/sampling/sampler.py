"""A sampler for one sequence: its config, its own seeded generator and the tokens so far.

    >>> sampler = Sampler(SamplingConfig(temperature=0.7, top_p=0.9, seed=42), prompt=ids[0].tolist())
    >>> token = sampler(logits)                 # (V,) -> the next id; it joins the history
    >>> token, rec = sampler(logits, record=True)

The same config (seed included) and the same logits give the same tokens: the generator is a
`torch.Generator` of its own, seeded once (a config without a seed gets a random one, so two
samplers differ). The history (the prompt, then every token chosen) feeds the penalties.
`Sampler(config, method="naive")` draws with the float64 reference instead (same choices).
"""
from __future__ import annotations

import secrets

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.sampling.config import SamplingConfig
from gatherlens.ops.sampling.fast import sample
from gatherlens.ops.sampling.naive import naive_sample

__all__ = ["Sampler", "METHODS"]

METHODS = {"fast": sample, "naive": naive_sample}


class Sampler:
    """Call with logits (V,) -> the next token id (see the module doc)."""

    def __init__(self, config: SamplingConfig, prompt=(), method: str = "fast"):
        if not isinstance(config, SamplingConfig):
            raise GatherValueError(f"config must be a SamplingConfig, got {type(config).__name__}")
        if method not in METHODS:
            raise GatherValueError(f"method = {method!r} is not one of {sorted(METHODS)}")
        self.config, self.method = config, METHODS[method]
        self.seed = config.seed if config.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(self.seed % (1 << 64))
        keep = config.penalty_last_n if config.penalty_last_n > 0 else None
        self.history = [int(t) for t in prompt][-keep:] if keep else [int(t) for t in prompt]

    def __call__(self, logits: torch.Tensor, record: bool = False):
        history = self.history if self.config.penalized else None
        out = self.method(logits, self.config, history, self.generator, record=record)
        self.push(out[0] if record else out)
        return out

    def push(self, token: int) -> None:
        """Add a token to the history (one the sampler did not choose, such as a forced one)."""
        self.history.append(int(token))
        keep = self.config.penalty_last_n
        if keep > 0 and len(self.history) > 4 * keep:  # bounded: only the last penalty_last_n matter
            del self.history[:-keep]
