"""What a block-sparse prefill kept: the (B, H, query blocks, key blocks) map and its geometry.

    >>> sel = select_blocks(q, k, config=PrefillConfig())       # a PrefillSelection
    >>> sel.blocks.shape, sel.kept_share()                      # (B, Hkv, nq, nk); kept / allowed
    >>> sel.allowed()                                           # (nq, nk): causal (and window) blocks

Plain data (a tensor and ints): the model adapter keeps the last one per layer, and the picture of
a prefill is drawn from it. `block_geometry` is the one rule of which key blocks a query block may
attend to at all (causal, bottom-right aligned: the Q queries are the last Q of the L keys; a
local layer's window), shared by the rules, the reference and the fast path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gatherlens.ops.sparse.geometry import ceil_div

__all__ = ["PrefillSelection", "block_geometry", "block_spans", "kept_share"]


def block_spans(query_len: int, key_len: int, block_size: int, device=None):
    """(first, last) absolute query position of every query block, (first, last) key position of every
    key block: four (n,) int64 tensors. Query r sits at position key_len - query_len + r."""
    offset = key_len - query_len
    nq, nk = ceil_div(query_len, block_size), ceil_div(key_len, block_size)
    qa = torch.arange(nq, device=device) * block_size + offset                 # (nq,)
    qb = torch.clamp(qa + block_size - 1, max=key_len - 1)                     # (nq,)
    ka = torch.arange(nk, device=device) * block_size                          # (nk,)
    kb = torch.clamp(ka + block_size - 1, max=key_len - 1)                     # (nk,)
    return qa, qb, ka, kb


def block_geometry(query_len: int, key_len: int, block_size: int, window: int | None = None,
                   device=None) -> torch.Tensor:
    """(nq, nk) bool: key block j holds a key some query of block i may attend to.

        >>> block_geometry(5, 5, 2).int().tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]

    Causal: a key at position p <= the query's position. window: also query - key < window.
    """
    qa, qb, ka, kb = block_spans(query_len, key_len, block_size, device)
    ok = ka[None, :] <= qb[:, None]                                            # (nq, nk)
    if window is not None:
        ok &= (qa[:, None] - kb[None, :]) < window                             # (nq, nk)
    return ok


@dataclass
class PrefillSelection:
    """The key blocks each query block of one prefill attended (True = gathered).

    blocks: (B, H, nq, nk) bool, H = Hkv (shared selection) or Hq. rule: the rule that chose them
    ("exact" when every allowed block was kept). meta: free-form facts (the layer, ...).
    """

    blocks: torch.Tensor
    block_size: int
    query_len: int
    key_len: int
    rule: str
    window: int | None = None
    meta: dict = field(default_factory=dict)

    def allowed(self) -> torch.Tensor:
        """(nq, nk) bool: the blocks causality (and the window) allow."""
        return block_geometry(self.query_len, self.key_len, self.block_size, self.window, self.blocks.device)

    def kept_share(self) -> float:
        """Blocks kept / blocks allowed, over every batch row and head (1.0: dense)."""
        return kept_share([self]) or 0.0


def kept_share(selections) -> float | None:
    """Blocks kept / blocks allowed over several selections (every layer of a prefill), or None for none.

        >>> kept_share(last_prefill_selections(model).values())
    """
    sels = list(selections)
    allowed = sum(float(s.allowed().sum()) * s.blocks.shape[0] * s.blocks.shape[1] for s in sels)
    return sum(float(s.blocks.sum()) for s in sels) / allowed if allowed else None
