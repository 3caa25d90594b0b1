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
does not compute (models/runtime/step.py's rows); the layer's plan holds what those need (its q/k
norms, its sandwich norms, its activation, the angle table its RoPE reads). Every norm weight is held
as the factor it multiplies by (Gemma's 1 + w already added). Plain data: tensors, ints, callables, the
objects a step hands to the attention call (its observers and kept selections name them): a
transformers attention module, or the native runtime's `LayerHandle`.

Two builders make it: `models/runtime/plan.plan_model` walks a transformers model's modules;
`models/runtime/native.plan_gguf` reads a GGUF file straight into it (no transformers module: the
angles from the file's rope parameters, ops/layer/rope.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
import functools
from typing import Callable

import torch

from gatherlens.ops.quant.formats.layout import LAYOUTS
from gatherlens.ops.quant.products.linear import linear_product
from gatherlens.ops.quant.products.q8act import kernel_of
from gatherlens.ops.quant.products.x8 import X8_OP, x8_matmul

__all__ = ["Blocks", "Product", "LayerPlan", "DecodePlan", "LayerHandle", "SLOTS", "NORMS", "Angles"]

SLOTS = ("q", "k", "v", "o", "gate", "up", "down")  # a layer's products, in the C++ stack's order
# a layer's norms, in the C++ stack's order: before attention, before the MLP, q and k heads, after
# attention and after the MLP (Gemma's sandwich); an absent one is an empty tensor
NORMS = ("input", "pre_mlp", "q", "k", "post_attention", "post_mlp")
Angles = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # positions (B, T) -> cos, sin (B, T, D) float32


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
    included. blocks: what the C++ stack multiplies (a weight on the q8act route), else None. bias: the
    (N,) float32 bias `run` adds (Qwen2's q/k/v), which the C++ stack adds after the blocks' product; None:
    none. act: the dtype it takes (QuantizedWeight.activation_dtype), None: the model's. name: where it is."""

    name: str
    run: Callable[[torch.Tensor], torch.Tensor]
    blocks: Blocks | None = None
    act: torch.dtype | None = None
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)  # (M, N)

    @classmethod
    def of_weight(cls, name: str, weight, bias: torch.Tensor | None = None) -> "Product":
        """The Product of a QuantizedWeight (and its (N,) bias): through `linear_product` (its table picks
        the row), with the C++ stack's Blocks where it is on the q8act route (its 8-row panels where the
        route repacked them). The one rule, for the walker's QuantizedLinears and the native runtime's
        weights alike."""
        bias = None if bias is None else bias.detach().float()  # (N,)
        run = functools.partial(linear_product, weight=weight) if bias is None else \
            functools.partial(_biased, weight, bias)
        blocks = None
        if weight.route == "q8act":
            blocks = Blocks(weight.raw, weight.qtype) if weight.panels is None else \
                Blocks(weight.panels, weight.qtype, panels=True)
        return cls(name, run, blocks, weight.activation_dtype, bias)


def _biased(weight, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y = linear_product(x, weight)  # (M, N)
    return y + bias.to(y.dtype)  # (M, N): Qwen2's q/k/v biases (float32 y: one add, as the C++ stack's)


class LayerHandle:
    """A decoder layer's attention outside transformers (the native runtime's plan, models/gguf/native.py):
    what decode_attention reads of a transformers attention module, stated. layer_idx: its index; rank: its
    index among the global layers (None: a local layer); the SparseConfig in its __dict__ as on a module
    (models/attention/features.global_rank reads the rank)."""

    def __init__(self, layer_idx: int, rank: int | None):
        self.layer_idx, self.rank = layer_idx, rank

    def __repr__(self) -> str:
        return f"LayerHandle(layer_idx={self.layer_idx}, rank={self.rank})"


@dataclass(frozen=True, eq=False)
class LayerPlan:
    """One decoder layer, as a step reads it.

    shape: its architecture's LayerShape. norms, eps: the RMSNorm factors before attention and before the
    MLP (Llama's input and post-attention norms; Gemma's input and pre-feed-forward norms) and their
    epsilons. qkv, gate_up: the groups (one packed Product, or one per part); o, down: Products.
    qkv_sizes: the widths q, k, v split into. heads, kv_heads, head_dim: Hq, Hkv, D. scaling: the
    logit scale. index: layer_idx; rank: among the global layers (SparseConfig.dense_layers counts it);
    window: a local layer's window (None: global). variant: its AttentionVariant. attention: the attention
    module (decode_attention's observers and kept selections). act: the dtype its products take.
    qk_norms, qk_eps: the RMSNorm factors of each q and k head (D,) before RoPE (Qwen3, Gemma 3), None: none.
    sandwich, sandwich_eps: the norms of the attention's and the MLP's outputs before each residual sum
    (Gemma 2/3), None: none. activation: the gated MLP's ("silu", "gelu_tanh": ops/layer's ACTIVATIONS).
    angles: the key of the plan's angle table its RoPE reads (Gemma 3: "sliding_attention" layers
    another base than "full_attention" ones).
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
    attention: object
    act: torch.dtype | None = None
    qk_norms: tuple[torch.Tensor, torch.Tensor] | None = None
    qk_eps: float = 0.0
    sandwich: tuple[torch.Tensor, torch.Tensor] | None = None
    sandwich_eps: tuple[float, float] = (0.0, 0.0)
    activation: str = "silu"
    angles: str = "default"

    def norm_list(self) -> tuple[list, list]:
        """NORMS as the C++ stack takes them: the factors (an empty tensor where absent) and epsilons."""
        qk, sw = self.qk_norms or (_EMPTY_F, _EMPTY_F), self.sandwich or (_EMPTY_F, _EMPTY_F)
        return ([*self.norms, *qk, *sw], [*self.eps, self.qk_eps, self.qk_eps, *self.sandwich_eps])

    def products(self) -> tuple[Product | None, ...]:
        """The SLOTS of the C++ stack: q, k, v, o, gate, up, down; None where a packed product covers the slot."""
        qkv = self.qkv + (None,) * (3 - len(self.qkv))
        gate_up = self.gate_up + (None,) * (2 - len(self.gate_up))
        return qkv + (self.o,) + gate_up + (self.down,)


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """A model's decode step, made once at install (models/runtime/plan.plan_model).

    layers: one LayerPlan per decoder layer (empty where the walker found none). final_norm, final_eps:
    the last RMSNorm's factor. head: the output projection's Product. embed: ids (B, T) -> (B, T, d)
    float32, Gemma's scale included (the model's embedding module, or the native runtime's
    QuantizedEmbedding); embed_scale: that scale (Gemma), None: none. angles: the rotary angle tables,
    key (LayerPlan.angles) -> positions (B, T) -> cos, sin (B, T, D); rope_type: their kind ("default",
    "llama3", ...: angles of a position that do not depend on the call, or not). logit_softcap: a final
    soft-capping of the logits (Gemma 2), None: none. refusal: why the walker could not describe the
    model (None: every part found). variants: the variant fields any layer uses. asked: the fastest row
    its steps may take (use_sparse_decoding's `step`). origin: who built it ("transformers": the walker
    over a transformers model; "gguf": the native runtime from the file, models/gguf/native.py). state:
    what steps keep from one to the next (the C++ stack's cache view, rotary angles; models/runtime/step.py).
    """

    layers: tuple[LayerPlan, ...]
    final_norm: torch.Tensor | None
    final_eps: float
    head: Product | None
    embed: Callable | None
    angles: dict = field(default_factory=dict)
    embed_scale: float | None = None
    rope_type: str = "default"
    logit_softcap: float | None = None
    refusal: str | None = None
    asked: str = "auto"
    variants: frozenset = frozenset()
    origin: str = "transformers"
    state: dict = field(default_factory=dict, repr=False)

    def flat(self) -> tuple[list, list, list, list]:
        """raws, kernel names, ggml type numbers, biases: SLOTS per layer, as the C++ stack takes them (made
        once; every product must have blocks: the stack row checks that first)."""
        if "flat" not in self.state:
            products = [p for layer in self.layers for p in layer.products()]
            slots = [p.blocks if p is not None else None for p in products]
            self.state["flat"] = ([b.raw if b else _EMPTY for b in slots], [b.kernel if b else "" for b in slots],
                                  [b.ggml_type if b else 0 for b in slots],
                                  [p.bias if p is not None and p.bias is not None else _EMPTY_F for p in products])
        return self.state["flat"]

    def stored_blocks(self) -> list[torch.Tensor]:
        """The blocks its products read as stored (no panels): every layer's and the head's raw rows."""
        products = [p for layer in self.layers for p in layer.products()] + [self.head]
        return [p.blocks.raw for p in products if p is not None and p.blocks is not None and not p.blocks.panels]


_EMPTY = torch.empty(0, dtype=torch.uint8)  # a slot a packed product covers
_EMPTY_F = torch.empty(0)  # an absent norm or bias
