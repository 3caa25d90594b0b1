"""The elementwise pieces of one decoder-layer step: RMSNorm, the residual sum, SiLU- and GELU-gating and
the rotary embedding with the paged cache's append, as C++ operators beside plain references.

    >>> from gatherlens.ops.layer import rms_norm_cast, add_rms_norm_cast, silu_mul_cast, rope_append

`naive.py` holds the references (plain torch, what the operators must equal); `fused.py` the
operators (layer_ops.cpp, built on first use), one backend table each (native / torch: the reference);
`plan.py` the record of a model's decode step; `stack.py` the whole step as one C++ operator.
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

_EXPORTS = {"rms_norm_cast": "fused", "add_rms_norm_cast": "fused", "silu_mul_cast": "fused", "gelu_mul_cast": "fused",
            "glu_cast": "fused", "rope_append": "fused"}

__all__ = ["rms_norm_cast", "add_rms_norm_cast", "silu_mul_cast", "gelu_mul_cast", "glu_cast", "rope_append"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
