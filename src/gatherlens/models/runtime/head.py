"""The output projection of a decode step, with its weight laid out for one row at a time.

    >>> product = transposed_head(model.get_output_embeddings())   # the plan's head (plan.py) for a CPU nn.Linear
    >>> product(x)                                                 # x (M, d) -> (M, V): x @ W.T stored contiguous

A decode step multiplies one hidden row by the (V, d) output table: for SmolLM2 that is 49,152 x
576 floats, 113 MB read per token, the largest single matmul of the step. On the CPU,
`F.linear(x, W)` with one row runs as a matrix-vector product over W's rows at a lower memory
bandwidth than `x @ Wt` reaches with Wt = W.T stored contiguous (d, V): the same products,
read as rows of Wt, on both threads (`gatherlens bench generate`; docs/bench/notes.md). So the decode
plan of a model with a plain CPU head keeps such a copy (V x d more memory: 113 MB for SmolLM2), and
the planned step (step.py) multiplies by it; transformers' own forward (prefill, the "hf" row) keeps
`F.linear`. The copy is made when the plan is (not inside the first decode step), rebuilt if the
weight changes (its version counter moves) and dropped with the plan.
Results equal `F.linear`'s up to float rounding (the sums run in another order).
"""
from __future__ import annotations

import torch

__all__ = ["transposed_head", "TransposedHead"]


class TransposedHead:
    """x (M, d) -> (M, V) = x @ W.T + b for a CPU nn.Linear head, reading W.T stored contiguous (d, V)."""

    def __init__(self, head: torch.nn.Linear):
        self.head, self.version, self.copy = head, None, None
        self.transposed()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(x, self.transposed())  # (M, V)
        bias = self.head.bias
        return out if bias is None else out + bias

    def transposed(self) -> torch.Tensor:
        """The head's W.T stored contiguous (d, V): the kept copy, or a new one if W changed."""
        W = self.head.weight
        now = _version_of(W)
        if self.version != now:
            with torch.no_grad():
                self.copy = W.detach().t().contiguous()  # (d, V)
            self.version = now
        return self.copy


def transposed_head(head: torch.nn.Linear) -> TransposedHead:
    """The head's one-row product, its transposed copy made now."""
    return TransposedHead(head)


def _version_of(W: torch.Tensor) -> tuple:
    """What identifies W's values: its storage, shape and in-place write count (an inference
    tensor has no write count: it cannot be written outside inference mode, and is then rebuilt
    only if its storage or shape changes)."""
    try:
        writes = W._version
    except RuntimeError:
        writes = None
    return writes, W.data_ptr(), tuple(W.shape), W.dtype
