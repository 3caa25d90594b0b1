"""`apply_attention_scores`: the article's function, corrected.

    >>> scores = torch.randn(2, 4, 5, 7)                         # (B, H, Q, K), already scaled
    >>> values = torch.randn(2, 4, 7, 16)                        # (B, H, K, D)
    >>> apply_attention_scores(scores, values).shape             # (B, H, Q, D)
    torch.Size([2, 4, 5, 16])

The article divided scores that are already scaled by sqrt(d) a second time and used an undefined
`np`. Here the scores are taken as the final logits: out = softmax(scores + mask) @ values.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.dtypes import NEG_INF


def apply_attention_scores(scores: torch.Tensor, values: torch.Tensor, *, mask=None) -> torch.Tensor:
    r"""Softmax-weighted sum of value rows: ``softmax(scores + mask, dim=-1) @ values``.

    The article's second function, corrected: ``scores`` are taken as the final logits (already
    scaled), so they are not divided by :math:`\sqrt{d}` again. A query whose keys are all masked
    gets a row of zeros, not NaN. Differentiable in ``scores`` and ``values``.

    Args:
        scores (Tensor): scaled attention logits, floating point.
        values (Tensor): the value rows, floating point.
        mask (Tensor, optional, keyword-only): bool (``True`` = attend) or an additive float
            mask, broadcastable to ``scores``.

    Shape:
        - scores: :math:`(B, H, Q, K)`
        - values: :math:`(B, H, K, D)`
        - mask: broadcastable to :math:`(B, H, Q, K)`
        - output: :math:`(B, H, Q, D)`

    Returns:
        Tensor: the attention output, in ``values.dtype``.

    Example::

        >>> scores = torch.randn(2, 4, 5, 7)           # (B, H, Q, K), already scaled
        >>> values = torch.randn(2, 4, 7, 16)          # (B, H, K, D)
        >>> apply_attention_scores(scores, values).shape
        torch.Size([2, 4, 5, 16])
    """
    _check_scores_values(scores, values)
    s = scores if mask is None else _apply_mask(scores, mask)  # (B, H, Q, K)
    alive = (s > NEG_INF).any(-1, keepdim=True)                # (B, H, Q, 1)
    s = s.masked_fill(~alive, 0.0)                             # empty rows: finite, zeroed below
    w = torch.softmax(s, dim=-1) * alive                       # (B, H, Q, K)
    return torch.matmul(w.to(values.dtype), values)            # (B, H, Q, D)


def _check_scores_values(scores, values) -> None:
    for name, t in (("scores", scores), ("values", values)):
        if not isinstance(t, torch.Tensor):
            raise GatherTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise GatherTypeError(f"{name} has dtype {t.dtype}; expected a floating-point dtype")
        if t.dim() != 4:
            raise GatherValueError(f"{name} has shape {tuple(t.shape)} ({t.dim()}-D); expected 4-D")
    if scores.shape[:2] != values.shape[:2] or scores.shape[-1] != values.shape[-2]:
        raise GatherValueError(
            f"scores {tuple(scores.shape)} (B, H, Q, K) and values {tuple(values.shape)} (B, H, K, D) "
            f"disagree: B, H and K must match"
        )


def _apply_mask(scores: torch.Tensor, mask) -> torch.Tensor:
    """scores with -inf where a bool mask is False, or plus a float mask."""
    if not isinstance(mask, torch.Tensor):
        raise GatherTypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    try:
        shape = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        shape = None
    if shape != scores.shape:  # a mask may broadcast to the scores, never enlarge them
        raise GatherValueError(
            f"mask has shape {tuple(mask.shape)}, which does not broadcast to scores {tuple(scores.shape)}"
        )
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, NEG_INF)
    if mask.is_floating_point():
        return scores + mask.to(scores.dtype)
    raise GatherTypeError(f"mask has dtype {mask.dtype}; use bool (True = attend) or float")
