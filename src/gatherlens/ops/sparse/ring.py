"""A local (sliding-window) layer's keys and values: a ring of its window, stored as pages.

    >>> ring = WindowRing(window=512, batch=1, kv_heads=1, head_dim=256, page_size=8, kv_dtype="float16")
    >>> k, v = ring.append(keys, values)   # a prefill chunk (B, Hkv, T, D): past window and new, in position order
    >>> ring.slot, ring.held               # where the next token goes (position % window), tokens the ring holds
    >>> cache = ring.begin_write(); rope_append(q, k1, v1, cos, sin, cache); ring.end_write()   # one decode token
    >>> decode_pages(q, ring.pages, ring.held, ...)   # dense over the window, in place

A local layer attends to the last `window` tokens (itself included). The ring keeps exactly those:
the token at position p lives in slot p % window. Its storage is a `PagedKVCache` (`pages`) holding
`held` = min(position, window) tokens in slot order, so the native decode operators and the C++ stack
read it as they read any paged cache: a decode step reads every held slot densely (a softmax does not
depend on the order of its keys, so slot order is position order up to the order of the sum; no mask
is needed once the ring holds only the window). A prefill chunk attends to the past window - 1 tokens
and itself, returned in position order (one copy), under the caller's causal and window mask.

Pages are stored in `kv_dtype` as in PagedKVCache, except int8: an int8 page's scale only grows with
the tokens written to it (ops/sparse/cache.py's rule), which a ring that overwrites old tokens breaks,
so a ring asked for int8 stores float16 (half of float32; `RING_STORAGE`).
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.config import OP

__all__ = ["WindowRing", "RING_STORAGE"]

RING_STORAGE = {"int8": "float16", torch.int8: "float16"}  # kv_dtype asked -> what a ring stores instead


class WindowRing:
    """The last `window` tokens of one local layer in a ring of slots (see the module doc).

    window: tokens a query attends to (itself included). batch, kv_heads, head_dim, page_size, dtype,
    kv_dtype, value_dim, device: as PagedKVCache's. position: tokens seen so far (`length`).
    """

    def __init__(self, window: int, batch: int, kv_heads: int, head_dim: int, page_size: int = OP.page_size,
                 dtype: torch.dtype = torch.float32, kv_dtype=None, value_dim: int | None = None, device=None):
        if isinstance(window, bool) or not isinstance(window, int):
            raise GatherTypeError(f"window must be an int, got {type(window).__name__} {window!r}")
        if window < 1:
            raise GatherValueError(f"window = {window} must be >= 1 (tokens a local layer attends to)")
        self.window = window
        self.position = 0
        # room for window + 1: a stack step asks the storage for one more token than a full ring holds
        self.pages = PagedKVCache(batch, kv_heads, head_dim, page_size, dtype, device, capacity=window + 1,
                                  value_dim=value_dim, kv_dtype=RING_STORAGE.get(kv_dtype, kv_dtype))

    def __repr__(self) -> str:
        return f"WindowRing(window={self.window}, position={self.position}, {self.pages!r})"

    @property
    def length(self) -> int:
        """Tokens seen (the position of the next token)."""
        return self.position

    @property
    def held(self) -> int:
        """Tokens the ring holds: min(length, window)."""
        return min(self.position, self.window)

    @property
    def slot(self) -> int:
        """The slot the next token goes to: position % window."""
        return self.position % self.window

    def nbytes(self) -> int:
        return self.pages.nbytes()

    def past(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The last min(length, window - 1) tokens in position order, as read: what a new token attends to
        besides itself. keys (B, Hkv, n, D), values (B, Hkv, n, Dv) (copies)."""
        n = min(self.position, self.window - 1)
        slots = torch.arange(self.position - n, self.position, device=self.pages.device) % self.window  # (n,)
        return self.pages.keys.index_select(2, slots), self.pages.values.index_select(2, slots)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add T tokens (B, Hkv, T, D|Dv) in position order; return what they attend to: the past window
        and themselves, (B, Hkv, n + T, D|Dv) in position order (a token at row r of the new ones attends
        to the rows within `window` before it, itself included: the caller's mask)."""
        past_k, past_v = self.past()  # (B, Hkv, n, D|Dv)
        T = keys.shape[2]
        keep = min(T, self.window)  # only the last `window` new tokens stay
        first = self.position + T - keep  # the position of the first one kept
        self.position = first
        start = self.slot
        run = min(keep, self.window - start)  # up to the ring's end, then from slot 0
        self._put(start, keys[:, :, T - keep:T - keep + run], values[:, :, T - keep:T - keep + run])
        if run < keep:
            self._put(0, keys[:, :, T - keep + run:], values[:, :, T - keep + run:])
        self.position = first + keep
        new_k = keys.to(past_k.dtype) if keys.dtype != past_k.dtype else keys
        new_v = values.to(past_v.dtype) if values.dtype != past_v.dtype else values
        return torch.cat([past_k, new_k], dim=2), torch.cat([past_v, new_v], dim=2)

    def _put(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Tokens (B, Hkv, n, D|Dv) into slots slot .. slot + n - 1 (no wrap), the ring's other slots kept."""
        held = self.pages.length
        if slot < held:
            self.pages.truncate(slot)  # append writes at the cache's length
        elif slot > held:  # a chunk longer than the window skips ahead; the second run fills slots 0 .. slot - 1
            self.pages.advance(slot - held)
        self.pages.append(keys, values)
        if self.pages.length < held:
            self.pages.advance(held - self.pages.length)  # the slots after the written ones are still held

    def begin_write(self) -> PagedKVCache:
        """The pages, set so that one token written at their length (rope_append, append) lands in `slot`;
        `end_write()` counts it."""
        if self.position >= self.window:
            self.pages.truncate(self.slot)
        return self.pages

    def end_write(self) -> None:
        """Count the one token written through `begin_write` (the ring holds min(length, window) again)."""
        self.position += 1
        if self.pages.length < self.held:
            self.pages.advance(self.held - self.pages.length)

    def written(self) -> None:
        """Count one token a kernel wrote at `slot` of the storage itself (the C++ stack)."""
        self.position += 1
        if self.pages.length < self.held:
            self.pages.advance(1)
