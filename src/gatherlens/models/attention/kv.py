"""The transformers-free parts of a model's KV cache: what one step of a layer reads, made without transformers.

    >>> paged = paged_cache_of(keys, values, page_size=8, capacity=4096)   # an empty PagedKVCache shaped for them
    >>> out = window_decode(q, WindowKV(keys, values, shift), mask, scale)  # (B, Hq, 1, Dv): dense over a window

`WindowKV` is what one decode step of a local layer reads from transformers' window layer
(models/attention/window.py's `WindowLayer`): its ring's keys and values and the rotation from
position order to slot order; `window_decode` attends over it densely. `paged_cache_of` makes the
empty PagedKVCache of a global layer. They live apart from the transformers cache classes
(cache.py, window.py) so that the decode step's modules (models/attention/sparse.py,
models/runtime/step.py) import no transformers module: the native runtime (models/gguf/native.py)
runs them without it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.ops.attention.variants import PLAIN, AttentionVariant
from gatherlens.ops.sparse import PagedKVCache

__all__ = ["WindowKV", "window_decode", "paged_cache_of"]


def paged_cache_of(keys: torch.Tensor, values: torch.Tensor, page_size: int, capacity: int,
                   kv_dtype: str | None = None) -> PagedKVCache:
    """An empty PagedKVCache shaped for keys (B, Hkv, T, D) and values (B, Hkv, T, Dv), room for `capacity`,
    read in the keys' dtype and stored in `kv_dtype` (None: the keys' dtype)."""
    B, H, _, D = keys.shape
    return PagedKVCache(batch=B, kv_heads=H, head_dim=D, page_size=page_size, dtype=keys.dtype, device=keys.device,
                        capacity=capacity, value_dim=values.shape[-1], kv_dtype=kv_dtype)


@dataclass(frozen=True)
class WindowKV:
    """What one step of a local layer reads: keys (B, Hkv, n, D), values (B, Hkv, n, Dv) and the
    rotation from position order to slot order (slot s holds mask column (s - shift) % n)."""

    keys: torch.Tensor
    values: torch.Tensor
    shift: int = 0

    @property
    def length(self) -> int:
        return self.keys.shape[2]

    def slot_mask(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """A (..., n) mask in position order -> the same mask in slot order."""
        return mask if mask is None or not self.shift else mask.roll(self.shift, dims=-1)


def window_decode(query: torch.Tensor, kv: WindowKV, mask: torch.Tensor | None, scale: float,
                  variant: AttentionVariant = PLAIN) -> torch.Tensor:
    """Dense attention of query (B, Hq, 1, D) over a local layer's window -> (B, Hq, 1, Dv).

    mask: (B, 1, 1, n) bool in position order (True = attend) or None. Every allowed key is
    kept (top_k = n), so this is the exact softmax, with the layer's soft-capping and sinks.
    """
    from gatherlens.ops.attention import topk_attention

    n = kv.length
    return topk_attention(query, kv.keys, kv.values, n, attn_mask=kv.slot_mask(mask), scale=scale,
                          enable_gqa=query.shape[1] != kv.keys.shape[1], variant=variant)  # (B, Hq, 1, Dv)
