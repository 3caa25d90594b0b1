"""Soft-capping, attention sinks and local windows: what a decoder's attention adds to Llama's, in one place.

    >>> variant = AttentionVariant(softcap=50.0)          # one object, passed down as `variant=`
    >>> variant.plain, PLAIN.plain                        # (False, True): PLAIN is Llama's attention
    >>> s = softcap_(logits, 50.0)                  # in place: 50 * tanh(logits / 50) (Gemma 2)
    >>> out, lse = join_sinks(out, lse, sinks)      # out (B, Hq, Q, Dv), lse (B, Hq, Q), sinks (Hq,)

- **soft-capping** (Gemma 2): the scaled logits become ``softcap * tanh(logits / softcap)`` before
  any mask and before any selection, so a top-k or a page choice ranks the capped logits (the cap
  is monotonic: the ranking of one row is unchanged, the weights are not).
- **sinks** (GPT-OSS's ``s_aux``): one learned logit per query head joins every softmax as an
  extra column with no value row, ``out = sum_j e^{l_j} v_j / (sum_j e^{l_j} + e^{sink})``. Given
  the attention over the keys alone (out_k, lse_k), that is ``out_k * sigmoid(lse_k - sink)`` and
  ``lse = logaddexp(lse_k, sink)``: a rescaling after any path, the same for every backend.

- **window** (Mistral, Gemma 2/3, GPT-OSS: sliding; Llama 4: chunked): a local layer attends to its
  last `window` tokens only (models/attention/window.py keeps them as a ring); None for a global layer.

`AttentionVariant` carries them as ONE frozen object: models/attention/features.py builds it once per
attention module (`attention_variant`), and the ops take it as `variant=` (`topk_attention` and
`sparse_decode` also keep their `softcap=` / `sinks=` keywords for users, merged by `variant_of`).
Used by `topk_attention` (ops/attention) and `sparse_decode` (ops/sparse); the plain references
(naive.py of each) write the rules out literally instead.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.dtypes import NEG_INF

__all__ = ["AttentionVariant", "PLAIN", "variant_of", "capped", "softcap_", "softcap_slope_", "join_sinks", "sink_logits"]


@dataclass(frozen=True, eq=False)
class AttentionVariant:
    """The softmax rules of one layer's attention beyond scale and mask (None: not used).

        >>> AttentionVariant(softcap=30.0).plain
        False
    """

    softcap: float | None = None       # Gemma 2: logits -> softcap * tanh(logits / softcap)
    sinks: torch.Tensor | None = None  # (Hq,) GPT-OSS: one logit per query head joins every softmax
    window: int | None = None          # a local layer's window (sliding or chunked); None: global

    def __post_init__(self):
        # the fields in use, every field included (a subclass's too): what a backend row must declare it
        # applies (ops/backends.Impl.variant), or be refused; made once (a decode step asks per layer)
        object.__setattr__(self, "used", frozenset(f.name for f in fields(self) if getattr(self, f.name) is not None))

    @property
    def plain(self) -> bool:
        """True when the logits and the softmax are Llama's (no cap, no sink): any kernel runs it."""
        return self.softcap is None and self.sinks is None


PLAIN = AttentionVariant()  # Llama's attention: what every op assumes without a variant


def variant_of(softcap=None, sinks=None, variant: AttentionVariant | None = None) -> AttentionVariant:
    """The public ops' keywords as one AttentionVariant: `variant` (checked), else softcap / sinks
    (PLAIN when both are None). Giving both a variant and a keyword is an error.

        >>> variant_of(softcap=50.0).softcap, variant_of() is PLAIN
        (50.0, True)
    """
    if variant is None:
        return PLAIN if softcap is None and sinks is None else AttentionVariant(softcap, sinks)
    if not isinstance(variant, AttentionVariant):
        raise GatherTypeError(f"variant must be an AttentionVariant or None, got {type(variant).__name__}")
    if softcap is not None or sinks is not None:
        raise GatherValueError("softcap= or sinks= was given with variant=; set them in the AttentionVariant "
                               f"instead (variant.softcap = {variant.softcap!r})")
    return variant


def capped(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """s (...) -> softcap * tanh(s / softcap), a new tensor (autograd-safe); None: s itself."""
    return s if softcap is None else softcap * torch.tanh(s / softcap)


def softcap_(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """capped, in place on s (no autograd through it). Returns s."""
    if softcap is not None:
        s.div_(softcap).tanh_().mul_(softcap)
    return s


def softcap_slope_(s: torch.Tensor, softcap: float | None) -> torch.Tensor | None:
    """softcap_(s) in place, returning d capped / d logit = 1 - tanh^2 (same shape; None without a cap)."""
    if softcap is None:
        return None
    t = s.div_(softcap).tanh_()                                 # (...) tanh(s / softcap), in place
    slope = 1.0 - t * t                                         # (...)
    t.mul_(softcap)
    return slope


def sink_logits(sinks: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """sinks (H,) -> (1, H, 1) in lse's dtype, to broadcast against lse (B, H, Q)."""
    return sinks.to(lse.dtype).view(1, -1, 1)                   # (1, H, 1)


def join_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor | None):
    """The sink of each head joins the softmax: out (B, H, Q, Dv), lse (B, H, Q) over the keys
    alone -> out, lse with the sink (lse = logaddexp(lse, sink)); sinks None: unchanged.

    A row with no key gets out 0 and lse = sink. Plain torch ops: differentiable wherever out and
    lse are (topk_attention's autograd Function has its own backward, autograd.py).
    """
    if sinks is None:
        return out, lse
    sink = sink_logits(sinks, lse)                              # (1, H, 1)
    alive = lse > NEG_INF                                       # (B, H, Q)
    keep = torch.where(alive, torch.sigmoid(torch.where(alive, lse, 0.0) - sink), 0.0)  # (B, H, Q)
    wd = torch.promote_types(out.dtype, lse.dtype)              # float32 for 16-bit out, float64 kept
    out = (out.to(wd) * keep.to(wd).unsqueeze(-1)).to(out.dtype)  # (B, H, Q, Dv)
    return out, torch.logaddexp(lse, sink.expand_as(lse))       # (B, H, Q)
