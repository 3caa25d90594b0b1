"""One decode step of a whole stack of decoder layers (and the head) in one C++ operator.

    >>> plan = plan_model(model)                        # the model's DecodePlan (ops/layer/plan.py), made once
    >>> stack_refusal(plan)                             # None: the operator runs this plan here; else why not
    >>> logits = decode_stack(x, angles, plan, view, budgets, config.choice, scale)   # x (1, d) -> (1, V)

Each layer: RMSNorm, the q|k|v products on the weights' blocks (and their biases: Qwen2), the q and k
head norms (Qwen3, Gemma 3), RoPE with the cache's append (each layer the angles of its kind: Gemma 3's
local layers another base), sparse (or dense) decode over the pages (a local layer's ring: densely),
the o product (and its sandwich norm: Gemma), the residual and the norm before the MLP, SiLU- or
GELU-gated gate|up, the down product (and its sandwich norm) and the residual; then the final norm and
the head. `decode_stack` runs the
loop inside one C++ operator (decode_stack.cpp), which calls the operators a step is made of (ops/layer's,
the kernels of `q8act.kernel_of`, sparse decode's native kernels) straight to their CPU kernels: no
Python and no dispatch layers between them (~150 us a layer less at one token a step). Its plain twin is
the planned loop (models/runtime/step.py: the same operators called one by one from Python on the same
plan): bit-equal (tested), the same kernels on the same tensors in the same order. Nothing here falls
back: a plan the operator cannot run is an error naming why (`stack_refusal`; the decode-step table
asks it first and takes the planned loop instead, saying so).

Which pages a layer reads is decided here by the one rule (`page_choice.pages_to_read`, from the
layer's budget; None: dense); the caches are `PagedKVCache`s of batch 1 holding the same number of
tokens (and, for local layers, `WindowRing`s: their slot written, their held tokens read densely),
stored as the native decode operator reads them (`fused_decode.native_cache_fits`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.layer.fused import ACTIVATIONS
from gatherlens.ops.layer.plan import DecodePlan
from gatherlens.ops.native import load_library
from gatherlens.ops.quant.products.q8act import kernel_of
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.config import PageChoice
from gatherlens.ops.sparse.geometry import page_count
from gatherlens.ops.sparse.page_choice import pages_to_read
from gatherlens.ops.sparse.ring import WindowRing

__all__ = ["StackCaches", "decode_stack", "kernel_loaded", "stack_refusal", "KERNEL", "ACTIVATION_CODES"]

ACTIVATION_CODES = {name: i for i, name in enumerate(ACTIVATIONS)}  # the operator's `activation` argument

KERNEL = Path(__file__).with_name("decode_stack.cpp")


def kernel_loaded() -> bool:
    """True once `gatherlens::decode_stack` and every operator it calls are registered."""
    from gatherlens.ops.layer import fused
    from gatherlens.ops.sparse import fused_decode

    return fused.kernel_loaded() and fused_decode.kernel_loaded() and load_library(KERNEL, on_load=register_fakes)


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::decode_stack", _fake_stack)


def _fake_stack(x, cos, sin, heads, norms, eps, raws, kernels, qtypes, biases, keys, values, summaries, key_scales,
                value_scales, writes, lengths, pages, firsts, scale, per_head, group_sum, activation, final_norm,
                final_eps, head_raw, head_kernel, head_qtype, mass=0.0, min_pages=1, counts=None, covered=None):
    return x.new_empty(1, head_raw.shape[0]) if head_kernel else x.new_empty(x.shape)


def stack_refusal(plan: DecodePlan) -> str | None:
    """None when the operator can run this plan's weights here, else why not: every product (the head's
    too) a weight on the q8act route (its blocks; a bias beside them, not on the head), the kernels of their
    formats built, the operator built. (What the layers compute is the decode-step table's declaration.)"""
    if plan.head is None:
        return "the model has no output projection the walker found"
    products = [p for layer in plan.layers for p in layer.products() if p is not None] + [plan.head]
    for product in products:
        if product.blocks is None:
            return (f"{product.name} is not a q8act weight (the operator multiplies GGUF blocks on the "
                    f"q8act route)")
    if plan.head.bias is not None:
        return "the head has a bias (the operator's head is its blocks alone)"
    if not kernel_loaded():
        return "its C++ operator (decode_stack.cpp) did not build"
    missing = sorted({p.blocks.qtype for p in products if not kernel_of(p.blocks.qtype).loaded()})
    return f"the kernels of {', '.join(missing)} did not build" if missing else None


@dataclass
class StackCaches:
    """The layers' caches (one per layer, batch 1: a global layer's PagedKVCache, all equally long, one page
    size; a local layer's WindowRing) a stack step writes, with the lists the operator takes;
    `StackCaches.of(caches, old)` makes them again only when a cache's storage was made anew
    (`storage_version`) or when the step would not fit the room made.

    storage: keys, values, summaries, key_scales, value_scales: one list each, a tensor per layer.
    room: tokens every global cache has room for (a ring always has room for its next token).
    """

    caches: list
    versions: tuple
    storage: tuple
    room: int

    @classmethod
    def of(cls, caches: list, old: "StackCaches | None" = None, tokens: int = 1) -> "StackCaches":
        """A view of `caches` with room for `tokens` more (`old` itself while it is current)."""
        pages = [_pages(c) for c in caches]
        if old is not None and old.caches == caches and _global_length(caches) + tokens <= old.room and \
                all(p.storage_version == v for p, v in zip(pages, old.versions)):
            return old
        parts = [p.writable(tokens if p is c else 0) + p.scale_storage() for c, p in zip(caches, pages)]
        room = min((c.capacity for c in caches if isinstance(c, PagedKVCache)), default=1 << 62)
        return cls(list(caches), tuple(p.storage_version for p in pages), tuple(map(list, zip(*parts))), room)

    @property
    def length(self) -> int:
        """Tokens every layer has seen (the position of the step's token)."""
        return self.caches[0].length

    def positions(self) -> tuple[list[int], list[int]]:
        """(where each layer writes the step's token, how many tokens it then reads): a global layer its
        length and length + 1, a ring its slot and min(length + 1, window)."""
        writes = [c.slot if isinstance(c, WindowRing) else c.length for c in self.caches]
        reads = [min(c.length + 1, c.window) if isinstance(c, WindowRing) else c.length + 1 for c in self.caches]
        return writes, reads

    def advance(self) -> None:
        """Count the step's token in every layer."""
        for c in self.caches:
            c.written() if isinstance(c, WindowRing) else c.advance(1)


def _pages(cache) -> PagedKVCache:
    return cache.pages if isinstance(cache, WindowRing) else cache


def _global_length(caches: list) -> int:
    return max((c.length for c in caches if isinstance(c, PagedKVCache)), default=0)


def _reads(view: StackCaches, budgets: list, recent: int) -> tuple[list[int], list[int]]:
    """Per layer (pages to read or -1 for every page, first page of the recent window) of the step (its own
    token included): pages_to_read's rule on each global layer's budget (None: dense), asked once per
    distinct budget; a ring reads every held token."""
    length, known = view.length + 1, {}
    pages, firsts = [], []
    for cache, budget in zip(view.caches, budgets):
        if isinstance(cache, WindowRing):
            pages.append(-1)
            firsts.append(0)
            continue
        if budget not in known:
            n, first = pages_to_read(length, cache.page_size, length if budget is None else budget, recent)
            known[budget] = (-1 if n >= page_count(length, cache.page_size) else n, first)
        pages.append(known[budget][0])
        firsts.append(known[budget][1])
    return pages, firsts


def decode_stack(x: torch.Tensor, angles: list, plan: DecodePlan, view: StackCaches, budgets: list,
                 choice: PageChoice, scale: float, counts: torch.Tensor | None = None,
                 covered: torch.Tensor | None = None) -> torch.Tensor:
    """x (1, d) float32 -> logits (1, V), the token appended to every layer's cache. angles: per layer, the
    (cos, sin) (1, D) of its RoPE at the token's position. plan: the model's DecodePlan; view: the layers'
    caches (StackCaches.of, with room for the token); budgets: per layer (None: dense; with choice.mass, the
    auto budget's ceiling); choice: the page-choice rule (SparseConfig.choice); scale: the logit scale.
    counts: (layers, selection heads) int64, filled with the pages each head of each layer read (every page
    for a dense layer or a ring), or None. covered: (layers,) int64, filled with the pages each paged layer's
    KV groups needed (dense_runs.covered_pages; -1 for a layer read densely), or None. A plan the operator
    cannot run is an error naming why (`stack_refusal`)."""
    why = plan.state.get("stack_refusal", "")
    if why == "":
        why = plan.state["stack_refusal"] = stack_refusal(plan)
    if why is not None:
        raise GatherValueError(f"decode_stack cannot run this model: {why}")
    pages, firsts = _reads(view, budgets, choice.recent)
    writes, lengths = view.positions()
    raws, kernels, qtypes, biases = plan.flat()
    norms = plan.state.get("norms")
    if norms is None:
        lists = [layer.norm_list() for layer in plan.layers]
        norms = plan.state["norms"] = ([t.contiguous() for factors, _ in lists for t in factors],
                                       [eps for _, epsilons in lists for eps in epsilons])
    head = plan.head.blocks
    out = torch.ops.gatherlens.decode_stack(
        x, [c for c, _ in angles], [s for _, s in angles], plan.layers[0].heads, *norms, raws, kernels, qtypes, biases,
        *view.storage, writes, lengths, pages, firsts, scale, not choice.share_selection, choice.group_score == "sum",
        ACTIVATION_CODES[plan.layers[0].activation], plan.final_norm, plan.final_eps, head.raw, head.kernel,
        head.ggml_type, choice.mass or 0.0, choice.min_pages, counts, covered)  # (1, V)
    view.advance()
    return out
