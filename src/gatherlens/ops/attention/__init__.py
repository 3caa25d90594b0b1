"""The attention gather: softmax-weighted sums, and top-k attention that gathers only the keys
each query ranks highest.

    >>> from gatherlens.ops.attention import topk_attention, apply_attention_scores
    >>> out, sel = topk_attention(q, k, v, top_k=32, is_causal=True, return_selection=True)

References (plain loops) live in `naive.py`; the fast paths (`chunked.py` prefill, `decode.py`,
`autograd.py`, `sparse_sum.py` on CPU) are tested against them. Which keys a row keeps is decided
in one place, `select/` (one tie rule, one worker pool, the C++ top-k operators). Soft-capping and
attention sinks (``softcap=``, ``sinks=``, or one ``variant=AttentionVariant(...)``) have one home,
`variants.py`, which ops/sparse uses too.
"""
from gatherlens.ops.attention.scores import apply_attention_scores
from gatherlens.ops.attention.selection import AttentionSelection
from gatherlens.ops.attention.topk import topk_attention
from gatherlens.ops.attention.variants import PLAIN, AttentionVariant

__all__ = ["apply_attention_scores", "topk_attention", "AttentionSelection", "AttentionVariant", "PLAIN"]
