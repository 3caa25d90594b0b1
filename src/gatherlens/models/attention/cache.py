"""The paged KV cache inside transformers: `SparseKVCache` (a `transformers.Cache`) of `PagedLayer`s.

    >>> cache = SparseKVCache(config=model.config, page_size=16)
    >>> model.generate(ids, cache=cache, max_new_tokens=16)     # with use_sparse_decoding on
    >>> cache.paged(0)                                          # layer 0's PagedKVCache
    >>> cache.truncate(4096)                                    # back to the first 4096 tokens
    >>> SparseKVCache(config=model.config, kv_dtype="float16")  # pages stored in 16 bits

Each global (full-attention) layer stores its keys and values in a `gatherlens.ops.sparse.
PagedKVCache` (pages with Quest's per-page key min/max, kept up to date as tokens arrive); `update`
appends and returns views, so no decode step copies the cache. Values may be narrower or wider
than keys (latent attention: the cache's `value_dim`). Each local layer (sliding window, chunked:
`features.layer_kinds`) keeps only a ring of its window (`sparse_window.WindowLayer`). How the
attention function finds a layer's cache: `update` hands it (or its WindowKV) over with the keys it
returns (`hf_adapter.hand_over`), and the attention call takes it for exactly those keys.
Pages are stored in `kv_dtype` (None: the keys' own dtype; see `PagedKVCache`); the attention
function re-stores a layer whose storage differs from the model's `SparseConfig.kv_dtype` at its
first call (`sparse_attention.stored_as_configured`), so a cache made without it still follows it.
"""
from __future__ import annotations

import functools

import torch
from transformers import Cache

from gatherlens.models.attention.features import layer_kinds, unsupported
from gatherlens.models.attention.kv import paged_cache_of
from gatherlens.models.hf_adapter import hand_over
from gatherlens.models.attention.window import KeptLayer, WindowLayer
from gatherlens.ops.sparse import PagedKVCache
from gatherlens.ops.sparse.config import OP, check_kv_dtype, check_page_size

__all__ = ["PagedLayer", "SparseKVCache", "WindowLayer", "paged_cache_of"]


class PagedLayer(KeptLayer):
    """One layer's keys and values in a PagedKVCache; `update` returns (B, Hkv, L, D|Dv) views of it."""

    is_sliding = False

    def __init__(self, page_size: int = OP.page_size, kv_dtype: str | None = None):
        # CacheLayerMixin.__init__ would assign self.keys / self.values, which are views here
        self.page_size = page_size
        self.kv_dtype = kv_dtype
        self.paged: PagedKVCache | None = None
        self.is_initialized = False
        self.room = 0  # tokens its PagedKVCache is made with room for (SparseKVCache.reserve)

    def __repr__(self) -> str:
        return f"PagedLayer({self.paged!r})"

    @property
    def keys(self) -> torch.Tensor | None:
        return self.paged.keys if self.paged is not None else None  # (B, Hkv, L, D)

    @property
    def values(self) -> torch.Tensor | None:
        return self.paged.values if self.paged is not None else None  # (B, Hkv, L, Dv)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.paged = paged_cache_of(key_states, value_states, self.page_size, max(key_states.shape[2], self.room),
                                    self.kv_dtype)
        self.is_initialized = True

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> PagedKVCache:
        """Append (B, Hkv, T, D) keys/values; return the layer's PagedKVCache (what decode reads)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.paged.append(key_states, value_states)
        return self.paged

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append (B, Hkv, T, D) keys/values; return all keys/values so far (views, no copy)."""
        paged = self.append(key_states, value_states)
        keys = paged.keys  # (B, Hkv, L, D)
        hand_over(paged, keys)  # for the attention call that follows (see module doc)
        return keys, paged.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.paged.length if self.paged is not None else 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        if self.paged is not None:
            self.paged.clear()

    def _rebuild(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the contents with these (B', Hkv, L, D|Dv) keys/values (batch reorder/expand/select)."""
        paged = paged_cache_of(keys, values, self.page_size, keys.shape[2], self.kv_dtype)
        paged.append(keys, values)
        self.paged = paged

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            idx = beam_idx.to(self.device)
            self._rebuild(self.keys.index_select(0, idx), self.values.index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._rebuild(self.keys.repeat_interleave(repeats, 0), self.values.repeat_interleave(repeats, 0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._rebuild(self.keys[indices], self.values[indices])


class SparseKVCache(Cache):
    """A transformers Cache of `PagedLayer`s: what sparse decode reads from.

        >>> cache = SparseKVCache(config=model.config, page_size=16)
        >>> model.generate(ids, cache=cache, max_new_tokens=16)     # with use_sparse_decoding on
        >>> cache.paged(0)                                          # layer 0's PagedKVCache

    config: the model's config: one PagedLayer per global decoder layer, one WindowLayer (a ring of
    its window) per sliding-window or chunked layer (`features.layer_kinds`; other layer types
    are refused); without it, paged layers are created as `update` first sees each layer index.
    kv_dtype: how the paged layers store keys and values (None: the keys' dtype; "float16",
    "bfloat16", "int8", "float32": ops/sparse/config.KV_DTYPES).
    """

    def __init__(self, config=None, page_size: int = OP.page_size, kv_dtype: str | None = None):
        self.page_size = check_page_size(page_size)
        self.kv_dtype = check_kv_dtype(kv_dtype)
        paged = functools.partial(PagedLayer, page_size=page_size, kv_dtype=kv_dtype)
        if config is None:
            super().__init__(layer_class_to_replicate=paged)
            return
        kinds = layer_kinds(config, "sparse decoding (SparseKVCache)")
        super().__init__(layers=[WindowLayer(k.window) if k.local else paged() for k in kinds])

    def paged(self, layer_idx: int) -> PagedKVCache | None:
        """The PagedKVCache of one global layer (None before it has seen a token, and for a local layer)."""
        return getattr(self.layers[layer_idx], "paged", None)

    def reserve(self, tokens: int) -> None:
        """Room for `tokens` tokens in every global layer: made with its PagedKVCache at the prefill (or
        now, for one already made), so no decode step grows (copies) the cache. The generation loop
        reserves prompt + new tokens.

            >>> cache.reserve(ids.shape[1] + max_new_tokens)
        """
        for layer in self.layers:
            if isinstance(layer, PagedLayer):
                layer.room = max(layer.room, tokens)
                if layer.paged is not None:
                    layer.paged.reserve(tokens)

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens of every global layer (exact page summaries; no copy)."""
        for layer in self.layers:
            if isinstance(layer, WindowLayer):  # its ring no longer holds the tokens before its window
                raise unsupported("truncating sliding-window / chunked layers", "SparseKVCache.truncate")
            if layer.paged is not None:
                layer.paged.truncate(length)
