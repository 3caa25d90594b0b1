"""`topk_attention`: F.scaled_dot_product_attention with one more argument, `top_k`.

    >>> out = topk_attention(q, k, v, top_k=64, is_causal=True)                  # (B, Hq, Q, Dv)
    >>> out, sel = topk_attention(q, k, v, 64, enable_gqa=True, return_selection=True)
    >>> sel.indices.shape                                                        # (B, Hq, Q, 64)
    >>> out = topk_attention(q, k, v, 64, softcap=50.0, sinks=s_aux)             # Gemma 2, GPT-OSS
    >>> out = topk_attention(q, k, v, 64, variant=AttentionVariant(50.0, s_aux))  # the same, one object

Dispatch: inputs that need gradients go through the autograd Function (autograd.py, chunked
forward + chunked recompute backward); other CPU calls take the sparse path (sparse_sum.py: an
exact per-row threshold, a C++ operator, select/threshold_select.py, then a gather-sum of only the
kept value rows); elsewhere a few queries against a long cache take the decode path (decode.py),
the rest the chunked path (chunked.py, also the reference). All select in select/ by one tie rule
(select/ties.py) and are tested against the per-query loop in naive.py. Soft-capping is applied
where each path makes its logits; sinks rescale any path's (out, lse) afterwards (variants.py).
"""
from __future__ import annotations

import torch

from gatherlens.ops.attention.autograd import TopkAttentionFn
from gatherlens.ops.attention.checks import check_topk_args
from gatherlens.ops.attention.chunked import chunked_forward
from gatherlens.ops.attention.decode import decode_forward, is_decode
from gatherlens.ops.attention.selection import AttentionSelection
from gatherlens.ops.attention.sparse_sum import sparse_forward, use_sparse
from gatherlens.ops.attention.variants import join_sinks, variant_of
from gatherlens.ops.dtypes import NEG_INF, stat_dtype


def topk_attention(query, key, value, top_k, *, is_causal=False, attn_mask=None, scale=None,
                   enable_gqa=False, share_selection=False, return_selection=False,
                   softcap: float | None = None, sinks: torch.Tensor | None = None, variant=None):
    r"""Scaled dot product attention over each query's ``top_k`` highest-scoring allowed keys.

    The arguments of :func:`torch.nn.functional.scaled_dot_product_attention` plus ``top_k``.
    Per query: logits ``scale * q.k`` (plus a float mask); keys forbidden by the causal rule, a
    ``False`` in a bool mask or ``-inf`` in a float mask are not allowed; the ``top_k`` allowed
    keys with the highest logits are kept (ties: the lower key index), and the output is the
    softmax over them times their value rows. ``top_k >=`` the allowed keys equals SDPA. A query
    with no allowed key gets a zero row and ``lse = -inf`` (SDPA gives NaN). Differentiable in
    query, key, value and ``sinks`` (not through the mask or the selection itself).

    Args:
        query, key, value (Tensor): as in SDPA, one float dtype on one device.
        top_k (int): keys kept per query (>= 1); fewer allowed keys keep all (indices -1 padded).
        is_causal (bool): SDPA's rule, query i sees keys j <= i (top-left when Q != L). Decoding
            one query against a cache: ``False``, as transformers passes. May be combined with
            ``attn_mask`` (both apply).
        attn_mask (Tensor or CausalBias, optional): bool (``True`` = attend) or additive float,
            or ``torch.nn.attention.bias.causal_lower_right(Q, L)`` for new queries at a cache's end.
        scale (float, optional): logit scale. Default: :math:`1 / \sqrt{D}`.
        enable_gqa (bool): allow :math:`H_q` a multiple of :math:`H_{kv}` (grouped-query attention).
        share_selection (bool): GQA: one key set per KV head, ranked by the sum of its query
            heads' logits (a key any head of the group forbids is not chosen).
        return_selection (bool): also return the :class:`AttentionSelection`.
        softcap (float, optional): Gemma 2's soft-capping, ``logits = softcap * tanh(logits /
            softcap)`` on the scaled logits, before the mask and before the selection (the top
            k are chosen by the capped logits). ``> 0``; default None: no cap.
        sinks (Tensor, optional): GPT-OSS's sink logits, one per query head, shape ``(H_q,)``:
            each joins its head's softmax as one more column with no value row, so
            ``out = sum_j e^{l_j} v_j / (sum_j e^{l_j} + e^{sink})`` over the kept keys (it never
            takes a key's place among the k). Default None: no sink. (Or both as one ``variant``.)

    Shape:
        - query: :math:`(B, H_q, Q, D)`; key: :math:`(B, H_{kv}, L, D)`; value: :math:`(B, H_{kv}, L, D_v)`
          (:math:`D_v` may differ from :math:`D`: latent attention); sinks: :math:`(H_q,)`
        - attn_mask: broadcastable to :math:`(B, H_q, Q, L)`
        - output: :math:`(B, H_q, Q, D_v)`; selection indices: :math:`(B, H_q, Q, k)`

    Returns:
        ``out``, or ``(out, selection)`` with ``return_selection=True``: the indices (best first),
        weights, selected logits and ``lse`` (float32; float64 for float64 inputs), with
        ``out = sum_j exp(score_j - lse) * value_j``; with ``sinks`` the lse includes the sink
        term (``logaddexp(lse over the kept keys, sink)``), so the weights sum to less than 1.

    Example::

        >>> q = torch.randn(1, 8, 128, 64); k = v = torch.randn(1, 2, 128, 64)
        >>> topk_attention(q, k, v, 16, is_causal=True, enable_gqa=True).shape
        torch.Size([1, 8, 128, 64])
    """
    p = check_topk_args(query, key, value, top_k, is_causal=is_causal, attn_mask=attn_mask,
                        scale=scale, enable_gqa=enable_gqa, share_selection=share_selection,
                        variant=variant_of(softcap, sinks, variant))
    out, lse, vals, idx, path = _forward(p, query, key, value, bool(return_selection))
    if not return_selection:
        return out
    return out, _selection(p, vals, idx, lse, is_causal, path)


def _forward(p, query, key, value, need_idx: bool):
    """(out, lse, vals, idx, path) by the path that fits: empty, autograd, decode or chunked."""
    sinks = p.variant.sinks  # (Hq,) or None: an input of the autograd Function (it has a gradient)
    if p.batch == 0 or p.q_heads == 0:                         # nothing to attend: empty results
        sd = stat_dtype(query.dtype)
        out = query.new_zeros(p.batch, p.q_heads, p.q_len, p.value_dim)       # (B, Hq, Q, Dv)
        lse = torch.empty(p.batch, p.q_heads, p.q_len, dtype=sd, device=query.device)
        vals = torch.empty(p.batch, p.q_heads, p.q_len, p.k_out, dtype=sd, device=query.device)
        idx = torch.empty(vals.shape, dtype=torch.long, device=query.device)  # (B, Hq, Q, k)
        return out, lse, vals, idx, "empty"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, sinks)):
        return (*TopkAttentionFn.apply(query, key, value, sinks, p, need_idx), "autograd")
    need = need_idx or sinks is not None                       # a sink rescales by the keys' lse
    if use_sparse(p, query):                                   # CPU: exact threshold, gather-sum
        path = "decode" if is_decode(p) else "sparse"
        out, lse, vals, idx = sparse_forward(p, query, key, value, need_idx=need, ordered=need_idx)
    elif is_decode(p):
        path = "decode"
        out, lse, vals, idx = decode_forward(p, query, key, value, need_idx=need, ordered=need_idx)
    else:
        path = "chunked"
        out, lse, vals, idx = chunked_forward(p, query, key, value, need_idx=need, ordered=need_idx)
    return (*join_sinks(out, lse, sinks), vals, idx, path)


def _selection(p, vals, idx, lse, is_causal, path) -> AttentionSelection:
    sd = stat_dtype(vals.dtype)
    l = torch.where(lse > NEG_INF, lse, torch.zeros_like(lse)).unsqueeze(-1)  # (B, Hq, Q, 1)
    weights = torch.exp(vals.detach().to(sd) - l).masked_fill(idx < 0, 0.0)      # (B, Hq, Q, k)
    return AttentionSelection(
        indices=idx, weights=weights, scores=vals.detach(), lse=lse.detach(), key_len=p.key_len,
        top_k=p.top_k, is_causal=bool(is_causal) or p.causal, share_selection=p.share_selection,
        kv_heads=p.kv_heads,
        meta={"scale": p.scale, "causal_offset": p.causal_offset, "path": path,
              **({} if p.softcap is None else {"softcap": p.softcap})},
    )
