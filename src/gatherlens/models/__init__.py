"""Real models, offline, at the edge of the package.

    >>> from gatherlens.models import load, use_topk_attention, use_dense_attention
    >>> lm = load("smollm2")                     # or "minilm", or a local HF folder / .gguf file
    >>> use_topk_attention(lm.model, top_k=32)   # every layer gathers 32 keys per query
    >>> use_dense_attention(lm.model)            # back to SDPA

transformers is imported when a model is loaded, not when this package is.
"""
from gatherlens.models.attention import (
    ATTN_NAME,
    last_selections,
    observe_attention,
    register,
    topk_attention_enabled,
    use_dense_attention,
    use_topk_attention,
)
from gatherlens.models.loading import LoadedModel, load
from gatherlens.models.registry import KNOWN_MODELS, resolve

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
