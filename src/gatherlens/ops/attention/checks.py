"""Argument checks for the attention gathers, and the problem they describe.

    >>> p = check_topk_args(q, k, v, 8, is_causal=True, attn_mask=None, scale=None, enable_gqa=False)
    >>> p.groups, p.causal_offset        # query heads per KV head, where the causal diagonal sits
    (1, 0)
    >>> check_variant(AttentionVariant(50.0, torch.zeros(8)), heads=8, like=q)   # also used by ops/sparse

Every message names the argument, the bad value and the valid range (gatherlens.errors).
The mask is kept un-expanded as a 5-D view (B|1, Hkv|1, G|1, Q|1, L|1) so that a chunk of queries
slices it without ever materializing (B, H, Q, L).
"""
from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, replace

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.tensors import require_data
from gatherlens.ops.attention.variants import PLAIN, AttentionVariant

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class AttentionProblem:
    """Sizes and rules of one top-k attention call, after the checks."""

    batch: int
    q_heads: int
    kv_heads: int
    groups: int            # query heads per KV head (1 without GQA)
    q_len: int
    key_len: int
    head_dim: int
    value_dim: int
    scale: float
    top_k: int
    causal: bool           # a causal rule applies (is_causal or a CausalBias mask)
    causal_offset: int     # query i sees keys j <= i + causal_offset (0 = SDPA's top-left)
    mask: torch.Tensor | None  # (B|1, Hkv|1, G|1, Q|1, L|1), bool (True = attend) or additive float
    share_selection: bool = False
    variant: AttentionVariant = PLAIN  # soft-capping and sinks (variants.py), checked

    @property
    def softcap(self) -> float | None:
        """logits -> softcap * tanh(logits / softcap) before masks (the variant's)."""
        return self.variant.softcap

    @property
    def k_out(self) -> int:
        """Width of the selection: top_k, or L when fewer keys exist."""
        return min(self.top_k, self.key_len)

    def key_end(self, q1: int) -> int:
        """Keys [0, key_end) are the only ones any query before q1 may see."""
        if not self.causal:
            return self.key_len
        return max(0, min(self.key_len, q1 + self.causal_offset))


def check_top_k(top_k) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise GatherTypeError(
            f"top_k must be a positive int, got {top_k!r} of type {type(top_k).__name__}"
        )
    top_k = int(top_k)
    if top_k <= 0:
        raise GatherValueError(f"top_k {top_k} is outside the valid range [1, inf): pick at least one key")
    return top_k


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise GatherTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise GatherTypeError(
            f"{name} has dtype {t.dtype}; valid dtypes are float16, bfloat16, float32, float64"
        )
    if t.dim() != 4:
        raise GatherValueError(
            f"{name} has shape {tuple(t.shape)} ({t.dim()}-D); expected 4-D (batch, heads, length, head_dim)"
        )
    require_data(**{name: t})


def check_softcap(softcap) -> float | None:
    """softcap: None (no cap) or a finite number > 0 (Gemma 2: 50.0)."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not math.isfinite(softcap) \
            or softcap <= 0:
        raise GatherValueError(
            f"softcap = {softcap!r} is outside the valid range (0, inf): pass a finite number > 0 "
            f"(logits -> softcap * tanh(logits / softcap)) or None for no cap")
    return float(softcap)


def check_sinks(sinks, *, heads: int, like: torch.Tensor) -> None:
    """sinks: None or a float tensor of shape (heads,), one sink logit per query head, on like's device."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise GatherTypeError(f"sinks must be a torch.Tensor of shape (Hq,) = ({heads},) or None, "
                              f"got {type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise GatherTypeError(
            f"sinks has dtype {sinks.dtype}; expected a float dtype (one logit per query head)")
    if tuple(sinks.shape) != (heads,):
        raise GatherValueError(
            f"sinks has shape {tuple(sinks.shape)}; expected (Hq,) = ({heads},): one sink logit per "
            f"query head")
    if sinks.device != like.device:
        raise GatherValueError(
            f"sinks is on {sinks.device} but query is on {like.device}; they must share a device")


def check_variant(variant: AttentionVariant, *, heads: int, like: torch.Tensor) -> AttentionVariant:
    """A variant's softcap and sinks checked (`check_softcap`, `check_sinks`); the softcap as a float."""
    softcap = check_softcap(variant.softcap)
    check_sinks(variant.sinks, heads=heads, like=like)
    if variant.softcap is None or type(variant.softcap) is float:
        return variant
    return replace(variant, softcap=softcap)  # every other field kept (a subclass's too)


def check_topk_args(query, key, value, top_k, *, is_causal, attn_mask, scale, enable_gqa,
                    share_selection=False, variant: AttentionVariant = PLAIN) -> AttentionProblem:
    """Validate the arguments of `topk_attention` and describe the problem."""
    top_k = check_top_k(top_k)
    _check_qkv(query, key, value)
    variant = check_variant(variant, heads=query.shape[1], like=query)
    B, Hq, Q, D = query.shape
    Hkv, L, Dv = key.shape[1], key.shape[2], value.shape[3]
    _check_heads(Hq, Hkv, enable_gqa)
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D > 0 else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise GatherValueError(f"scale must be a finite number, got {scale!r}")
    G = Hq // Hkv
    causal, offset, mask = _causal_rule(attn_mask, is_causal, Q, L)
    if attn_mask is not None and not _is_causal_bias(attn_mask):
        mask = _check_mask(attn_mask, query, (B, Hq, Q, L), Hkv, G)
    return AttentionProblem(
        batch=B, q_heads=Hq, kv_heads=Hkv, groups=G, q_len=Q, key_len=L, head_dim=D, value_dim=Dv,
        scale=float(scale), top_k=top_k, causal=causal, causal_offset=offset, mask=mask,
        share_selection=bool(share_selection), variant=variant,
    )


def _check_qkv(query, key, value) -> None:
    """Tensors, one float dtype, one device, and (B, H, L, D) shapes that fit together."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
    if not (query.dtype == key.dtype == value.dtype):
        raise GatherTypeError(
            f"query, key and value must share one dtype, got query {query.dtype}, key {key.dtype}, "
            f"value {value.dtype}"
        )
    if not (query.device == key.device == value.device):
        raise GatherValueError(
            f"query, key and value must be on one device, got {query.device}, {key.device}, {value.device}"
        )
    B, _, _, D = query.shape
    Bk, Hkv, L, Dk = key.shape
    Bv, Hv, Lv, _ = value.shape
    if not (B == Bk == Bv):
        raise GatherValueError(f"batch sizes differ: query {B}, key {Bk}, value {Bv}; they must be equal")
    if Dk != D:
        raise GatherValueError(f"key head_dim {Dk} does not match query head_dim {D} (value may be of "
                               f"another width Dv: key (B, Hkv, L, D), value (B, Hkv, L, Dv))")
    if Lv != L:
        raise GatherValueError(f"value length {Lv} does not match key length {L}")
    if Hv != Hkv:
        raise GatherValueError(f"value has {Hv} heads but key has {Hkv}; they must be equal")


def _check_heads(Hq: int, Hkv: int, enable_gqa: bool) -> None:
    if Hkv == 0 or Hq % Hkv != 0:
        raise GatherValueError(
            f"query heads {Hq} are not a multiple of key/value heads {Hkv}: "
            f"grouped-query attention needs Hq % Hkv == 0"
        )
    if Hq != Hkv and not enable_gqa:
        raise GatherValueError(
            f"query has {Hq} heads but key/value have {Hkv}; pass enable_gqa=True for grouped-query "
            f"attention (as with F.scaled_dot_product_attention)"
        )


def _is_causal_bias(attn_mask) -> bool:
    """True for a torch.nn.attention.bias.CausalBias. That module is imported only if the caller
    made one (importing it loads torch._dynamo, slow on every start of the command line: docs/benchmarks.md)."""
    bias = sys.modules.get("torch.nn.attention.bias")
    return bias is not None and isinstance(attn_mask, bias.CausalBias)


def _causal_rule(attn_mask, is_causal, Q: int, L: int) -> tuple[bool, int, None]:
    """(causal, causal_offset, None) from is_causal or a CausalBias attn_mask."""
    if not _is_causal_bias(attn_mask):
        return bool(is_causal), 0, None
    from torch.nn.attention.bias import CausalVariant

    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (Q, L):
        raise GatherValueError(
            f"attn_mask CausalBias is for ({attn_mask.seq_len_q}, {attn_mask.seq_len_kv}) queries/keys, "
            f"but query has {Q} and key {L}"
        )
    offset = L - Q if attn_mask.variant == CausalVariant.LOWER_RIGHT else 0
    if is_causal and offset != 0:
        raise GatherValueError(
            "is_causal=True (top-left) and a lower-right CausalBias attn_mask disagree; pass one of them"
        )
    return True, offset, None


def _check_mask(attn_mask, query, target, Hkv, G) -> torch.Tensor:
    if not isinstance(attn_mask, torch.Tensor):
        raise GatherTypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise GatherTypeError(
            f"attn_mask has dtype {attn_mask.dtype}; use bool (True = attend) or a float additive mask"
        )
    if attn_mask.requires_grad:
        raise GatherValueError(
            "attn_mask requires grad; topk_attention does not differentiate through the mask "
            "(detach it, or use F.scaled_dot_product_attention)"
        )
    if attn_mask.dim() > 4:
        raise GatherValueError(
            f"attn_mask has shape {tuple(attn_mask.shape)}; it must broadcast to (B, Hq, Q, L) = {target}"
        )
    m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    for dim, (have, want) in enumerate(zip(m.shape, target)):
        if have not in (1, want):
            raise GatherValueError(
                f"attn_mask has shape {tuple(attn_mask.shape)}, which does not broadcast to "
                f"(B, Hq, Q, L) = {target}: dim {dim} is {have}, expected 1 or {want}"
            )
    mb, mh, mq, ml = m.shape
    if mh == 1:
        return m.view(mb, 1, 1, mq, ml)                         # (B|1, 1, 1, Q|1, L|1)
    return m.view(mb, Hkv, G, mq, ml)                           # (B|1, Hkv, G, Q|1, L|1)
