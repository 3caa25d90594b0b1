"""Rotary angles from a model's rope parameters, without transformers: the native runtime's angle tables.

    >>> rope = Rope(inverse_frequencies(64, 500000.0, factors=rope_freqs))   # Llama 3's file: its factors
    >>> cos, sin = rope(torch.arange(0, 8)[None])                             # (1, 8, 64) float32 each
    >>> Rope(inverse_frequencies(128, 10000.0, RopeScaling("linear", 4.0)))    # linear scaling

`inverse_frequencies(dim, base, scaling, factors)`: 1 / base^(2i / dim) in float32, as transformers
makes them (its `compute_default_rope_parameters`, the tests' reference), then the scaling a file
states (`RopeScaling`): "linear" divides every frequency by its factor; "llama3" smooths Llama 3's low
frequencies (transformers' `_compute_llama3_parameters`); `factors`: a file's per-frequency divisors
(llama.cpp's `rope_freqs.weight`: llama.cpp's convert writes Llama 3's factors there instead of a
scaling type, and llama.cpp divides each frequency by its factor, as we do). Any other type is refused
by name (yarn, longrope, dynamic: their angles or their attention factor are not these).
`Rope(inv_freq)(positions)`: angles as transformers' rotary modules make them: positions x inv_freq in
float32 (one product each), concatenated twice, their cos and sin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gatherlens.errors import GatherValueError

__all__ = ["RopeScaling", "Rope", "inverse_frequencies", "SCALINGS"]

SCALINGS = ("linear", "llama3")  # the scaling types inverse_frequencies applies


@dataclass(frozen=True)
class RopeScaling:
    """A rope scaling a file states (`{arch}.rope.scaling.*`): its type, factor and Llama 3's smoothing
    bounds (low_freq_factor, high_freq_factor, original_context)."""

    type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


def inverse_frequencies(dim: int, base: float, scaling: RopeScaling | None = None,
                        factors: torch.Tensor | None = None) -> torch.Tensor:
    """(dim / 2,) float32 inverse frequencies (see the module doc)."""
    if dim <= 0 or dim % 2:
        raise GatherValueError(f"the rotary dimension {dim} must be a positive even number")
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # (dim / 2,)
    if scaling is not None and scaling.type not in (None, "none", "default"):
        if scaling.type == "linear":
            inv_freq = inv_freq / scaling.factor
        elif scaling.type == "llama3":
            inv_freq = _llama3(inv_freq, scaling)
        else:
            raise GatherValueError(f"rope scaling {scaling.type!r} is not supported by the native runtime (it runs "
                                   f"{', '.join(SCALINGS)} and a file's rope_freqs factors)")
    if factors is not None:
        if factors.shape != inv_freq.shape:
            raise GatherValueError(f"rope_freqs holds {tuple(factors.shape)} factors; the rotary dimension {dim} "
                                   f"needs {tuple(inv_freq.shape)}")
        inv_freq = inv_freq / factors.float()  # llama.cpp: each frequency divided by its factor
    return inv_freq


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1's frequencies: long wavelengths divided by the factor, the middle ones smoothed."""
    low_wavelen, high_wavelen = s.original_context / s.low_freq_factor, s.original_context / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq  # (dim / 2,)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rope:
    """The angle table of one rope: positions (B, T) int -> cos, sin (B, T, dim) float32."""

    def __init__(self, inv_freq: torch.Tensor):
        self.inv_freq = inv_freq.float()  # (dim / 2,)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq  # (B, T, dim / 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, dim)
        return emb.cos(), emb.sin()

    def __repr__(self) -> str:
        return f"Rope(dim={2 * self.inv_freq.numel()})"
