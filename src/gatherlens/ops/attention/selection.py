"""What top-k attention picked, as plain data.

    >>> out, sel = topk_attention(q, k, v, top_k=4, is_causal=True, return_selection=True)
    >>> sel.indices[0, 0, 5]        # the keys query 5 of head 0 gathered, best first, -1 = none
    >>> sel.to_svg(head=1)          # its picture (Drawable: drawn by gatherlens.render on call)
    >>> gatherlens.trace.as_record(sel, head=1)   # the record that picture is drawn from

Data only: this module imports neither `trace/` nor `render/`. The pictures come from the
`Drawable` mixin, whose one lazy call (`gatherlens.render.draw`) builds the record with
`trace.as_record` and draws it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gatherlens.drawable import Drawable


@dataclass
class AttentionSelection(Drawable):
    """Per query, the keys that top-k attention gathered.

    indices: (B, H, Q, k) int64 key positions, best first; -1 where fewer than k keys were allowed.
             Ties are broken by the lower key index.
    weights: (B, H, Q, k) softmax weights over the selected keys (0 where indices == -1).
    scores:  (B, H, Q, k) the selected (scaled, masked) logits; -inf where indices == -1.
    lse:     (B, H, Q) log-sum-exp of each row's selected logits (-inf for a row with no keys),
             so partial results over shards of the keys can be merged exactly.
    key_len: L, the number of keys scored.
    top_k:   the k asked for (indices.shape[-1] may be smaller when k > L).
    is_causal, share_selection: how the selection was made.
    kv_heads: number of KV heads (H // kv_heads query heads share one KV head under GQA).
    """

    indices: torch.Tensor
    weights: torch.Tensor
    scores: torch.Tensor
    lse: torch.Tensor
    key_len: int
    top_k: int
    is_causal: bool = False
    share_selection: bool = False
    kv_heads: int | None = None
    meta: dict = field(default_factory=dict)
