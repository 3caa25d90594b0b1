"""How block-sparse prefill chooses key blocks: ONE frozen, validated configuration and its presets.

    >>> config = PrefillConfig()                       # the default: antidiagonal scores (stride 8), mass 0.95
    >>> config.rule, config.block_size, config.stride, config.threshold
    ('antidiagonal', 64, 8, 0.95)
    >>> config.dense_at(100, layer=5), config.dense_at(8192, layer=5), config.dense_at(8192, layer=0)
    (True, False, False)
    >>> EXACT.exact, POOLED.rule                       # every allowed block (equals SDPA); FlexPrefill-style
    (True, 'pooled')

A prefill of L tokens is cut into query blocks and key blocks of `block_size` tokens. Per query
block a *rule* scores every causal key block (a cheap estimate of the attention mass it holds,
computed at block level), and the *budget* keeps the best ones: a fixed count of blocks
(`budget`), a cumulative share of the estimated mass (`threshold`, FlexPrefill's gamma), or both
(the threshold's blocks, at most `budget`). The first `sink_blocks` key blocks (the attention
sink) and the `local_blocks` nearest ones (the diagonal included) are always kept. Budget and
threshold both None keep every allowed block: the output equals dense attention.

Rules (RULES): "antidiagonal" (XAttention: the sum of each stride x stride tile's antidiagonal,
softmaxed per row and summed per block: 1/stride of the logits' work) and "pooled" (FlexPrefill's
query-aware estimate: the mean query of a block against the mean key of a block: one logit per
block pair). Every place that prefills sparsely takes or builds one of these and passes it on
(the op `sparse_prefill(config=)`, `use_sparse_prefill(model, config)`, the command line).
Imports no torch (the command line reads it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gatherlens.errors import GatherTypeError, GatherValueError

__all__ = ["PrefillConfig", "RULES", "BACKENDS", "DEFAULT", "POOLED", "EXACT", "TOY", "PRESETS"]

RULES = ("antidiagonal", "pooled")  # how a key block is scored for a query block
# where the block scores and the attention over the kept blocks run (ops/prefill/attend.py's backend tables)
BACKENDS = ("auto", "native", "torch")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name: str, value, low: int, what: str, *, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if not _is_int(value) or value < low:
        also = " or None" if none_ok else ""
        raise GatherValueError(f"{name} = {value!r} must be an int >= {low}{also} ({what})")


@dataclass(frozen=True)
class PrefillConfig:
    """How a prefill chooses key blocks (validated on construction; `replace` re-validates).

    rule: one of RULES. block_size: tokens per query block and per key block.
    stride: the antidiagonal rule's tile (block_size must be a multiple of it).
    budget: key blocks kept per query block (sink and local blocks included); None: no count limit.
    threshold: keep blocks, best first, until this share (0, 1] of the estimated mass is covered;
        None: no mass limit. budget and threshold both None: every allowed block (exact).
    sink_blocks / local_blocks: the first / the nearest key blocks always kept (the diagonal is one).
    share_selection: the query heads of a KV group keep the same blocks (one gather per KV head);
        False: every query head chooses.
    min_length: prefill calls over fewer keys run densely (selection would cost more than it saves);
        a later chunk of a long prompt (fewer queries than keys) counts its keys.
    dense_layers: the first this many decoder layers prefill densely.
    keep_selection: the model adapter keeps each layer's last block map (for pictures).
    backend: where the scores and the attention run: "auto" (each backend table's first row that
        fits: the C++ operators on the CPU), "native" (them, an error where they cannot run) or
        "torch" (the torch paths; for comparisons). The blocks and the output are the same up to
        float rounding.
    """

    rule: str = "antidiagonal"
    block_size: int = 64
    stride: int = 8  # passkey at 8K: 5/5 (stride 16: 4/5), eval-prefill on SmolLM2
    budget: int | None = None
    threshold: float | None = 0.95
    sink_blocks: int = 1
    local_blocks: int = 2
    share_selection: bool = True
    min_length: int = 1024
    dense_layers: int = 0
    keep_selection: bool = False
    backend: str = "auto"

    def __post_init__(self):
        _check(self)

    @property
    def exact(self) -> bool:
        """True when every allowed block is kept (no budget, no threshold): dense attention's output."""
        return self.budget is None and self.threshold is None

    def dense_at(self, length: int, layer: int | None = None) -> bool:
        """True when a prefill of `length` tokens in decoder layer `layer` runs densely."""
        return length < self.min_length or (_is_int(layer) and layer < self.dense_layers)

    def replace(self, **changes) -> "PrefillConfig":
        """A copy with `changes` (checked like any other)."""
        return dataclasses.replace(self, **changes)


def _check(c: PrefillConfig) -> None:
    """The one validation of every prefill setting; messages name the argument, value and range."""
    if c.rule not in RULES:
        raise GatherValueError(f"rule = {c.rule!r} must be one of {RULES}")
    if c.backend not in BACKENDS:
        raise GatherValueError(f"backend = {c.backend!r} must be one of {BACKENDS}")
    _check_int("block_size", c.block_size, 1, "tokens per block")
    _check_int("stride", c.stride, 1, "the antidiagonal tile")
    if c.rule == "antidiagonal" and not c.exact and c.block_size % c.stride:
        raise GatherValueError(f"block_size = {c.block_size} must be a multiple of stride = {c.stride} "
                               f"(the antidiagonal rule sums whole tiles per block)")
    _check_int("budget", c.budget, 1, "key blocks per query block", none_ok=True)
    t = c.threshold
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1):
        raise GatherValueError(f"threshold = {t!r} must be a number in (0, 1] (share of the mass) or None")
    _check_int("sink_blocks", c.sink_blocks, 0, "first key blocks always kept")
    _check_int("local_blocks", c.local_blocks, 1, "nearest key blocks always kept, the diagonal included")
    _check_int("min_length", c.min_length, 0, "shorter prefills run densely")
    _check_int("dense_layers", c.dense_layers, 0, "leading layers prefilled densely")
    for name in ("share_selection", "keep_selection"):
        if not isinstance(getattr(c, name), bool):
            raise GatherTypeError(f"{name} must be a bool, got {getattr(c, name)!r}")


DEFAULT = PrefillConfig()
# FlexPrefill's estimate: pooled queries against pooled keys, the same mass threshold.
POOLED = DEFAULT.replace(rule="pooled")
# every allowed block, from any length: the op's exactness check (equals SDPA).
EXACT = DEFAULT.replace(threshold=None, min_length=0)
# `gatherlens explain --sparse-prefill`: small blocks from any length, so that a short text shows a choice.
TOY = DEFAULT.replace(block_size=16, stride=4, min_length=0)
PRESETS = {"default": DEFAULT, "antidiagonal": DEFAULT, "pooled": POOLED, "exact": EXACT, "toy": TOY}
