"""The sparse-prefill block maps of a report: every layer's PrefillSelection, and the page's packed copy.

    >>> maps = prefill_maps(lm, ids, TOY)        # one sparse prefill of the text (ops/prefill/config.py: TOY)
    >>> maps.selection_head(5), maps.layer_near(15)     # SmolLM2: query head 5 reads KV head 1's map; layer 15 has one
    (1, 15)
    >>> data = maps.pack()                       # JSON-ready: the kept blocks as bits, per layer and head

The explorer's prefill section (report/sections.py, drawn by templates/explore.js) shows the map of
the reader's layer and head: rows are query blocks, columns key blocks; kept, skipped by the rule,
or not allowed. A long prompt has hundreds of blocks a side, so `pack` stores only the allowed cells
(`block_geometry`'s rule, one distinct map per window) and one bit per (layer, head, cell), little
endian, in base64: 2,048 tokens in blocks of 16 are 128 x 128 blocks, 8,256 of them causal, about 1 KB
per layer and KV head (SmolLM2's 30 x 3: 93 KB, 124 KB in base64). The same run gives the same bytes.
Nothing here draws or writes.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["PrefillMaps", "prefill_maps", "pack_bits", "FORMAT_VERSION"]

FORMAT_VERSION = 1


def pack_bits(bits: np.ndarray) -> str:
    """A bool array, flattened row-major, as base64 bits: bit i is (byte i // 8 >> i % 8) & 1."""
    return base64.b64encode(np.packbits(bits.reshape(-1).astype(bool), bitorder="little").tobytes()).decode("ascii")


@dataclass
class PrefillMaps:
    """What one sparse prefill of the report's text kept, per layer (the layers that prefilled sparsely)."""

    selections: dict = field(default_factory=dict)  # layer -> PrefillSelection, blocks (1, H, nq, nk)
    q_heads: int = 1                  # the model's query heads (H divides it: a KV group shares one map)
    config: object = None             # the PrefillConfig it ran with
    causal: bool = True               # False: an encoder, which has no causal prefill (no maps)

    @property
    def layers(self) -> list[int]:
        return sorted(self.selections)

    def selection_head(self, head: int) -> int:
        """The map query head `head` reads: its KV group's (shared selection), or its own."""
        H = next(iter(self.selections.values())).blocks.shape[1]
        return head // (self.q_heads // H)

    def layer_near(self, layer: int) -> int:
        """`layer` when it has a map, else the first later layer with one, else the last (a dense layer has none)."""
        return next((n for n in self.layers if n >= layer), self.layers[-1])

    def shares(self, layer: int) -> list[float]:
        """Kept / allowed blocks of each selection head of `layer`."""
        sel = self.selections[layer]
        allowed = float(sel.allowed().sum())
        return [float(b.sum()) / allowed for b in sel.blocks[0]]            # b: (nq, nk) of each head

    def kept_share(self) -> float:
        from gatherlens.ops.prefill.selection import kept_share

        return kept_share(self.selections.values()) or 0.0

    def summary(self) -> dict:
        """The story.json part: the setting, the blocks and what every layer and head kept."""
        first = self.selections[self.layers[0]]
        c = self.config
        return {"rule": first.rule, "block_size": first.block_size, "threshold": c.threshold, "budget": c.budget,
                "blocks": list(first.blocks.shape[2:]), "kept_share": round(self.kept_share(), 6),
                "layers": [{"layer": n, "kept_share": [round(s, 6) for s in self.shares(n)]} for n in self.layers]}

    def pack(self) -> dict:
        """JSON-ready data for the page's script (see the module doc)."""
        from gatherlens.ops.prefill.selection import block_spans

        sels = [self.selections[n] for n in self.layers]
        first = sels[0]
        B, H, nq, nk = first.blocks.shape
        masks, mask_of, kept = [], [], []
        for sel in sels:
            allowed = sel.allowed().cpu().numpy()                              # (nq, nk)
            mask_of.append(next((i for i, m in enumerate(masks) if np.array_equal(m, allowed)), len(masks)))
            masks += [allowed] if mask_of[-1] == len(masks) else []
            kept.append(sel.blocks[0].cpu().numpy()[:, allowed])               # (H, cells): allowed cells, row-major
        qa, qb, ka, kb = block_spans(first.query_len, first.key_len, first.block_size)  # (nq,) x2, (nk,) x2
        return {"v": FORMAT_VERSION, "layers": self.layers, "heads": H, "q_heads": self.q_heads, "nq": nq, "nk": nk,
                "block": first.block_size, "rule": first.rule, "query_len": first.query_len, "key_len": first.key_len,
                "q_spans": torch.stack([qa, qb], 1).tolist(), "k_spans": torch.stack([ka, kb], 1).tolist(),
                "allowed": [pack_bits(m) for m in masks], "allowed_of": mask_of,
                "kept": pack_bits(np.concatenate([k.reshape(-1) for k in kept])),
                "kept_share": round(self.kept_share(), 6)}


def prefill_maps(lm, ids: torch.Tensor, config) -> PrefillMaps:
    """One sparse prefill of ids (1, S) with `config` (keep_selection is set): every layer's map. An encoder
    (bidirectional attention) has no causal prefill: no maps, `causal` False."""
    from gatherlens.models.attention.prefill import prefill_selections

    heads = int(getattr(lm.model.config, "num_attention_heads", 1) or 1)
    if not lm.is_causal:
        return PrefillMaps({}, heads, config, causal=False)
    sels = prefill_selections(lm.model, ids, config)
    return PrefillMaps({n: s for n, s in sels.items() if isinstance(n, int)}, heads, config)
