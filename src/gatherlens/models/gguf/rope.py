"""Llama 3's RoPE scaling read back from a GGUF's `rope_freqs.weight`.

    >>> llama3_scaling(rope_freqs(reader), theta=500000.0)    # a Llama 3.2 file
    {'rope_type': 'llama3', 'factor': 32.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
     'original_max_position_embeddings': 8192}

llama.cpp's convert writes Llama 3.x's scaling not as metadata but as one F32 tensor: per frequency,
the factor its wavelength is divided by (1 for short wavelengths, `factor` for long ones, a smooth step
between). transformers' GGUF loader ignores it, so the model's positions differ from llama.cpp's (and
from the original model's) at every length. The settings are few and published (Llama 3.1: factor 8;
3.2 and 3.3: 32; low / high frequency factors 1 and 4; original context 8192), so the file's factors
are compared with the ones each candidate setting gives (convert's own formula, float64, within float32
rounding); the one that reproduces them becomes the config's `rope_scaling` (transformers then
computes the same frequencies itself), and a file whose factors match none keeps the warning that
they are not applied (models/gguf/arch.py's NOT_APPLIED).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["llama3_scaling", "llama3_factors", "rope_freqs", "ROPE_FREQS"]

ROPE_FREQS = "rope_freqs.weight"
_ORIGINAL = (8192, 4096, 16384, 32768, 2048, 65536, 131072)
_LOW, _HIGH = (1.0, 0.5, 2.0), (4.0, 2.0, 8.0)


def llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """The (head_dim / 2,) factors llama.cpp's convert writes for these llama3 settings (its formula)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)  # 2 pi / frequency
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float64)  # (D/2,)


def rope_freqs(reader):
    """The file's rope_freqs.weight tensor (gguf's ReaderTensor), or None."""
    return next((t for t in reader.tensors if t.name == ROPE_FREQS), None)


def llama3_scaling(tensor, theta: float) -> dict | None:
    """The llama3 `rope_scaling` whose factors `tensor` (a file's rope_freqs.weight) holds for RoPE base
    `theta`, or None (not F32, or factors no candidate setting reproduces)."""
    if tensor is None or tensor.tensor_type.name != "F32":
        return None
    stored = np.asarray(tensor.data, np.float64).reshape(-1)  # (D/2,)
    if stored.size == 0 or not np.isfinite(stored).all():
        return None
    head_dim, factor = 2 * stored.size, round(float(stored.max()), 4)  # 32.000004 (float32) -> 32.0
    for original, low, high in itertools.product(_ORIGINAL, _LOW, _HIGH):
        if high > low and np.allclose(llama3_factors(theta, head_dim, factor, low, high, original), stored,
                                      rtol=1e-5, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    return None
