"""Real models, offline, at the edge of the package.

    >>> from gatherlens.models import load, use_topk_attention, use_dense_attention
    >>> lm = load("smollm2")                     # or "minilm", or a local HF folder / .gguf file
    >>> use_topk_attention(lm.model, top_k=32)   # every layer gathers 32 keys per query
    >>> use_dense_attention(lm.model)            # back to SDPA

transformers is imported when a model is loaded, not when this package is.
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

# public name -> module that defines it, imported on first use (PEP 562): `gatherlens cache
# list` and `gatherlens --help` read light submodules (cache, registry) without torch
_EXPORTS = {
    **dict.fromkeys(("ATTN_NAME", "last_selections", "observe_attention", "register",
                     "topk_attention_enabled", "use_dense_attention", "use_topk_attention"),
                    "gatherlens.models.attention.topk"),
    "LoadedModel": "gatherlens.models.loading",
    "load": "gatherlens.models.loading",
    "KNOWN_MODELS": "gatherlens.models.files.registry",
    "resolve": "gatherlens.models.files.registry",
}

__all__ = [
    "load",
    "LoadedModel",
    "KNOWN_MODELS",
    "resolve",
    "use_topk_attention",
    "use_dense_attention",
    "topk_attention_enabled",
    "last_selections",
    "observe_attention",
    "register",
    "ATTN_NAME",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
