"""Block-sparse prefill attention: each query block gathers only the key blocks it needs.

    >>> from gatherlens.ops.prefill import sparse_prefill, PrefillConfig
    >>> out = sparse_prefill(q, k, v, PrefillConfig(threshold=0.9))          # (B, Hq, Q, Dv)
    >>> out, sel = sparse_prefill(q, k, v, return_selection=True)            # sel.blocks (B, H, nq, nk)

`config.py` holds the one prefill configuration (`PrefillConfig`, its checks, presets: no torch);
`selection.py` the block geometry (which key blocks causality and a window allow) and the
`PrefillSelection` record; `rules.py` the selection rules (antidiagonal and pooled block scores)
and the one choice (sink and local blocks, budget, mass threshold); `naive.py` the float64
reference; `blocked.py` the torch path (gathered blocks, online softmax, grouped heads folded);
`fused_prefill.py` + `.cpp` the native path (C++ operators: the antidiagonal scores on the causal
tiles, the attention reading the kept blocks in place); `attend.py` the public entrance and the
backend tables that choose between them (`BLOCK_PREFILL`, `ANTIDIAGONAL`). Names load on first use
(PEP 562).
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

_EXPORTS = {
    "sparse_prefill": "attend", "select_blocks": "attend", "PrefillSelection": "selection",
    "PrefillConfig": "config", "block_prefill": "blocked", "block_prefill_reference": "naive",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
