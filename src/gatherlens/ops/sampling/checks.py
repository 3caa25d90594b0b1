"""The sampler's argument checks: each error names the argument, its value and the valid range.

    >>> check_config(SamplingConfig(temperature=-1))
    GatherValueError: temperature = -1 is outside the valid range [0, 1000] (0: greedy)
"""
from __future__ import annotations

import math

from gatherlens.errors import GatherTypeError, GatherValueError, shorten

__all__ = ["check_config", "check_logits", "check_history", "SEED_RANGE", "INT_LIMIT"]

SEED_RANGE = (-(1 << 63), (1 << 64) - 1)   # what torch.Generator.manual_seed takes (a negative wraps)
INT_LIMIT = 1 << 31                        # top_k and penalty_last_n above this mean nothing more

# name -> (lo, lo open?, hi, hi open?, what it means); None: unbounded
_FLOATS = {
    "temperature": (0.0, False, 1000.0, False, "0: greedy"),
    "top_p": (0.0, True, 1.0, False, "the probability mass top-p keeps; 1: off"),
    "min_p": (0.0, False, 1.0, False, "the share of the best token's probability a token needs; 0: off"),
    "repeat_penalty": (0.0, True, 1000.0, False, "a repeated token's logit divided by it; 1: off"),
    "frequency_penalty": (-2.0, False, 2.0, False, "OpenAI's range; 0: off"),
    "presence_penalty": (-2.0, False, 2.0, False, "OpenAI's range; 0: off"),
}
_INTS = {
    "top_k": (0, INT_LIMIT, "the highest logits kept; 0: off"),
    "penalty_last_n": (-1, INT_LIMIT, "tokens the penalties look back on; -1: all, 0: none"),
}


def _range(lo, lo_open: bool, hi, hi_open: bool) -> str:
    return f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def check_float(value, name: str, lo: float, lo_open: bool, hi: float, hi_open: bool, why: str) -> float:
    """`value` as a float when it is a real number in the range, else a GatherValueError / GatherTypeError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatherTypeError(f"{name} must be a number, got {type(value).__name__} {shorten(value)}")
    x = float(value)
    inside = math.isfinite(x) and (lo < x if lo_open else lo <= x) and (x < hi if hi_open else x <= hi)
    if not inside:
        raise GatherValueError(f"{name} = {shorten(value)} is outside the valid range "
                               f"{_range(lo, lo_open, hi, hi_open)} ({why})")
    return x


def check_int_setting(value, name: str, lo: int, hi: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GatherTypeError(f"{name} must be an int, got {type(value).__name__} {shorten(value)}")
    if not lo <= value <= hi:
        raise GatherValueError(f"{name} = {shorten(value)} is outside the valid range [{lo}, {hi}] ({why})")
    return value


def check_config(config) -> None:
    """Every field of a SamplingConfig in its range (called when one is made)."""
    for name, (lo, lo_open, hi, hi_open, why) in _FLOATS.items():
        check_float(getattr(config, name), name, lo, lo_open, hi, hi_open, why)
    for name, (lo, hi, why) in _INTS.items():
        check_int_setting(getattr(config, name), name, lo, hi, why)
    if config.seed is not None:
        check_int_setting(config.seed, "seed", *SEED_RANGE, "a torch.Generator's seed")


def check_logits(logits) -> tuple[int, int]:
    """logits must be a 1-D floating tensor (V,) with V >= 1, no NaN or +inf, not all -inf; returns
    (V, how many are finite). One sum decides the usual case (all finite)."""
    import torch

    if not isinstance(logits, torch.Tensor):
        raise GatherTypeError(f"logits must be a torch.Tensor (V,), got {type(logits).__name__}")
    if logits.ndim != 1 or logits.shape[0] < 1 or not logits.is_floating_point():
        raise GatherValueError(f"logits must be a 1-D floating tensor (V,) with V >= 1, got shape "
                               f"{tuple(logits.shape)} of {logits.dtype}")
    if math.isfinite(float(logits.sum(dtype=torch.float64))):   # a NaN, +inf or -inf makes the sum not finite
        return logits.shape[0], logits.shape[0]
    bad = torch.isnan(logits) | (logits == math.inf)  # (V,)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise GatherValueError(f"logits[{i}] = {float(logits[i])} is not a finite score; every logit must be a "
                               f"number below +inf (-inf rules a token out)")
    finite = int((logits > -math.inf).sum())
    if finite == 0:
        raise GatherValueError(f"logits are -inf for all {logits.shape[0]} tokens: no token can be chosen")
    return logits.shape[0], finite


def check_history(history, vocab: int):
    """The tokens so far as a 1-D int64 tensor, each in [0, vocab); None or empty: an empty one."""
    import torch

    if history is None:
        return torch.empty(0, dtype=torch.long)
    h = torch.as_tensor(history)
    if h.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    if h.ndim != 1 or h.dtype in (torch.bool,) or h.is_floating_point() or h.is_complex():
        raise GatherValueError(f"history must be a 1-D sequence of token ids, got shape {tuple(h.shape)} of {h.dtype}")
    h = h.long()
    bad = (h < 0) | (h >= vocab)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise GatherValueError(f"history[{i}] = {int(h[i])} is outside the vocabulary [0, {vocab})")
    return h
