"""The plan of a decode step: what a one-token step of a stack of decoder layers reads, made once per model.

    >>> plan = plan_model(model)                  # models/runtime/plan.py: the one walker, at install
    >>> plan.layers[0].qkv, plan.layers[0].qkv_sizes   # (one packed Product,) or (q, k, v); (Hq*D, Hkv*D, Hkv*Dv)
    >>> plan.head.blocks                          # Blocks(raw, "Q8_0", panels=False): what the C++ stack multiplies
    >>> decode_stack(x, cos, sin, plan, view, budgets, config.choice, scale)   # ops/layer/stack.py reads it

One record per model (`DecodePlan`), one per decoder layer (`LayerPlan`), one per weight (`Product`: how
Python multiplies it, and, where it can, the GGUF blocks the C++ stack multiplies). Both ways of running
a step read this one record: the planned loop (models/runtime/step.py, the Python reference) and the
C++ stack (`gatherlens::decode_stack`). The packing decision (q|k|v, gate|up as one weight) is made once,
by the walker: a group is a tuple of one packed Product or of one Product per part.

A layer's `shape` is its architecture's `LayerShape` (models/gguf/arch.py: q/k/v biases, q/k norms,
sandwich norms, the MLP's activation, ...): what each way of running a step reads to refuse what it
does not compute (models/runtime/step.py's rows). Plain data: tensors, ints, callables, the modules a
step hands to the attention call (its observers and kept selections name them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from gatherlens.ops.quant.formats.layout import LAYOUTS
from gatherlens.ops.quant.products.q8act import kernel_of
from gatherlens.ops.quant.products.x8 import X8_OP, x8_matmul

__all__ = ["Blocks", "Product", "LayerPlan", "DecodePlan", "SLOTS"]

SLOTS = ("q", "k", "v", "o", "gate", "up", "down")  # a layer's products, in the C++ stack's order


@dataclass(frozen=True, eq=False)
class Blocks:
    """A weight as the C++ stack multiplies it: raw (N, row_bytes) uint8 of `qtype` (a format of
    q8act.kernel_of), as stored or (panels) repacked in panels of 8 rows (ops/quant/products/x8.py)."""

    raw: torch.Tensor
    qtype: str
    panels: bool = False

    @property
    def kernel(self) -> str:
        """The operator that multiplies it (its name, as the C++ stack dispatches)."""
        return X8_OP if self.panels else kernel_of(self.qtype).op

    @property
    def ggml_type(self) -> int:
        return LAYOUTS[self.qtype].ggml_type

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) float32 -> (M, N): the kernel itself (what the C++ stack calls)."""
        if self.panels:
            return x8_matmul(x, self.raw, self.qtype)  # (M, N)
        return kernel_of(self.qtype).matmul(x, self.raw, self.qtype)  # (M, N)


@dataclass(frozen=True, eq=False)
class Product:
    """One weight of a step. `run(x)`: x (M, K) -> (M, N) through the weight's own entrance (a
    QuantizedLinear's `linear_product`, an nn.Linear's `F.linear`, the head's transposed copy), its bias
    included. blocks: what the C++ stack multiplies (a bias-free weight on the q8act route), else None.
    act: the dtype it takes (QuantizedWeight.activation_dtype), None: the model's. name: where it is."""

    name: str
    run: Callable[[torch.Tensor], torch.Tensor]
    blocks: Blocks | None = None
    act: torch.dtype | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)  # (M, N)


@dataclass(frozen=True, eq=False)
class LayerPlan:
    """One decoder layer, as a step reads it.

    shape: its architecture's LayerShape. norms, eps: (input, post-attention) RMSNorm weights and
    epsilons. qkv, gate_up: the groups (one packed Product, or one per part); o, down: Products.
    qkv_sizes: the widths q, k, v split into. heads, kv_heads, head_dim: Hq, Hkv, D. scaling: the
    logit scale. index: layer_idx; rank: among the global layers (SparseConfig.dense_layers counts it);
    window: a local layer's window (None: global). variant: its AttentionVariant. attention: the attention
    module (decode_attention's observers and kept selections). act: the dtype its products take.
    """

    shape: object
    norms: tuple[torch.Tensor, torch.Tensor]
    eps: tuple[float, float]
    qkv: tuple[Product, ...]
    o: Product
    gate_up: tuple[Product, ...]
    down: Product
    qkv_sizes: tuple[int, int, int]
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    index: int
    rank: int | None
    window: int | None
    variant: object
    attention: torch.nn.Module
    act: torch.dtype | None = None

    def products(self) -> tuple[Product | None, ...]:
        """The SLOTS of the C++ stack: q, k, v, o, gate, up, down; None where a packed product covers the slot."""
        qkv = self.qkv + (None,) * (3 - len(self.qkv))
        gate_up = self.gate_up + (None,) * (2 - len(self.gate_up))
        return qkv + (self.o,) + gate_up + (self.down,)


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """A model's decode step, made once at install (models/runtime/plan.plan_model).

    layers: one LayerPlan per decoder layer (empty where the walker found none). final_norm, final_eps:
    the last RMSNorm. head: the output projection's Product. embed: the embedding module (ids ->
    (B, 1, d)); embed_scale: what the embedding is multiplied by (Gemma), None: nothing. rotary: the
    model's rotary module ((x, position_ids) -> cos, sin); rope_type: its kind ("default", "llama3", ...).
    logit_softcap: a final soft-capping of the logits (Gemma 2), None: none. refusal: why the walker
    could not describe the model (None: every part found). variants: the variant fields any layer uses.
    asked: the fastest row its steps may take (use_sparse_decoding's `step`). state: what steps keep
    from one to the next (the C++ stack's cache view, rotary angles; models/runtime/step.py).
    """

    layers: tuple[LayerPlan, ...]
    final_norm: torch.Tensor | None
    final_eps: float
    head: Product | None
    embed: torch.nn.Module | None
    rotary: torch.nn.Module | None
    embed_scale: float | None = None
    rope_type: str = "default"
    logit_softcap: float | None = None
    refusal: str | None = None
    asked: str = "auto"
    variants: frozenset = frozenset()
    state: dict = field(default_factory=dict, repr=False)

    def flat(self) -> tuple[list, list, list]:
        """raws, kernel names, ggml type numbers: SLOTS per layer, as the C++ stack takes them (made once;
        every product must have blocks: the stack row checks that first)."""
        if "flat" not in self.state:
            slots = [p.blocks if p is not None else None for layer in self.layers for p in layer.products()]
            self.state["flat"] = ([b.raw if b else _EMPTY for b in slots], [b.kernel if b else "" for b in slots],
                                  [b.ggml_type if b else 0 for b in slots])
        return self.state["flat"]


_EMPTY = torch.empty(0, dtype=torch.uint8)  # a slot a packed product covers
