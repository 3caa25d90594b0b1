"""A local (sliding-window or chunked) layer's cache: a ring of its window, never the whole sequence.

    >>> layer = WindowLayer(window=4096)             # what SparseKVCache makes for a local layer
    >>> k, v = layer.update(keys, values)            # prefill: (B, Hkv, min(past, W-1) + T, D), in order
    >>> kv = layer.append(k1, v1)                    # a decode step: WindowKV over the ring, no copy
    >>> out = window_decode(q, kv, mask, scale)      # (B, Hq, 1, Dv): dense over the window

A local layer attends to the last `window` tokens only (Mistral, Gemma 2/3, Cohere 2, GPT-OSS: a
sliding window; Llama 4: a chunk, which lies inside the last `window` tokens). So it keeps a ring
of `window` slots: the token at position p lives in slot p % window. A decode step writes one slot
and reads the ring in place (window rows of K and V, whatever the sequence length); its mask,
which transformers builds in position order from `get_mask_sizes` (the same sizes as its
DynamicSlidingWindowLayer), is rotated to slot order (`WindowKV.shift`). A prefill returns the
past window and the new tokens in position order (one copy), as transformers' layer does.

Why a ring and not the last `window` tokens of a full paged cache, read in place: the same reads
per step (window rows), but a local layer's memory stays `window` tokens instead of growing with
the sequence (docs/bench/notes.md, "Sliding-window layers": bytes per layer kind).
"""
from __future__ import annotations


import torch
from transformers import CacheLayerMixin

from gatherlens.errors import GatherValueError
from gatherlens.models.attention.kv import WindowKV, window_decode
from gatherlens.models.hf_adapter import hand_over

__all__ = ["WindowKV", "KeptLayer", "WindowLayer", "window_decode"]


class KeptLayer(CacheLayerMixin):
    """What the sparse cache's layers (paged and window) refuse alike: cropping and offloading."""

    is_croppable = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise GatherValueError(
                f"crop({tokens_to_remove}) is not supported by the paged sparse cache (page summaries and "
                f"window rings cannot be shrunk); use a DynamicCache for assisted or speculative decoding")

    def offload(self):
        raise GatherValueError("offloading is not supported by the paged sparse cache")

    def prefetch(self):
        return None


class WindowLayer(KeptLayer):
    """One local layer's keys and values in a ring of `window` slots (see the module doc)."""

    is_sliding = True

    def __init__(self, window: int):
        # CacheLayerMixin.__init__ would assign self.keys / self.values, which are views here
        self.window = window
        self.cumulative_length = 0
        self.ring: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, Hkv, cap, D), (B, Hkv, cap, Dv)
        self.is_initialized = False

    def __repr__(self) -> str:
        return f"WindowLayer(window={self.window}, length={self.cumulative_length})"

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self.ring is None else self.ring[0][:, :, :self.held]  # (B, Hkv, n, D), slot order

    @property
    def values(self) -> torch.Tensor | None:
        return None if self.ring is None else self.ring[1][:, :, :self.held]  # (B, Hkv, n, Dv), slot order

    @property
    def held(self) -> int:
        """Tokens the ring holds: min(length, window)."""
        return min(self.cumulative_length, self.window)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.ring = (key_states.new_zeros(*key_states.shape[:2], 0, key_states.shape[3]),
                     value_states.new_zeros(*value_states.shape[:2], 0, value_states.shape[3]))
        self.is_initialized = True

    def _reserve(self, tokens: int) -> None:
        """Room for `tokens` tokens in position order (capacity doubles, up to `window` slots)."""
        k, v = self.ring
        cap = k.shape[2]
        if min(tokens, self.window) <= cap:
            return
        new = min(self.window, max(tokens, 2 * cap))
        grow = lambda t: torch.cat([t, t.new_zeros(*t.shape[:2], new - cap, t.shape[3])], dim=2)
        self.ring = (grow(k), grow(v))  # (B, Hkv, new, D), (B, Hkv, new, Dv); no wrap yet, so slots stay

    def _write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put the last min(T, window) of T new tokens (B, Hkv, T, D) in their slots (position % window)."""
        T, W = keys.shape[2], self.window
        m = min(T, W)
        self._reserve(self.cumulative_length + T)
        slots = torch.arange(self.cumulative_length + T - m, self.cumulative_length + T, device=keys.device) % W
        self.ring[0].index_copy_(2, slots, keys[:, :, T - m:])
        self.ring[1].index_copy_(2, slots, values[:, :, T - m:])
        self.cumulative_length += T

    def _past(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The last min(length, window - 1) tokens in position order (a copy): what a prefill attends to."""
        n = min(self.cumulative_length, self.window - 1)
        slots = torch.arange(self.cumulative_length - n, self.cumulative_length, device=self.device) % self.window
        return self.ring[0].index_select(2, slots), self.ring[1].index_select(2, slots)  # (B, Hkv, n, D|Dv)

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> WindowKV:
        """Append (B, Hkv, T, D) keys/values; return what this step attends to (see the module doc)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[2] == 1:  # a decode step: one slot, then the ring in place
            self._write(key_states, value_states)
            n = self.held
            shift = self.cumulative_length % self.window if n == self.window else 0
            return WindowKV(self.ring[0][:, :, :n], self.ring[1][:, :, :n], shift)
        pk, pv = self._past()
        keys, values = torch.cat([pk, key_states], dim=2), torch.cat([pv, value_states], dim=2)  # (B, Hkv, n+T, D)
        self._write(key_states, value_states)
        return WindowKV(keys, values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append; return the keys/values this step attends to (their mask sizes: `get_mask_sizes`)."""
        kv = self.append(key_states, value_states)
        hand_over(kv, kv.keys)  # for the attention call that follows (hf_adapter.handed_over)
        return kv.keys, kv.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) as transformers' DynamicSlidingWindowLayer: the past window - 1, then the new."""
        past = self.cumulative_length
        return min(past, self.window - 1) + query_length, max(past - self.window + 1, 0)

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.window

    def reset(self) -> None:
        self.cumulative_length = 0

    def copy(self) -> "WindowLayer":
        """An independent copy (its own ring): what a run from a shared prefilled cache extends."""
        out = WindowLayer(self.window)
        out.cumulative_length, out.is_initialized = self.cumulative_length, self.is_initialized
        if self.ring is not None:
            out.device, out.ring = self.device, (self.ring[0].clone(), self.ring[1].clone())
        return out

    def _batch(self, pick) -> None:
        if self.ring is not None:
            self.ring = (pick(self.ring[0]), pick(self.ring[1]))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._batch(lambda t: t.repeat_interleave(repeats, 0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._batch(lambda t: t[indices])
