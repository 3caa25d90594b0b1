"""The default lookup: the kernel F.embedding uses, plus the memory tricks that beat it.

    >>> fast_lookup(torch.tensor([[3, 1, 4]]), torch.randn(10, 6)).shape   # (B, S) -> (B, S, d)
    torch.Size([1, 3, 6])

What it does, and where each piece wins (figures: `gatherlens bench embedding`, docs/benchmarks.md):
- Small outputs: F.embedding itself (torch's allocator hands back warm memory).
- `out=`: `index_select` writes into the caller's buffer; no allocation, no page faults: memcpy speed.
- Large CPU outputs (32-384 MiB) go to a fresh mapping advised for transparent huge pages (see
  memory.py), then `index_select(out=)`: 2 MiB faults instead of 4 KiB ones, faster than
  F.embedding. Larger ones: F.embedding (asking for that many huge pages made the kernel
  compact memory, which lost).
- The CPU backward with fewer ids than rows (N < V) runs F.embedding's backward kernel on the
  distinct rows only (ids renumbered in order, so sums and rounding are F.embedding's) and copies
  them into a lazily zeroed (V, d) gradient (memory.zeros_lazy): only the 4 KiB pages of rows the
  ids touch are ever written, instead of zero-filling all V x d first. With N >= V:
  F.embedding's backward kernel itself.
- On CUDA the forward is F.embedding; with a gradient, a sort + segment_reduce backward that is
  deterministic (F.embedding's CUDA backward is not, in float32). For small CPU tables that need a
  gradient it is F.embedding itself (serial, deterministic backward on CPU).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherlens.errors import GatherValueError
from gatherlens.ops.embedding.memory import (HUGEPAGE_MAX, HUGEPAGE_THRESHOLD, LAZY_THRESHOLD, empty_hugepage,
                                             zeros_lazy)

__all__ = ["fast_lookup"]


class _HugePageLookup(torch.autograd.Function):
    """index_select into a huge-page buffer; backward: F.embedding's kernel, on the used rows when few."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, table: torch.Tensor, padding_idx: int | None):
        out = empty_hugepage((flat.numel(), table.shape[1]), table.dtype)  # (N, d)
        torch.index_select(table, 0, flat, out=out)
        ctx.save_for_backward(flat)
        ctx.table_shape, ctx.padding_idx = tuple(table.shape), padding_idx
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):  # grad: (N, d)
        (flat,) = ctx.saved_tensors
        vocab = ctx.table_shape[0]
        padding = -1 if ctx.padding_idx is None else ctx.padding_idx
        if flat.numel() >= vocab:  # as many ids as rows: most of the gradient is written anyway
            return None, torch.ops.aten.embedding_dense_backward(grad, flat, vocab, padding, False), None
        # Few ids: run F.embedding's own backward kernel on the U distinct rows only (ids renumbered
        # 0..U-1 in the same order, so every row sums its gradients in F.embedding's order and
        # rounding), then copy those rows into a lazily zeroed (V, d) gradient.
        unique, renumbered = torch.unique(flat, return_inverse=True)  # (U,), (N,)
        if padding >= 0:
            hit = (unique == padding).nonzero()
            padding = int(hit[0, 0]) if hit.numel() else -1
        rows = torch.ops.aten.embedding_dense_backward(grad, renumbered, unique.numel(), padding, False)  # (U, d)
        grad_table = zeros_lazy(ctx.table_shape, grad.dtype)  # (V, d): zero pages until written
        return None, grad_table.index_copy_(0, unique.long(), rows), None


class _CudaLookup(torch.autograd.Function):
    """F.embedding's forward; a sort-based backward that is deterministic on CUDA.

    F.embedding's CUDA backward can differ from run to run in float32 (seen on an H200 with 8192
    ids over 64 rows); here the ids are stably sorted, each run of equal ids is summed in order by
    `segment_reduce` (one thread per segment and column), and the sums are copied to their rows.
    """

    @staticmethod
    def forward(ctx, ids: torch.Tensor, table: torch.Tensor, padding_idx: int | None):
        ctx.save_for_backward(ids.reshape(-1))
        ctx.table_shape, ctx.padding_idx = tuple(table.shape), padding_idx
        return F.embedding(ids, table)  # (*ids.shape, d)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):  # grad: (*ids.shape, d)
        (flat,) = ctx.saved_tensors
        vocab, dim = ctx.table_shape
        rows = grad.reshape(-1, dim)  # (N, d)
        sorted_ids, order = torch.sort(flat, stable=True)  # (N,), (N,)
        unique, counts = torch.unique_consecutive(sorted_ids, return_counts=True)  # (U,), (U,)
        picked = rows[order]  # (N, d), equal ids now adjacent
        if picked.dtype in (torch.float16, torch.bfloat16):
            picked = picked.float()  # accumulate in float32, as F.embedding does
        sums = torch.segment_reduce(picked, "sum", lengths=counts).to(rows.dtype)  # (U, d)
        grad_table = rows.new_zeros(vocab, dim).index_copy_(0, unique.long(), sums)  # (V, d)
        if ctx.padding_idx is not None:
            grad_table[ctx.padding_idx] = 0
        return None, grad_table, None


def fast_lookup(ids: torch.Tensor, table: torch.Tensor, *, padding_idx: int | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows `ids` of `table`: (*ids.shape) -> (*ids.shape, d). Unchecked: validate first."""
    vocab, dim = table.shape
    needs_grad = table.requires_grad and torch.is_grad_enabled()
    if out is not None:
        if needs_grad:
            raise GatherValueError("out= cannot be used when the table requires grad (autograd cannot "
                                   "track a write into your buffer); call under torch.no_grad() or drop out=")
        torch.index_select(table, 0, ids.reshape(-1), out=out.view(ids.numel(), dim))  # (N, d) view of out
        return out
    if not table.is_cpu:
        if needs_grad and ids.numel():
            return _CudaLookup.apply(ids, table, padding_idx)  # deterministic backward
        return F.embedding(ids, table, padding_idx)  # (*ids.shape, d)
    itemsize = table.element_size()
    large_out = HUGEPAGE_THRESHOLD <= ids.numel() * dim * itemsize <= HUGEPAGE_MAX
    if needs_grad:
        # the backward gains from the lazily zeroed gradient whenever V x d is large and ids are few
        large_grad = vocab * dim * itemsize >= LAZY_THRESHOLD and ids.numel() < vocab
        if large_out or large_grad:
            flat = ids.reshape(-1)  # (N,)
            return _HugePageLookup.apply(flat, table, padding_idx).view(*ids.shape, dim)
        return F.embedding(ids, table, padding_idx)  # (*ids.shape, d)
    if large_out:
        flat = ids.reshape(-1)  # (N,)
        buffer = empty_hugepage((flat.numel(), dim), table.dtype)  # (N, d)
        return torch.index_select(table, 0, flat, out=buffer).view(*ids.shape, dim)
    return F.embedding(ids, table)  # (*ids.shape, d): small, warm allocator memory
