"""The one sampling configuration: what the chain of cuts keeps and how the draw is made.

    >>> SamplingConfig()                                  # greedy (temperature 0): generate's default
    >>> SamplingConfig(temperature=0.8, top_k=40, seed=7)
    >>> LLAMA_CPP                                         # llama-server's defaults
    >>> SamplingConfig(top_p=1.5)
    GatherValueError: top_p = 1.5 is outside the valid range (0, 1] (the probability mass top-p keeps; 1: off)

The chain is llama.cpp's (`common_sampler`): penalties over the tokens so far, top-k, top-p, min-p,
temperature, the draw. Every setting is checked when the config is made (checks.py), so a sampler
never meets a bad one. Importable without torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gatherlens.ops.sampling.checks import check_config

__all__ = ["SamplingConfig", "GREEDY", "LLAMA_CPP", "OPENAI"]


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from the logits.

    temperature:       0 picks the highest logit (greedy; the penalties still apply); > 0 divides the
                       kept logits by it before the draw.
    top_k:             keep the k highest logits; 0: off.
    top_p:             keep the fewest best tokens whose probability (at temperature 1) reaches p; 1: off.
    min_p:             keep tokens whose probability is at least min_p times the best one's; 0: off.
    repeat_penalty:    a logit of a token in the window is divided by it (multiplied when <= 0); 1: off.
    frequency_penalty: minus this times the token's count in the window (OpenAI's, llama.cpp's); 0: off.
    presence_penalty:  minus this once for a token present in the window; 0: off.
    penalty_last_n:    the window: the last n tokens so far (prompt and generated); -1: all; 0: none.
    seed:              the torch.Generator's seed (None: a fresh random one per sampler).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None

    def __post_init__(self):
        check_config(self)

    @property
    def greedy(self) -> bool:
        """True at temperature 0: the highest (penalized) logit, no draw."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """True when some penalty changes logits (and a window holds tokens)."""
        return self.penalty_last_n != 0 and (self.repeat_penalty != 1 or self.frequency_penalty != 0
                                             or self.presence_penalty != 0)

    def replace(self, **changes) -> "SamplingConfig":
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)


GREEDY = SamplingConfig()
# llama-server's defaults (tools/server/README.md: --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05, penalties off)
LLAMA_CPP = SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
# OpenAI's API reference: temperature 1, top_p 1 (no other cut), no penalties
OPENAI = SamplingConfig(temperature=1.0)
