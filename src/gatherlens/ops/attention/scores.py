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


def apply_attention_scores(scores: torch.Tensor, values: torch.Tensor, *, mask=None) -> torch.Tensor:
    """softmax(scores) @ values, with an optional mask.

    scores (B, H, Q, K): scaled logits. values (B, H, K, D). mask: bool (True = attend) or
    additive float, broadcastable to (B, H, Q, K). A query row whose keys are all masked gives a
    row of zeros (not NaN). Differentiable.
    """
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
    s = scores                                                  # (B, H, Q, K)
    if mask is not None:
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
            s = s.masked_fill(~mask, float("-inf"))
        elif mask.is_floating_point():
            s = s + mask.to(s.dtype)
        else:
            raise GatherTypeError(f"mask has dtype {mask.dtype}; use bool (True = attend) or float")
    alive = (s > float("-inf")).any(-1, keepdim=True)          # (B, H, Q, 1)
    s = s.masked_fill(~alive, 0.0)                             # empty rows: finite, zeroed below
    w = torch.softmax(s, dim=-1) * alive                       # (B, H, Q, K)
    return torch.matmul(w.to(values.dtype), values)            # (B, H, Q, D)
