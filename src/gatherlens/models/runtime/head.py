"""The output projection of a decode step, with its weight laid out for one row at a time.

    >>> install_lean_head(model)        # use_sparse_decoding does this (lean=True, CPU models)
    >>> lean_head_active(model)         # True while the transposed copy is in use
    >>> remove_lean_head(model)         # use_dense_decoding does this; the copy is freed

A decode step multiplies one hidden row by the (V, d) output table: for SmolLM2 that is 49,152 x
576 floats, 113 MB read per token, the largest single matmul of the step. On the CPU,
`F.linear(x, W)` with one row runs as a matrix-vector product over W's rows at a lower memory
bandwidth than `x @ Wt` reaches with Wt = W.T stored contiguous (d, V): the same products,
read as rows of Wt, on both threads (`gatherlens bench generate`; docs/bench/notes.md). So while
sparse decoding is on, the head keeps such a copy (V x d more memory: 113 MB for SmolLM2) and one-row
steps use it; everything else (prefill, several rows, gradients, another device) runs `F.linear`.
The copy is made on installation (not inside the first decode step), rebuilt if the weight
changes (its version counter moves) and dropped on removal.
Results equal `F.linear`'s up to float rounding (the sums run in another order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.models.hf_adapter import forward_replaced, replace_forward, restore_forward

__all__ = ["install_lean_head", "remove_lean_head", "lean_head_active"]

_COPY = "gatherlens_weight_t"         # the head's attribute holding (version, Wt)


def _head(model) -> torch.nn.Module | None:
    """The model's output projection when it is a plain CPU nn.Linear, else None."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear or head.weight.device.type != "cpu":
        return None
    return head


def install_lean_head(model) -> bool:
    """Give the output projection the one-row path; False when the model has no plain CPU head."""
    head = _head(model)
    if head is None:
        return False
    replace_forward(head, lean_head_forward)
    _transposed(head)
    return True


def remove_lean_head(model) -> None:
    """The head's class forward back, and its transposed copy freed."""
    head = _head(model)
    if head is not None:
        restore_forward(head)
        head.__dict__.pop(_COPY, None)


def lean_head_active(model) -> bool:
    head = _head(model)
    return head is not None and forward_replaced(head)


def lean_head_forward(self, x: torch.Tensor) -> torch.Tensor:
    """x (..., d) -> (..., V): one row as x @ Wt, anything else as F.linear."""
    W = self.weight
    one_row = x.numel() == x.shape[-1] and x.dtype == W.dtype and x.device == W.device
    if not one_row or (torch.is_grad_enabled() and (W.requires_grad or x.requires_grad)):
        return F.linear(x, W, self.bias)
    out = torch.matmul(x, _transposed(self))  # (..., V)
    return out if self.bias is None else out + self.bias


def _transposed(head: torch.nn.Linear) -> torch.Tensor:
    """The head's W.T stored contiguous (d, V): the kept copy, or a new one if W changed."""
    W = head.weight
    version, Wt = head.__dict__.get(_COPY, (None, None))
    now = _version_of(W)
    if version != now:
        with torch.no_grad():
            Wt = W.detach().t().contiguous()  # (d, V)
        head.__dict__[_COPY] = (now, Wt)
    return Wt


def _version_of(W: torch.Tensor) -> tuple:
    """What identifies W's values: its storage, shape and in-place write count (an inference
    tensor has no write count: it cannot be written outside inference mode, and is then rebuilt
    only if its storage or shape changes)."""
    try:
        writes = W._version
    except RuntimeError:
        writes = None
    return writes, W.data_ptr(), tuple(W.shape), W.dtype
