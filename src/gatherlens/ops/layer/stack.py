"""One decode step of a whole stack of Llama-shaped layers (and the head) in one C++ operator.

    >>> weights = StackWeights(heads=9, norms=[...], eps=[...], products=[...], final_norm=w, final_eps=1e-5,
    ...                        head=Product(raw, "Q8_0"))                  # built once (models/runtime/stack.py)
    >>> logits = decode_stack(x, cos, sin, weights, caches, budgets, how, scale)   # x (1, d) -> (1, V)

Each layer: RMSNorm, the q|k|v products on the weight's blocks, RoPE with the paged cache's append,
sparse (or dense) decode over the pages, the o product, the residual and the second norm, SiLU-gated
gate|up, the down product and the residual; then the final norm and the head. `stack_reference` is
the same arithmetic as plain Python calling the same operators one by one (ops/layer, the q8act
kernels of `q8act.KERNEL_OF`, sparse decode's one entrance `decode_pages`); `decode_stack` runs the
loop inside one C++ operator (decode_stack.cpp), which calls those operators straight to their CPU
kernels: no Python and no dispatch layers between them (~150 us a layer less at one token a step).
The two are bit-equal (tested): the same kernels on the same tensors in the same order.

Which pages a layer reads is decided here by the one rule (`page_choice.pages_to_read`, from the
layer's budget; None: dense); the caches are `PagedKVCache`s of batch 1 holding the same number of
tokens, stored as the native decode operator reads them (`fused_decode.native_cache_fits`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from gatherlens.ops.native import load_library
from gatherlens.ops.quant.layout import LAYOUTS
from gatherlens.ops.quant.q8act import KERNEL_OF
from gatherlens.ops.quant.x8 import X8_OP, x8_matmul
from gatherlens.ops.sparse.geometry import page_count
from gatherlens.ops.sparse.page_choice import pages_to_read

__all__ = ["Product", "StackWeights", "StackCaches", "SLOTS", "decode_stack", "stack_reference", "kernel_loaded",
           "stack_fits", "KERNEL"]

KERNEL = Path(__file__).with_name("decode_stack.cpp")
SLOTS = ("q", "k", "v", "o", "gate", "up", "down")  # a layer's products, in the operator's order


@dataclass(frozen=True)
class Product:
    """One weight as its GGUF blocks: raw (N, row_bytes) uint8 of `qtype` (a format of KERNEL_OF), as
    stored or (panels) repacked in panels of 8 rows (ops/quant/x8.py)."""

    raw: torch.Tensor
    qtype: str
    panels: bool = False

    @property
    def kernel(self) -> str:
        return X8_OP if self.panels else KERNEL_OF[self.qtype].op  # the operator that multiplies it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.panels:
            return x8_matmul(x, self.raw, self.qtype)  # (M, N)
        return KERNEL_OF[self.qtype].matmul(x, self.raw, self.qtype)  # (M, N)


_EMPTY = Product(torch.empty(0, dtype=torch.uint8), "")  # a slot a packed product covers


@dataclass(frozen=True)
class StackWeights:
    """What a stack's step reads that does not change from step to step.

    heads: Hq. norms / eps: 2 per layer (input, post-attention). products: one tuple of SLOTS per
    layer, None where the slot before it holds a packed q|k|v or gate|up. head: None for a stack
    that returns the last layer's output (before the final norm) instead of logits.
    """

    heads: int
    norms: tuple[torch.Tensor, ...]
    eps: tuple[float, ...]
    products: tuple[tuple[Product | None, ...], ...]
    final_norm: torch.Tensor
    final_eps: float
    head: Product | None
    _flat: dict = field(default_factory=dict, compare=False, repr=False)

    def flat(self) -> tuple[list, list, list]:
        """raws, kernel names, ggml type numbers: SLOTS per layer, as the operator takes them (made once)."""
        if not self._flat:
            slots = [p or _EMPTY for layer in self.products for p in layer]
            self._flat["v"] = ([p.raw for p in slots], [p.kernel if p.qtype else "" for p in slots],
                               [LAYOUTS[p.qtype].ggml_type if p.qtype else 0 for p in slots])
        return self._flat["v"]


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


def stack_fits(weights: StackWeights) -> str | None:
    """None when the operator can run these weights here (every kernel built), else why not."""
    if not kernel_loaded():
        return "its C++ operator (decode_stack.cpp) did not build"
    used = {p.qtype for layer in weights.products for p in layer if p is not None}
    used |= {weights.head.qtype} if weights.head is not None else set()
    missing = sorted(q for q in used if not KERNEL_OF[q].loaded())
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


def _reads(length: int, page_size: int, budgets: list, how: dict) -> tuple[list[int], list[int]]:
    """Per layer (pages to read or -1 for every page, first page of the recent window) of a step over
    `length` tokens (its own included): pages_to_read's rule on each layer's budget (None: dense), asked
    once per distinct budget."""
    known = {}
    for budget in set(budgets):
        n, first = pages_to_read(length, page_size, length if budget is None else budget, how["recent"])
        known[budget] = (-1 if n >= page_count(length, page_size) else n, first)
    return [known[b][0] for b in budgets], [known[b][1] for b in budgets]


def decode_stack(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weights: StackWeights, view: StackCaches,
                 budgets: list, how: dict, scale: float, counts: torch.Tensor | None = None) -> torch.Tensor:
    """x (1, d) float32 -> logits (1, V) (or the last layer's output (1, d) when weights.head is None),
    the token appended to every layer's cache. cos, sin (1, D): its rotary angles. view: the layers'
    caches (StackCaches.of, with room for the token); budgets: per layer (None: dense; with how["mass"],
    the auto budget's ceiling); how: the choice rule (`decode.choice_of_config`); scale: the logit scale.
    counts: (layers, selection heads) int64, filled with the pages each head of each layer read (every
    page for a dense layer), or None. Falls back to stack_reference when the operator cannot run (stack_fits)."""
    if stack_fits(weights) is not None:
        return stack_reference(x, cos, sin, weights, view, budgets, how, scale, counts)
    first = view.caches[0]
    pages, firsts = _reads(first.length + 1, first.page_size, budgets, how)  # the step's token included
    raws, kernels, qtypes = weights.flat()
    head = weights.head
    out = torch.ops.gatherlens.decode_stack(
        x, cos.float().contiguous(), sin.float().contiguous(), weights.heads, list(weights.norms), list(weights.eps),
        raws, kernels, qtypes, *view.storage, first.length, pages, firsts, scale, not how["share_selection"],
        how["group_score"] == "sum", weights.final_norm, weights.final_eps, _EMPTY.raw if head is None else head.raw,
        "" if head is None else head.kernel, 0 if head is None else LAYOUTS[head.qtype].ggml_type,
        how["mass"] or 0.0, how["min_pages"], counts)  # (1, V) | (1, d)
    for cache in view.caches:
        cache.advance(1)
    return out


def stack_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weights: StackWeights,
                    view: StackCaches, budgets: list, how: dict, scale: float,
                    counts: torch.Tensor | None = None) -> torch.Tensor:
    """decode_stack as plain Python: the same operators called one by one (same signature and results)."""
    from gatherlens.ops.layer.fused import add_rms_norm_cast, rms_norm_cast, rope_append, silu_mul_cast
    from gatherlens.ops.sparse.decode import decode_pages

    f32 = torch.float32
    for i, cache in enumerate(view.caches):
        q, k, v, o, gate, up, down = weights.products[i]
        h = rms_norm_cast(x, weights.norms[2 * i], weights.eps[2 * i], f32)  # (1, d)
        qkv = _grouped(h, (q, k, v))  # (1, (Hq + 2 Hkv) D)
        width = (weights.heads * cache.head_dim, cache.kv_heads * cache.head_dim)
        qr = rope_append(qkv[:, :width[0]], qkv[:, width[0]:sum(width)], qkv[:, sum(width):], cos, sin,
                         cache)  # (1, Hq, D); the token in the cache
        budget = cache.length if budgets[i] is None else budgets[i]
        pages, _, att, _ = decode_pages(qr.unsqueeze(2), cache, budget, how, scale)  # att (1, Hq, 1, Dv)
        if counts is not None:  # pages (1, Hsel, n) on the sparse rows, else every page
            counts[i] = cache.num_pages if pages is None else (pages[0] >= 0).sum(-1)
        s, h = add_rms_norm_cast(x, o(att.reshape(1, -1)), weights.norms[2 * i + 1], weights.eps[2 * i + 1], f32)
        x = s + down(silu_mul_cast(_grouped(h, (gate, up)), f32))  # (1, d)
    if weights.head is None:
        return x
    return weights.head(rms_norm_cast(x, weights.final_norm, weights.final_eps, f32))  # (1, V)


def _grouped(h: torch.Tensor, parts) -> torch.Tensor:
    """The products of one group (q|k|v or gate|up) of h (1, K) as one row (1, sum N)."""
    outs = [p(h) for p in parts if p is not None]  # (1, N) each
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)  # (1, sum N)
