"""The plain float64 reference sampler: the chain written out step by step (the fast one is tested against it).

    >>> g = torch.Generator().manual_seed(0)
    >>> naive_sample(torch.tensor([2.0, 1.0, 0.5, -1.0]), SamplingConfig(temperature=1.0, top_k=3), generator=g)
    0

llama.cpp's chain (src/llama-sampling.cpp), in order:
1. penalties, over the last `penalty_last_n` tokens of `history`: a token seen c times has its
   logit divided by repeat_penalty (multiplied when the logit is <= 0), then minus
   c * frequency_penalty, minus presence_penalty once.
2. greedy (temperature 0): the highest logit, lower id on a tie; no draw.
3. the candidates, best first (higher logit, then lower id); top-k keeps the first k.
4. top-p: the softmax of the candidates (temperature 1); keep the first ones until their
   cumulative probability reaches top_p (the one that reaches it included).
5. min-p: keep the candidates whose logit is at least the best one's + log(min_p) (probability
   at least min_p times the best one's).
6. temperature: the kept logits divided by it, softmax: the renormalized distribution.
7. the draw: u uniform in [0, 1) from the generator (one float64 draw); the first kept token
   whose cumulative probability exceeds u.
"""
from __future__ import annotations

import math

import torch

from gatherlens.ops.sampling.checks import check_history, check_logits
from gatherlens.ops.sampling.config import SamplingConfig
from gatherlens.ops.sampling.record import Cut, SampleRecord

__all__ = ["naive_sample", "penalty_window"]


def penalty_window(history: torch.Tensor, last_n: int) -> torch.Tensor:
    """The tokens the penalties look at: the last `last_n` of history (-1: all, 0: none)."""
    if last_n == 0:
        return history[:0]
    return history if last_n < 0 else history[-last_n:]


def _penalize(x: torch.Tensor, window: list[int], config: SamplingConfig) -> list[int]:
    """Apply the penalties to x (V,) float64 in place, one token at a time; the ids changed."""
    counts: dict[int, int] = {}
    for token in window:
        counts[token] = counts.get(token, 0) + 1
    for token, count in counts.items():
        logit = float(x[token])
        logit = logit * config.repeat_penalty if logit <= 0 else logit / config.repeat_penalty
        logit -= count * config.frequency_penalty + config.presence_penalty
        x[token] = logit
    return sorted(counts)


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    total = sum(weights)
    return [w / total for w in weights]


def _cuts(x: torch.Tensor, config: SamplingConfig) -> list[Cut]:
    """Steps 3-5: the candidate ids after each stage that runs (the last one's are the kept)."""
    order = sorted(range(x.shape[0]), key=lambda i: (-float(x[i]), i))  # best first
    order = [i for i in order if float(x[i]) > -math.inf]
    stages = [Cut("all", torch.tensor(order))]
    if 0 < config.top_k < len(order):
        order = order[:config.top_k]
        stages.append(Cut("top_k", torch.tensor(order)))
    if config.top_p < 1:
        cumulative, keep = 0.0, len(order)
        for i, p in enumerate(_softmax([float(x[t]) for t in order])):
            cumulative += p
            if cumulative >= config.top_p:
                keep = i + 1
                break
        order = order[:keep]
        stages.append(Cut("top_p", torch.tensor(order)))
    if config.min_p > 0:
        floor = float(x[order[0]]) + math.log(config.min_p)
        order = [t for t in order if float(x[t]) >= floor]
        stages.append(Cut("min_p", torch.tensor(order)))
    return stages


def naive_sample(logits: torch.Tensor, config: SamplingConfig, history=None,
                 generator: torch.Generator | None = None, *, record: bool = False):
    """The next token id from logits (V,) under `config` (see the module doc); with record=True
    (id, SampleRecord). history: the token ids so far (for the penalties); generator: the source
    of the draw's uniform (None: torch's global one)."""
    vocab, _ = check_logits(logits)
    window = penalty_window(check_history(history, vocab), config.penalty_last_n).tolist()
    x = logits.detach().to("cpu", torch.float64).clone()  # (V,)
    changed = _penalize(x, window, config) if config.penalized else []
    if config.greedy:
        token = max(range(vocab), key=lambda i: (float(x[i]), -i))
        kept, probs, uniform, stages = [token], [1.0], None, []
    else:
        stages = _cuts(x, config)[1:]
        kept = (stages[-1] if stages else _cuts(x, config)[0]).ids.tolist()
        probs = _softmax([float(x[t]) / config.temperature for t in kept])
        uniform = float(torch.rand((), generator=generator, dtype=torch.float64))
        cumulative, token = 0.0, kept[-1]
        for t, p in zip(kept, probs):
            cumulative += p
            if cumulative > uniform:
                token = t
                break
    if not record:
        return token
    return token, SampleRecord(x, torch.tensor(changed, dtype=torch.long), tuple(stages),
                               torch.tensor(kept, dtype=torch.long), torch.tensor(probs, dtype=torch.float64),
                               uniform, token, config.temperature)
