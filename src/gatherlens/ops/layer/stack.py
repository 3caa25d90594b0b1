"""One decode step of a whole stack of Llama-shaped layers (and the head) in one C++ operator.

    >>> plan = plan_model(model)                        # the model's DecodePlan (ops/layer/plan.py), made once
    >>> stack_refusal(plan)                             # None: the operator runs this plan here; else why not
    >>> logits = decode_stack(x, cos, sin, plan, view, budgets, config.choice, scale)   # x (1, d) -> (1, V)

Each layer: RMSNorm, the q|k|v products on the weight's blocks, RoPE with the paged cache's append,
sparse (or dense) decode over the pages, the o product, the residual and the second norm, SiLU-gated
gate|up, the down product and the residual; then the final norm and the head. `decode_stack` runs the
loop inside one C++ operator (decode_stack.cpp), which calls the operators a step is made of (ops/layer's,
the kernels of `q8act.kernel_of`, sparse decode's native kernels) straight to their CPU kernels: no
Python and no dispatch layers between them (~150 us a layer less at one token a step). Its plain twin is
the planned loop (models/runtime/step.py: the same operators called one by one from Python on the same
plan): bit-equal (tested), the same kernels on the same tensors in the same order. Nothing here falls
back: a plan the operator cannot run is an error naming why (`stack_refusal`; the decode-step table
asks it first and takes the planned loop instead, saying so).

Which pages a layer reads is decided here by the one rule (`page_choice.pages_to_read`, from the
layer's budget; None: dense); the caches are `PagedKVCache`s of batch 1 holding the same number of
tokens, stored as the native decode operator reads them (`fused_decode.native_cache_fits`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.layer.plan import DecodePlan
from gatherlens.ops.native import load_library
from gatherlens.ops.quant.products.q8act import kernel_of
from gatherlens.ops.sparse.config import PageChoice
from gatherlens.ops.sparse.geometry import page_count
from gatherlens.ops.sparse.page_choice import pages_to_read

__all__ = ["StackCaches", "decode_stack", "kernel_loaded", "stack_refusal", "KERNEL"]

KERNEL = Path(__file__).with_name("decode_stack.cpp")


def kernel_loaded() -> bool:
    """True once `gatherlens::decode_stack` and every operator it calls are registered."""
    from gatherlens.ops.layer import fused
    from gatherlens.ops.sparse import fused_decode

    return fused.kernel_loaded() and fused_decode.kernel_loaded() and load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::decode_stack", _fake_stack)


def _fake_stack(x, cos, sin, heads, norms, eps, raws, kernels, qtypes, keys, values, summaries, key_scales,
                value_scales, position, pages, firsts, scale, per_head, group_sum, final_norm, final_eps, head_raw,
                head_kernel, head_qtype, mass=0.0, min_pages=1, counts=None):
    return x.new_empty(1, head_raw.shape[0]) if head_kernel else x.new_empty(x.shape)


def stack_refusal(plan: DecodePlan) -> str | None:
    """None when the operator can run this plan's weights here, else why not: every product (the head's
    too) a bias-free weight on the q8act route (its blocks), the kernels of their formats built, the
    operator built. (What the layers compute beyond Llama's is the decode-step table's declaration.)"""
    if plan.head is None:
        return "the model has no output projection the walker found"
    products = [p for layer in plan.layers for p in layer.products() if p is not None] + [plan.head]
    for product in products:
        if product.blocks is None:
            return (f"{product.name} is not a bias-free q8act weight (the operator multiplies GGUF blocks on the "
                    f"q8act route)")
    if not kernel_loaded():
        return "its C++ operator (decode_stack.cpp) did not build"
    missing = sorted({p.blocks.qtype for p in products if not kernel_of(p.blocks.qtype).loaded()})
    return f"the kernels of {', '.join(missing)} did not build" if missing else None


@dataclass
class StackCaches:
    """The PagedKVCaches (one per layer, batch 1, equally long, one page size) a stack step writes, with
    the lists the operator takes; `StackCaches.of(caches, old)` makes them again only when a cache's
    storage was made anew (`storage_version`) or when the step would not fit the room made.

    storage: keys, values, summaries, key_scales, value_scales: one list each, a tensor per layer.
    room: tokens every cache has room for.
    """

    caches: list
    versions: tuple
    storage: tuple
    room: int

    @classmethod
    def of(cls, caches: list, old: "StackCaches | None" = None, tokens: int = 1) -> "StackCaches":
        """A view of `caches` with room for `tokens` more (`old` itself while it is current)."""
        if old is not None and old.caches == caches and caches[0].length + tokens <= old.room and \
                all(c.storage_version == v for c, v in zip(caches, old.versions)):
            return old
        parts = [c.writable(tokens) + c.scale_storage() for c in caches]  # room made; (k, v, s, ks, vs) each
        return cls(list(caches), tuple(c.storage_version for c in caches), tuple(map(list, zip(*parts))),
                   min(c.capacity for c in caches))


def _reads(length: int, page_size: int, budgets: list, recent: int) -> tuple[list[int], list[int]]:
    """Per layer (pages to read or -1 for every page, first page of the recent window) of a step over
    `length` tokens (its own included): pages_to_read's rule on each layer's budget (None: dense), asked
    once per distinct budget."""
    known = {}
    for budget in set(budgets):
        n, first = pages_to_read(length, page_size, length if budget is None else budget, recent)
        known[budget] = (-1 if n >= page_count(length, page_size) else n, first)
    return [known[b][0] for b in budgets], [known[b][1] for b in budgets]


def decode_stack(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: DecodePlan, view: StackCaches,
                 budgets: list, choice: PageChoice, scale: float, counts: torch.Tensor | None = None) -> torch.Tensor:
    """x (1, d) float32 -> logits (1, V), the token appended to every layer's cache. cos, sin (1, D): its
    rotary angles. plan: the model's DecodePlan; view: the layers' caches (StackCaches.of, with room for
    the token); budgets: per layer (None: dense; with choice.mass, the auto budget's ceiling); choice: the
    page-choice rule (SparseConfig.choice); scale: the logit scale. counts: (layers, selection heads)
    int64, filled with the pages each head of each layer read (every page for a dense layer), or None.
    A plan the operator cannot run is an error naming why (`stack_refusal`)."""
    why = plan.state.get("stack_refusal", "")
    if why == "":
        why = plan.state["stack_refusal"] = stack_refusal(plan)
    if why is not None:
        raise GatherValueError(f"decode_stack cannot run this model: {why}")
    first = view.caches[0]
    pages, firsts = _reads(first.length + 1, first.page_size, budgets, choice.recent)  # the step's token included
    raws, kernels, qtypes = plan.flat()
    norms = plan.state.get("norms")
    if norms is None:
        norms = plan.state["norms"] = ([t for layer in plan.layers for t in layer.norms],
                                       [e for layer in plan.layers for e in layer.eps])
    head = plan.head.blocks
    out = torch.ops.gatherlens.decode_stack(
        x, cos.float().contiguous(), sin.float().contiguous(), plan.layers[0].heads, *norms, raws, kernels, qtypes,
        *view.storage, first.length, pages, firsts, scale, not choice.share_selection, choice.group_score == "sum",
        plan.final_norm, plan.final_eps, head.raw, head.kernel, head.ggml_type, choice.mass or 0.0,
        choice.min_pages, counts)  # (1, V)
    for cache in view.caches:
        cache.advance(1)
    return out
