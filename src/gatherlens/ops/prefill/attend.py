"""Block-sparse prefill's one entrance: choose the key blocks, then attend over them.

    >>> out = sparse_prefill(q, k, v)                                  # q (B, Hq, Q, D) -> (B, Hq, Q, Dv)
    >>> out, sel = sparse_prefill(q, k, v, config=POOLED, return_selection=True)
    >>> sel.blocks.shape, sel.kept_share()                             # (B, Hkv, nq, nk), kept / allowed
    >>> sel = select_blocks(q, k, config=DEFAULT)                      # the choice alone

The Q queries are the last Q of the L keys (causal, bottom-right aligned: a prefill into an empty
cache has Q = L). Grouped-query heads (Hq a multiple of Hkv) are folded, never expanded. The
variant (`variant=`, or `softcap=` / `sinks=`) brings soft-capping, sinks and a local window;
with `config.exact` (budget and threshold None: every allowed block) the output equals SDPA's.

Where each heavy step runs is decided by ONE backend table per step (ops/backends.py), rows
"native" (fused_prefill.py's C++ operators, where they fit) and "torch" (the plain path, which
takes anything): `BLOCK_PREFILL`, the attention over the kept blocks (torch: blocked.py), and
`ANTIDIAGONAL`, the antidiagonal rule's scores (torch: rules.py, the reference rule).
`config.backend` ("auto": each table's first row that fits) names the row both run; `method`
overrides it for the attention, and `method="naive"` runs the float64 reference (naive.py) on the
same selection.
"""
from __future__ import annotations

import math

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.attention.checks import check_topk_args
from gatherlens.ops.attention.variants import AttentionVariant, variant_of
from gatherlens.ops.backends import AUTO, Impl, Operator
from gatherlens.ops.prefill.blocked import block_prefill
from gatherlens.ops.prefill.config import DEFAULT, PrefillConfig
from gatherlens.ops.prefill.fused_prefill import (
    NATIVE_DTYPES, NATIVE_VARIANT, native_antidiagonal_scores, native_block_prefill, native_fits, native_ready,
    scores_fit,
)
from gatherlens.ops.prefill.naive import block_prefill_reference
from gatherlens.ops.prefill.rules import (
    antidiagonal_scores, choose_blocks, forced_blocks, group_scores, pooled_scores,
)
from gatherlens.ops.prefill.selection import PrefillSelection, block_geometry

__all__ = ["sparse_prefill", "select_blocks", "METHODS", "BLOCK_PREFILL", "ANTIDIAGONAL"]


def _any(*args) -> None:
    """The plain path's fits rule: it runs every call."""
    return None


def _facts(q, k, v, blocks, block_size, scale=None, variant=None) -> tuple:
    """What BLOCK_PREFILL's rows declare against: the variant's fields in use, the query's dtype."""
    return (variant if variant is not None else frozenset()), q.dtype


# attention over the kept blocks: the C++ operator where it fits, else the torch path (every call its
# declaration allows); each row declares the variant fields it applies (blocked.py: all three)
BLOCK_PREFILL = Operator("block_prefill", [
    Impl("native", fits=native_fits, run=native_block_prefill, ready=native_ready, variant=NATIVE_VARIANT,
         dtypes=NATIVE_DTYPES),
    Impl("torch", fits=_any, run=block_prefill, variant=frozenset({"softcap", "sinks", "window"})),
], facts=_facts)
# the antidiagonal rule's block scores: the C++ operator (causal tiles only, softmax fused), else rules.py's
ANTIDIAGONAL = Operator("antidiagonal_scores", [
    Impl("native", fits=scores_fit, run=native_antidiagonal_scores, ready=native_ready),
    Impl("torch", fits=_any, run=antidiagonal_scores),
])
METHODS = (AUTO, "native", "torch", "naive")


def _checked(q, k, v, config, scale, variant):
    """The arguments checked (tensors, shapes, heads, scale, variant, config); (scale, variant)."""
    if not isinstance(config, PrefillConfig):
        raise GatherValueError(f"config must be a PrefillConfig, got {type(config).__name__}")
    problem = check_topk_args(q, k, v, 1, is_causal=False, attn_mask=None, scale=scale, enable_gqa=True,
                              variant=variant)
    if q.shape[2] > k.shape[2]:
        raise GatherValueError(f"query length {q.shape[2]} exceeds key length {k.shape[2]}: a prefill's "
                               f"queries are the last Q of its L keys (Q <= L)")
    return problem.scale, problem.variant


def select_blocks(q: torch.Tensor, k: torch.Tensor, config: PrefillConfig = DEFAULT, scale: float | None = None,
                  variant: AttentionVariant | None = None) -> PrefillSelection:
    """q (B, Hq, Q, D), k (B, Hkv, L, D) -> the PrefillSelection of `config`'s rule and budget (unchecked)."""
    variant = variant_of(variant=variant)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    Q, L, bs, window = q.shape[2], k.shape[2], config.block_size, variant.window
    allowed = block_geometry(Q, L, bs, window, q.device)                       # (nq, nk)
    if config.exact:
        heads = k.shape[1] if config.share_selection else q.shape[1]
        blocks = allowed.expand(q.shape[0], heads, *allowed.shape).clone()     # (B, H, nq, nk)
        return PrefillSelection(blocks, bs, Q, L, "exact", window)
    if config.rule == "antidiagonal":
        scores = ANTIDIAGONAL(q, k, bs, config.stride, scale, window, backend=config.backend)  # (B, Hq, nq, nk)
    else:
        scores = pooled_scores(q, k, bs, scale, window)                        # (B, Hq, nq, nk)
    if config.share_selection:
        scores = group_scores(scores, k.shape[1])                              # (B, Hkv, nq, nk)
    blocks = choose_blocks(scores, allowed, forced_blocks(Q, L, config, window, q.device), config)
    return PrefillSelection(blocks, bs, Q, L, config.rule, window)


def sparse_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: PrefillConfig = DEFAULT, *,
                   scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
                   variant: AttentionVariant | None = None, return_selection: bool = False,
                   return_lse: bool = False, method: str | None = None):
    """Causal block-sparse attention of a prefill: q (B, Hq, Q, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv)
    -> out (B, Hq, Q, Dv) [, lse (B, Hq, Q)] [, PrefillSelection].

        >>> out = sparse_prefill(q, k, v, EXACT)      # every allowed block: SDPA's output

    config: the rule and the budget (PrefillConfig; its min_length / dense_layers are the model
    adapter's, not the op's; its backend names where the scores and the attention run). method: the
    attention's row instead of config.backend: "auto" (BLOCK_PREFILL's first row that fits), "native"
    (the C++ operator), "torch" (blocked.py), or "naive" (the float64 reference).
    """
    if method is not None and method not in METHODS:
        raise GatherValueError(f"method = {method!r} must be one of {tuple(METHODS)}")
    scale, variant = _checked(q, k, v, config, scale, variant_of(softcap, sinks, variant))
    return prefill_with(q, k, v, config, scale, variant, return_selection, return_lse, method)


def prefill_with(q, k, v, config: PrefillConfig, scale: float, variant: AttentionVariant,
                 return_selection: bool = False, return_lse: bool = False, method: str | None = None):
    """sparse_prefill without its checks (the model adapter made the tensors): see sparse_prefill."""
    sel = select_blocks(q, k, config, scale, variant)
    args = (q, k, v, sel.blocks, config.block_size, scale, variant)
    if method == "naive":
        out, lse = block_prefill_reference(*args)                              # (B, Hq, Q, Dv), (B, Hq, Q)
    else:
        out, lse = BLOCK_PREFILL(*args, backend=method or config.backend)      # (B, Hq, Q, Dv), (B, Hq, Q)
    result = (out,) + ((lse,) if return_lse else ()) + ((sel,) if return_selection else ())
    return result[0] if len(result) == 1 else result
