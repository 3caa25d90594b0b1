"""Mixture-of-experts layers (qwen3_moe, qwen2_moe) run from their GGUF blocks: picking experts is a gather.

    >>> fill_moe(layer.mlp, 0, reader, tables, config, linear_from)    # models/gguf/quantized.py fills a MoE layer
    >>> layer.mlp.experts.num_experts, layer.mlp.gate.top_k            # QuantizedExperts, ExpertRouter
    (4, 2)
    >>> layer.mlp(hidden).shape                                         # transformers' own block forward
    torch.Size([1, 8, 64])

GGUF stores a layer's experts stacked: `blk.{i}.ffn_gate_exps.weight` is one tensor of numpy shape
(E, I, row_bytes), E experts of I rows of blocks each (`ffn_up_exps` the same, `ffn_down_exps`
(E, d, row_bytes)); the router `ffn_gate_inp` is (E, d), F32 in llama.cpp's files. Choosing experts is a
gather whose rows are whole matrices: the router's top-k indices `index` (T, k) pick, for token t, the k
tables `gate_exps[index[t]]` (k, I, row_bytes) of the stacked (E, I, row_bytes) one, exactly as an
embedding lookup picks rows of (V, d) by token id. `ExpertRouter` computes `index` (the same math as
transformers' Qwen3MoeTopKRouter / Qwen2MoeTopKRouter: float32 logits, softmax, top-k, renormalised
when `norm_topk_prob`); `QuantizedExperts` runs the picked experts. Its `reference` writes the gather
out token by token; its `forward` inverts it, grouping the tokens per expert (argsort of the flat
index): expert e's rows are read once for all n_e tokens that chose it, one (n_e, d) product per
expert, which a prefill of many tokens needs. They are tested equal.

Each expert's gate/up/down is a `QuantizedLinear` made by the loader's `linear_from(raw, qtype)` from
`raw[e]`, a view (I, row_bytes) of the mapped file: no copy, and the route stays the loader's choice.
The router (E x d floats) and qwen2_moe's shared-expert gate `ffn_gate_inp_shexp` (d,) stay float32 (a
view of an F32 tensor): a routing decision is discrete, so its logits are not rounded. qwen2_moe's
shared expert `ffn_{gate,up,down}_shexp` are three more `linear_from` linears. Which gguf tensor fills
which child of the block is models/gguf/arch.py's EXPERTS rows (`EXPERT_KINDS`, `SHARED_KINDS` read them).

What this relies on in transformers (5.x, tested against its own block): the MoE block's children
`gate` (called as `gate(x) -> (logits, weights, index)`), `experts` (called as `experts(x, index,
weights)`, with an `act_fn`), qwen2_moe's `shared_expert.{gate,up,down}_proj` and `shared_expert_gate`.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from gatherlens.errors import GatherValueError
from gatherlens.models.gguf.arch import ARCHS, EXPERTS
from gatherlens.ops.quant import dequantize_rows

__all__ = ["fill_moe", "has_experts", "stacked_blocks", "float_weight", "ExpertRouter", "QuantizedExperts",
           "EXPERT_KINDS", "SHARED_KINDS"]


def _moe_children() -> dict[str, str]:
    """{gguf kind: the MoE block's child it fills} ("ffn_gate_inp": "gate", "ffn_gate_exps": "experts",
    "ffn_gate_shexp": "shared_expert.gate_proj", ...): models/gguf/arch.py's EXPERTS rows, in their order."""
    return {row.gguf.rsplit(".", 1)[1]: row.hf.split(".mlp.", 1)[1]
            for arch in ARCHS.values() for row in arch.rows if row.kind == EXPERTS}


_CHILDREN = _moe_children()
_ROUTER = next(kind for kind, child in _CHILDREN.items() if child == "gate")  # ffn_gate_inp (E, d)
_SHARED_GATE = next(kind for kind, child in _CHILDREN.items() if child == "shared_expert_gate")  # (d,)
EXPERT_KINDS = tuple(kind for kind, child in _CHILDREN.items() if child == "experts")  # gate, up, down stacks
SHARED_KINDS = {kind: child for kind, child in _CHILDREN.items() if child.startswith("shared_expert.")}


def has_experts(tables: dict, layer_index: int) -> bool:
    """True when layer `layer_index` of the file has stacked experts (a dense layer of a MoE model has not)."""
    return f"blk.{layer_index}.{EXPERT_KINDS[0]}.weight" in tables


def fill_moe(mlp_module, layer_index: int, reader, tables: dict, config, linear_from) -> None:
    """Give transformers' MoE block `mlp_module` (built on the meta device) the file's router and experts.

        >>> fill_moe(model.model.layers[0].mlp, 0, reader, tables, config, linear_from)

    `tables` is {name: gguf ReaderTensor}; `linear_from(raw (N, row_bytes) uint8, qtype)` makes one
    QuantizedLinear. The block keeps its own forward; its `gate` becomes an `ExpertRouter`, its
    `experts` a `QuantizedExperts`, and a shared expert (qwen2_moe) gets its linears and gate.
    """
    name = f"blk.{layer_index}.{{}}.weight".format
    missing = [name(k) for k in (_ROUTER, *EXPERT_KINDS) if name(k) not in tables]
    if missing:
        raise GatherValueError(f"tensor {missing[0]!r} is missing from the file; a mixture-of-experts layer needs it")
    router = float_weight(tables[name(_ROUTER)])  # (E, d)
    mlp_module.gate = ExpertRouter(router, config.num_experts_per_tok, bool(getattr(config, "norm_topk_prob", False)))
    stacks = {k: tables[name(k)] for k in EXPERT_KINDS}
    experts = [[linear_from(part, stacks[k].tensor_type.name) for part in stacked_blocks(stacks[k])]
               for k in EXPERT_KINDS]  # per kind, one QuantizedLinear per expert over a view
    mlp_module.experts = QuantizedExperts(*experts, act_fn=mlp_module.experts.act_fn)
    if any(name(k) in tables for k in SHARED_KINDS):
        _fill_shared(mlp_module, name, tables, linear_from)


def _fill_shared(mlp_module, name, tables: dict, linear_from) -> None:
    """qwen2_moe's shared expert: an MLP every token runs, scaled by sigmoid(x . ffn_gate_inp_shexp)."""
    missing = [name(k) for k in (*SHARED_KINDS, _SHARED_GATE) if name(k) not in tables]
    if missing:
        raise GatherValueError(f"tensor {missing[0]!r} is missing from the file; a shared expert needs it")
    for kind, child in SHARED_KINDS.items():
        tensor, (owner, _, leaf) = tables[name(kind)], child.rpartition(".")
        setattr(mlp_module.get_submodule(owner), leaf, linear_from(stacked_blocks(tensor), tensor.tensor_type.name))
    gate = float_weight(tables[name(_SHARED_GATE)]).reshape(1, -1)  # (1, d): the block's nn.Linear(d, 1)
    mlp_module.get_submodule(_CHILDREN[_SHARED_GATE]).weight = torch.nn.Parameter(gate, requires_grad=False)


def stacked_blocks(tensor) -> torch.Tensor:
    """A ReaderTensor's blocks as uint8 rows, a view of the mapped file: (E, N, row_bytes) for stacked
    experts, (N, row_bytes) for a 2-D weight; a float tensor's rows are its bytes (F32: 4 a value)."""
    data = np.asarray(tensor.data)
    raw = data if data.dtype == np.uint8 else data.view(np.uint8)  # float rows -> their bytes, no copy
    return torch.from_numpy(raw)  # (..., N, row_bytes) uint8


def float_weight(tensor) -> torch.Tensor:
    """A small float32 weight (the router (E, d), the shared gate (d,)): a view of an F32 tensor, else
    dequantized once (bit-equal to gguf's dequantize)."""
    if tensor.tensor_type.name == "F32":
        return torch.from_numpy(np.asarray(tensor.data))  # (E, d) or (d,) float32, mapped in place
    raw = stacked_blocks(tensor)  # (E, row_bytes) or (row_bytes,)
    return dequantize_rows(raw.reshape(-1, raw.shape[-1]), tensor.tensor_type.name).reshape(*raw.shape[:-1], -1)


class ExpertRouter(torch.nn.Module):
    """Which k experts each token takes, and their weights: transformers' TopKRouter math, exactly.

        >>> logits, weights, index = ExpertRouter(torch.randn(4, 64), top_k=2)(torch.randn(8, 64))
        >>> index.shape, weights.shape                    # (T, k) rows of the stacked expert tables
        (torch.Size([8, 2]), torch.Size([8, 2]))

    index[t] are the rows of the stacked (E, ...) expert tables that token t gathers (see module doc).
    """

    def __init__(self, weight: torch.Tensor, top_k: int, norm_topk_prob: bool = False):
        super().__init__()
        if weight.dim() != 2 or not 1 <= top_k <= weight.shape[0]:
            raise GatherValueError(f"top_k must be in [1, {weight.shape[0] if weight.dim() == 2 else '?'}] for a "
                                   f"router of shape {tuple(weight.shape)}, got {top_k}")
        self.weight = torch.nn.Parameter(weight, requires_grad=False)  # (E, d) float32
        self.top_k, self.num_experts, self.norm_topk_prob = top_k, weight.shape[0], norm_topk_prob
        self.hidden_dim = weight.shape[1]

    def forward(self, hidden: torch.Tensor):
        """hidden (..., d) -> (logits (T, E), weights (T, k), index (T, k)), T the flattened tokens."""
        hidden = hidden.reshape(-1, self.hidden_dim)  # (T, d)
        logits = F.linear(hidden, self.weight)  # (T, E)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)  # (T, E)
        top, index = torch.topk(probs, self.top_k, dim=-1)  # (T, k), (T, k)
        if self.norm_topk_prob:
            top /= top.sum(dim=-1, keepdim=True)  # (T, k)
        return logits, top.to(logits.dtype), index  # (T, E), (T, k), (T, k)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, top_k={self.top_k}, norm_topk_prob={self.norm_topk_prob}"


class QuantizedExperts(torch.nn.Module):
    """E experts (gate, up, down each a QuantizedLinear over a view of the stacked GGUF tensor).

        >>> experts = QuantizedExperts(gates, ups, downs, act_fn=torch.nn.SiLU())
        >>> experts(x, index, weights).shape              # x (T, d), index / weights (T, k) -> (T, d)
        torch.Size([8, 64])

    forward(x, index, weights)[t] = sum_j weights[t, j] * expert_{index[t, j]}(x[t]), where
    expert_e(h) = down_e(act(gate_e(h)) * up_e(h)): tokens grouped per expert (see module doc);
    `reference` is the same sum, a loop over tokens and their k experts, from the dequantized blocks.
    """

    def __init__(self, gate: list, up: list, down: list, act_fn):
        super().__init__()
        if not len(gate) == len(up) == len(down) > 0:
            raise GatherValueError(f"gate, up and down must hold the same number (>= 1) of experts, got "
                                   f"{len(gate)}, {len(up)}, {len(down)}")
        self.gate, self.up, self.down = (torch.nn.ModuleList(m) for m in (gate, up, down))
        self.act_fn, self.num_experts = act_fn, len(gate)

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        """Expert e on rows h (n, d) -> (n, d)."""
        return self.down[e](self.act_fn(self.gate[e](h)) * self.up[e](h))  # (n, d)

    def forward(self, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """hidden (T, d), index (T, k) expert rows, weights (T, k) -> (T, d): tokens grouped per expert."""
        top_k = index.shape[-1]
        flat = index.reshape(-1)  # (T*k,) slot s = t*k + j chose expert flat[s]
        order = torch.argsort(flat, stable=True)  # (T*k,) slots grouped by expert, ascending
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # n_e slots per expert
        tokens = order // top_k  # (T*k,) the token of each grouped slot
        scale = weights.reshape(-1)[order].unsqueeze(-1)  # (T*k, 1)
        out = torch.zeros_like(hidden)  # (T, d)
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = tokens[start:start + n]  # (n_e,) the tokens that chose expert e
                y = self.expert(e, hidden[rows]) * scale[start:start + n]  # (n_e, d)
                out.index_add_(0, rows, y.to(out.dtype))  # (T, d)
            start += n
        return out  # (T, d)

    def reference(self, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """forward's plain reference: per token t, per slot j, expert index[t, j]'s blocks picked from the
        stacked tables (the gather), dequantized to float32 and run on x[t] alone."""
        out = torch.zeros_like(hidden)  # (T, d)
        for t in range(hidden.shape[0]):
            for j in range(index.shape[1]):
                e = int(index[t, j])
                gate, up, down = (m[e].dequantized_weight() for m in (self.gate, self.up, self.down))  # (I, d) x2, (d, I)
                h = self.act_fn(gate @ hidden[t]) * (up @ hidden[t])  # (I,)
                out[t] += weights[t, j] * (down @ h)  # (d,)
        return out  # (T, d)

    def extra_repr(self) -> str:
        qweight = getattr(self.gate[0], "qweight", None)
        return f"experts={self.num_experts}" + (f", {qweight.qtype}" if qweight is not None else "")
