"""A Hugging Face model's KV cache split by sequence over the ranks: `generate` as on one process.

    >>> use_sharded_decoding(model, budget=1024, page_size=16)          # on every rank
    >>> cache = ShardedKVCache(model.config, page_size=16)
    >>> model.generate(ids, cache=cache, max_new_tokens=32)            # same greedy tokens everywhere
    >>> cache.layers[0].paged                                          # this rank's part of layer 0

Every rank holds the whole model and runs the same forward; only the cache is split. The prompt's
keys and values are computed on every rank and each keeps its slice (`split_sequence`: whole
pages, rank order); the prompt itself attends densely (SDPA) to its own keys, as one process
does. Each decode step's new token is kept by the rank holding the newest tokens, and attention
runs through `sparse_decode_sharded`: page selection over the whole sequence (budget) or dense
(budget None), three small all_gathers per layer and step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import Cache

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.models.attention.topk import switch_attention
from gatherlens.models.hf_adapter import hand_over, handed_over, register_attention, sdpa_attention, unwrap
from gatherlens.models.runtime.decoding import CONFIG_ATTR, PagedLayer, SparseConfig, sparse_settings
from gatherlens.ops.sparse import PagedKVCache
from gatherlens.ops.sparse.config import OP, SHARDED, check_page_size

from .decode import sparse_decode_sharded
from .layout import split_sequence

__all__ = ["SHARDED_ATTN_NAME", "ShardedSettings", "ShardedLayer", "ShardedKVCache",
           "use_sharded_decoding", "register_sharded"]

SHARDED_ATTN_NAME = "gatherlens_sharded"


ShardedSettings = SparseConfig  # the old name: sharded decoding takes the one configuration too


class ShardedLayer(PagedLayer):
    """One layer's keys and values: this rank's contiguous part of the sequence in a PagedKVCache."""

    def __init__(self, page_size: int = OP.page_size, group=None):
        super().__init__(page_size)
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.lengths: list[int] = [0] * self.world  # every rank's part, known without communication

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """A PagedKVCache sized for this rank's share of the prompt, not the whole prompt."""
        B, H, T, D = key_states.shape
        share = split_sequence(T, self.world, self.page_size)[self.rank]
        self.device = key_states.device
        self.paged = PagedKVCache(batch=B, kv_heads=H, head_dim=D, page_size=self.page_size,
                                  dtype=key_states.dtype, device=key_states.device, capacity=max(share, 1))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Keep this rank's share of (B, Hkv, T, D) new keys/values; return them (prefill attends to them)."""
        T = key_states.shape[2]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if sum(self.lengths) == 0:  # the prompt: every rank keeps its slice
            self.lengths = split_sequence(T, self.world, self.page_size)
            start = sum(self.lengths[:self.rank])
            mine = slice(start, start + self.lengths[self.rank])
        elif T == 1:  # a decode step: the rank holding the newest tokens keeps the new one
            owner = max(r for r, n in enumerate(self.lengths) if n)
            self.lengths[owner] += 1
            mine = slice(0, 1 if owner == self.rank else 0)
        else:
            raise GatherValueError(f"a {T}-token step after the prompt (chunked prefill, assisted decoding) "
                                   f"is not supported by the sequence-sharded cache; decode one token at a time")
        self.paged.append(key_states[:, :, mine], value_states[:, :, mine])  # (B, Hkv, t, D)
        hand_over(self, key_states)  # for the attention call that follows (hf_adapter.handed_over)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return sum(self.lengths)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def reset(self) -> None:
        super().reset()
        self.lengths = [0] * self.world

    def _unsupported(self, *args, **kwargs):
        raise GatherValueError("beam search / batch reordering is not supported by the sequence-sharded "
                               "cache; use greedy or sampled decoding")

    reorder_cache = batch_repeat_interleave = batch_select_indices = _unsupported


class ShardedKVCache(Cache):
    """A transformers Cache of `ShardedLayer`s, one per decoder layer: this rank's part of each."""

    def __init__(self, config, page_size: int = OP.page_size, group=None):
        check_page_size(page_size)
        if not dist.is_initialized():
            raise GatherValueError("ShardedKVCache needs a torch.distributed process group (init_process_group)")
        self.page_size = page_size
        layers = config.get_text_config(decoder=True).num_hidden_layers
        super().__init__(layers=[ShardedLayer(page_size, group) for _ in range(layers)])


def sharded_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                              scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' per-layer call: SDPA for the prompt, sparse_decode_sharded for a decode step."""
    layer = handed_over(key)  # this layer's ShardedLayer, when the cache is a ShardedKVCache
    if query.shape[2] != 1:
        return sdpa_attention()(module, query, key, value, attention_mask, dropout=dropout,
                                scaling=scaling, is_causal=is_causal, **kwargs)
    if not isinstance(layer, ShardedLayer):
        raise GatherValueError("gatherlens_sharded attention needs generate(..., cache=ShardedKVCache(config))")
    if attention_mask is not None and attention_mask.dtype == torch.bool and not bool(attention_mask.all()):
        raise GatherValueError("padded batches are not supported by the sequence-sharded cache")
    config = sparse_settings(module)
    budget = config.budget_for(layer.get_seq_length(), getattr(module, "layer_idx", None))  # the length: dense
    out = sparse_decode_sharded(query, layer.paged, budget, group=layer.group, scale=scaling,
                                share_selection=config.share_selection,
                                group_score=config.group_score)  # (B, Hq, 1, D)
    return out.transpose(1, 2).contiguous(), None  # (B, 1, Hq, D)


def register_sharded() -> None:
    """Register "gatherlens_sharded" with transformers' attention and mask interfaces (idempotent)."""
    register_attention(SHARDED_ATTN_NAME, sharded_attention_forward)


def use_sharded_decoding(model, budget: int | None = SHARDED.budget, *,
                         share_selection: bool = SHARDED.share_selection, group_score: str = SHARDED.group_score,
                         config: SparseConfig | None = None):
    """Make `model` decode over a sequence-sharded cache (pass `cache=ShardedKVCache(config)` to generate).

        >>> use_sharded_decoding(model, budget=1024)
        >>> model.generate(ids, cache=ShardedKVCache(model.config, page_size=16), max_new_tokens=8)

    Call it on every rank. budget: tokens each decode step reads per KV head over the whole
    sequence (page 0 and the newest page always); None decodes densely. The ranks sharing the
    sequence are the cache's `group`. config: a SparseConfig instead of the keywords (the
    SHARDED preset's fields; sharded decoding has no recent window and no oracle). Each
    attention module gets a reference to the one SparseConfig. Returns the model.
    """
    model = unwrap(model)
    if config is None:
        config = SHARDED.replace(budget=budget, share_selection=share_selection, group_score=group_score)
    elif not isinstance(config, SparseConfig):
        raise GatherTypeError(f"config must be a SparseConfig, got {type(config).__name__}")
    if config.recent_window() or config.choose != "bound":
        raise GatherValueError(f"recent = {config.recent_window()} and choose = {config.choose!r}: sharded decoding "
                               f"reads no recent window and ranks pages by their bound (use recent=0, choose='bound')")
    if config.auto:
        raise GatherValueError("budget = 'auto': sharded decoding reads a fixed budget (an int of tokens) or None")
    register_sharded()
    switch_attention(model, SHARDED_ATTN_NAME, remember="gatherlens_sharded_previous", what="sharded decoding")
    for m in model.modules():
        if hasattr(m, "layer_idx"):
            setattr(m, CONFIG_ATTR, config)
    return model
