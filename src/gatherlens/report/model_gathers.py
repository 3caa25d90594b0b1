"""Gathers a model runs itself, recorded from one real run: RoPE's cos/sin rows by position_ids, Gemma's
scaling of the gathered rows, a mixture of experts' routing.

    >>> with observe_model_gathers(model) as seen:      # forward hooks on the model's own modules
    ...     model(**inputs)
    >>> rope_record(model, seen, labels)                 # a GatherRecord: cos_table.index_select(0, position_ids)
    >>> scale_record(model, seen, word, labels)          # a ScaleRecord (Gemma), or None
    >>> moe_routing(seen, layer=15, labels=labels)       # a MoeRouting of the layer nearest 15, or None

RoPE: transformers computes cos and sin of position x inv_freq for each call; vLLM and llama.cpp keep a
table of every position's rows and gather them by position_ids. `rope_record` builds that table with the
model's own rotary module over positions 0 .. max(position_ids) and gathers its rows: `equal` says the
gathered rows are the model's, bit for bit. Gemma: its embedding module returns W[ids] x sqrt(d).
MoE: the router's (logits, weights, index) as it returned them (models/hf_adapter.moe_routers).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from gatherlens.models.hf_adapter import embedding_scale, moe_routers, rotary_module
from gatherlens.trace.model_gathers import MoeRouting, ScaleRecord

__all__ = ["Seen", "observe_model_gathers", "rope_record", "scale_record", "moe_routing", "SHOWN_COLUMNS"]

SHOWN_COLUMNS = 6     # columns of the scaled rows drawn


@dataclass
class Seen:
    """What the hooks kept of the first forward: the first rotary call, each router's output, the embedding's."""

    rope: tuple | None = None             # (x, position_ids, layer_type, (cos, sin))
    routers: dict = field(default_factory=dict)   # layer -> (logits (T, E), weights (T, k), index (T, k))
    embedded: torch.Tensor | None = None  # (B, S, d) what the embedding module returned
    moe_layers: int = 0


def _rope_hook(seen: Seen):
    def hook(module, args, kwargs, out):
        if seen.rope is None:
            pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            kind = kwargs.get("layer_type", args[2] if len(args) > 2 else None)
            seen.rope = (args[0] if args else kwargs.get("x"), pos, kind, out)
    return hook


def _router_hook(seen: Seen, layer: int):
    def hook(module, args, out):                       # returns None: the model's output is left as it is
        if layer not in seen.routers:
            seen.routers[layer] = tuple(t.detach() for t in out[:3])
    return hook


def _embed_hook(seen: Seen):
    def hook(module, args, out):
        if seen.embedded is None:
            seen.embedded = out.detach()
    return hook


@contextlib.contextmanager
def observe_model_gathers(model):
    """Hooks on the rotary module, every MoE router and the embedding module for the block; yields a Seen."""
    seen, handles = Seen(), []
    rotary, routers = rotary_module(model), moe_routers(model)
    seen.moe_layers = len(routers)
    if rotary is not None:
        handles.append(rotary.register_forward_hook(_rope_hook(seen), with_kwargs=True))
    for layer, gate in routers:
        handles.append(gate.register_forward_hook(_router_hook(seen, layer)))
    handles.append(model.get_input_embeddings().register_forward_hook(_embed_hook(seen)))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def rope_record(model, seen: Seen, labels: list[str]):
    """cos_table.index_select(0, position_ids) from the model's own rotary module, or None without RoPE."""
    from gatherlens.trace.builders import record_index_select

    if seen.rope is None or seen.rope[1] is None:
        return None
    x, pos, kind, (cos, _) = seen.rope
    P = int(pos.max()) + 1
    table = rotary_module(model)(x[:, :1], torch.arange(P).unsqueeze(0), *([kind] if kind else []))[0][0]   # (P, D)
    positions = pos[0].long()                                                   # (S,)
    rec = record_index_select(
        table.float(), 0, positions, name="cos_table", index_name="position_ids",
        call="cos_table.index_select(0, position_ids)", source_axes=("P", "D"), index_axes=("S",),
        output_axes=("S", "D"), output_row_labels=labels if len(labels) == positions.numel() else None,
        meta={"note": ("note_rope", {}), "equal": bool(torch.equal(table[positions], cos[0])),
              "layer_type": kind or "", "theta_rows": P})
    return rec


def scale_record(model, seen: Seen, word, labels: list[str]) -> ScaleRecord | None:
    """Gemma's W[ids] x scale from the word lookup's record and the embedding module's output; None without one."""
    module = model.get_input_embeddings()
    scale = embedding_scale(module)
    if scale is None:
        held = getattr(module, "scale", None)                # a GGUF-block embedding (models/gguf/layers.py)
        scale = None if held is None else float(held)
    if scale is None or word is None or seen.embedded is None:
        return None
    rows = word.record.output.reshape(-1, word.table_shape[1]).float()         # (S, d) W[ids]
    out = seen.embedded[0].float()                                              # (S, d)
    expected = rows * torch.tensor(scale, dtype=rows.dtype)                     # (S, d)
    return ScaleRecord(ids=tuple(word.ids), labels=tuple(labels), rows=rows[:, :SHOWN_COLUMNS],
                       out=out[:, :SHOWN_COLUMNS], scale=scale, d=int(rows.shape[1]),
                       equal=bool(torch.equal(out, expected)))


def moe_routing(seen: Seen, layer: int, labels: list[str]) -> MoeRouting | None:
    """The routing of the MoE layer nearest `layer` (batch 0's tokens), or None for a dense model."""
    if not seen.routers:
        return None
    near = min(seen.routers, key=lambda l: (abs(l - layer), l))
    logits, weights, index = seen.routers[near]
    T = len(labels)
    return MoeRouting(layer=near, labels=tuple(labels), probs=torch.softmax(logits[:T].float(), dim=-1).cpu(),
                      index=index[:T].long().cpu(), weights=weights[:T].float().cpu(), layers=seen.moe_layers)
