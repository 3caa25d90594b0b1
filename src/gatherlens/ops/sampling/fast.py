"""The sampler as a few vectorized torch calls: naive.py's chain, the same signature and choices.

    >>> g = torch.Generator().manual_seed(0)
    >>> sample(logits, SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), history=ids, generator=g)
    1042

What makes it fast: the penalties touch only the window's distinct ids (`torch.unique`); top-k is
`torch.topk` (no sort of the vocabulary) with its ties resolved as the reference does (lower id first);
without top-k a best-first prefix of PREFIX ids is tried first, 16 times wider until top-p, min-p and the
draw are decided inside it (a peaked distribution never sorts the whole vocabulary; a record, which lists
every candidate, does). The cuts compare in the logits' own precision; the kept candidates' softmax and
the draw's cumulative sum run in float64, as the reference's. The uniform is one float64 `torch.rand`
from the generator, as in naive.py, so a seed gives the same token in both (up to float32 rounding of
the penalties at a boundary).
"""
from __future__ import annotations

import math

import torch

from gatherlens.ops.sampling.checks import check_history, check_logits
from gatherlens.ops.sampling.config import SamplingConfig
from gatherlens.ops.sampling.naive import penalty_window
from gatherlens.ops.sampling.record import Cut, SampleRecord

__all__ = ["sample", "greedy", "PREFIX"]

PREFIX = 64  # candidates looked at first when no top-k bounds them (see _choose)


def _penalize(x: torch.Tensor, window: torch.Tensor, config: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """x (V,) with the penalties applied to the window's ids (a new tensor); the ids changed (m,)."""
    ids, counts = torch.unique(window, return_counts=True)  # (m,) ascending, (m,)
    v = x[ids]  # (m,)
    v = torch.where(v <= 0, v * config.repeat_penalty, v / config.repeat_penalty)  # (m,)
    v = v - (counts.to(v.dtype) * config.frequency_penalty + config.presence_penalty)  # (m,)
    x = x.clone()
    x[ids] = v
    return x, ids


def _best_first(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best logits of x (V,) and their ids, best first, equal logits in id order: (k,), (k,)."""
    if 0 < k < x.shape[0]:
        floor = torch.topk(x, k, sorted=False).values.min()  # the k-th best value
        ids = (x >= floor).nonzero().squeeze(1)  # (k',) ascending; k' > k only on ties at the floor
        order = torch.sort(x[ids], descending=True, stable=True).indices[:k]  # (k,)
        ids = ids[order]
        return x[ids], ids
    values, ids = torch.sort(x, descending=True, stable=True)  # (V,), (V,)
    return values, ids


def _cut(values: torch.Tensor, ids: torch.Tensor, config: SamplingConfig, stages: list, whole: bool,
         lse: torch.Tensor) -> tuple | None:
    """Steps 4-5 of naive.py on a best-first prefix (values, ids) (m,) of the candidates: what top-p
    and min-p leave, each stage's (name, ids) appended to `stages`; None when the prefix is too short
    to decide (whole: it holds every candidate; lse: the candidates' log-sum-exp at temperature 1)."""
    if config.top_p < 1:
        cumulative = torch.exp(values.double() - lse).cumsum(0)  # (m,)
        n = int(torch.searchsorted(cumulative, torch.tensor([config.top_p], dtype=torch.float64))) + 1
        if n > values.shape[0] and not whole:
            return None
        values, ids = values[:n], ids[:n]  # (n,)
        stages.append(("top_p", ids))
    if config.min_p > 0:
        n = int((values >= values[0] + math.log(config.min_p)).sum())  # a best-first prefix
        if n == values.shape[0] and config.top_p == 1 and not whole:
            return None
        values, ids = values[:n], ids[:n]  # (n,)
        stages.append(("min_p", ids))
    return values, ids


def _draw(values: torch.Tensor, ids: torch.Tensor, temperature: float, uniform: float,
          lse: torch.Tensor | None) -> tuple | None:
    """Steps 6-7 on the kept (n,) best first: their distribution at the temperature and the token, or
    None when the draw falls past this prefix. lse: the log-sum-exp at the temperature of every
    candidate when the prefix is not all of them (None: renormalize over the prefix)."""
    scaled = values.double() / temperature  # (n,)
    probs = torch.softmax(scaled, 0) if lse is None else torch.exp(scaled - lse)  # (n,)
    cumulative = probs.cumsum(0)  # (n,)
    at = int(torch.searchsorted(cumulative, torch.tensor([uniform], dtype=torch.float64), right=True))
    if lse is not None and at >= ids.shape[0]:
        return None
    return probs, int(ids[min(at, ids.shape[0] - 1)])


def _choose(x: torch.Tensor, config: SamplingConfig, candidates: int, uniform: float, top_k: bool,
            whole: bool) -> tuple:
    """The cuts and the draw over x's best `candidates` logits (top_k: they are top-k's): (stages,
    kept, probs, token). Unless `whole`, a best-first prefix of PREFIX logits is tried first, 16 times
    more until the cuts and the draw are decided inside it: no sort of the whole vocabulary for a
    peaked distribution."""
    m = candidates if whole else min(candidates, PREFIX)
    # every candidate's log-sum-exp at temperature 1 and at the temperature (-inf ones add nothing)
    lse1, lse_t = (None, None) if whole else (torch.logsumexp(x.double(), 0),
                                              torch.logsumexp(x.double() / config.temperature, 0))
    while True:
        done = m >= candidates
        values, ids = _best_first(x, m if m < x.shape[0] else 0)  # (m,), (m,) best first
        values, ids = values[:candidates], ids[:candidates]
        stages = [("top_k", ids)] if top_k else []
        kept = _cut(values, ids, config, stages, done, torch.logsumexp(values.double(), 0) if done else lse1)
        if kept is not None:
            renormalize = done or len(stages) > int(top_k)  # all candidates, or top-p / min-p cut them
            drawn = _draw(*kept, config.temperature, uniform, None if renormalize else lse_t)
            if drawn is not None:
                return stages, kept[1], *drawn
        m = min(m * 16, candidates)


def greedy(logits: torch.Tensor) -> int:
    """The id of the largest of logits (V,): `int(logits.argmax())` (the first of equal maxima, a NaN before
    any number), read by numpy's vectorized argmax for a CPU float32 row: torch's CPU argmax walks a 262K
    vocabulary in ~1.5 ms, numpy's in ~0.06 (tests/test_sampling.py holds them equal).

        >>> greedy(torch.tensor([0.5, 2.0, 2.0, -1.0]))
        1
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 1:
        import numpy as np

        return int(np.argmax(logits.detach().numpy()))
    return int(logits.argmax())


def sample(logits: torch.Tensor, config: SamplingConfig, history=None,
           generator: torch.Generator | None = None, *, record: bool = False):
    """The next token id from logits (V,) under `config` (naive.naive_sample's chain and signature);
    with record=True (id, SampleRecord)."""
    vocab, finite = check_logits(logits)
    x, changed = logits.detach().float(), None  # (V,)
    if config.penalized:
        window = penalty_window(check_history(history, vocab).to(x.device), config.penalty_last_n)
        if window.numel():
            x, changed = _penalize(x, window, config)
    if config.greedy:
        token = greedy(x)  # the first of equal maxima: the lower id
        if not record:
            return token
        return token, _record(x, changed, [], torch.tensor([token]), torch.ones(1, dtype=torch.float64), None,
                              token, 0.0)
    top_k = config.top_k if 0 < config.top_k < finite else 0
    uniform = float(torch.rand((), generator=generator, dtype=torch.float64))
    stages, kept, probs, token = _choose(x, config, top_k or finite, uniform, bool(top_k), bool(top_k) or record)
    if not record:
        return token
    return token, _record(x, changed, stages, kept, probs, uniform, token, config.temperature)


def _record(x, changed, stages, kept, probs, uniform, token, temperature) -> SampleRecord:
    return SampleRecord(x.double().cpu(), torch.empty(0, dtype=torch.long) if changed is None else changed.cpu(),
                        tuple(Cut(s, ids.cpu()) for s, ids in stages), kept.cpu(), probs.cpu(), uniform,
                        token, temperature)
