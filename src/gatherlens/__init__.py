"""gatherlens: every gather a Transformer needs, correct and fast, and drawn.

    >>> import torch, gatherlens
    >>> table = torch.randn(10, 4)                      # (V, d)
    >>> ids = torch.tensor([[3, 1, 4]])                 # (B, S)
    >>> gatherlens.get_embeddings(ids, table).shape     # (B, S, d)
    torch.Size([1, 3, 4])
    >>> gatherlens.record_embedding(ids, table).to_svg()   # the picture of that gather

Public names are imported on first use (PEP 562), so `import gatherlens` stays light and the
models layer (transformers) loads only when asked for.
"""
from __future__ import annotations

import importlib
import sys
import types

from gatherlens.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # ops: the embedding gather
    "get_embeddings": "gatherlens.ops.embedding",
    "embedding_lookup": "gatherlens.ops.embedding",
    "Embedding": "gatherlens.ops.embedding",
    "QuantizedTable": "gatherlens.ops.quant",
    # ops: the attention gather
    "apply_attention_scores": "gatherlens.ops.attention",
    "topk_attention": "gatherlens.ops.attention",
    "AttentionSelection": "gatherlens.ops.attention",
    # ops: page-selected sparse decoding
    "PagedKVCache": "gatherlens.ops.sparse",
    "sparse_decode": "gatherlens.ops.sparse",
    "PageSelection": "gatherlens.ops.sparse",
    "record_page_selection": "gatherlens.trace",
    # trace: records of what a gather picked
    "GatherRecord": "gatherlens.trace",
    "record_gather": "gatherlens.trace",
    "record_embedding": "gatherlens.trace",
    "record_quantized_embedding": "gatherlens.trace.quantized",
    "diagnose_gather": "gatherlens.trace",
    "record_index_select": "gatherlens.trace",
    "record_indexing": "gatherlens.trace",
    "record_take_along_dim": "gatherlens.trace",
    "record_attention_selection": "gatherlens.trace",
    "GatherFinding": "gatherlens.trace",
    "GatherDiagnosticWarning": "gatherlens.trace",
    "TraceEvent": "gatherlens.trace",
    # models (transformers) at the edge
    "load": "gatherlens.models",
    "LoadedModel": "gatherlens.models",
    "use_topk_attention": "gatherlens.models",
    "use_dense_attention": "gatherlens.models",
    "use_sparse_decoding": "gatherlens.models.runtime.decoding",
    "use_dense_decoding": "gatherlens.models.runtime.decoding",
    "sparse_decoding": "gatherlens.models.runtime.decoding",
    "SparseKVCache": "gatherlens.models.runtime.decoding",
    # errors
    "GatherLensError": "gatherlens.errors",
    "GatherIndexError": "gatherlens.errors",
    "GatherTypeError": "gatherlens.errors",
    "GatherValueError": "gatherlens.errors",
}


class _Package(types.ModuleType):
    """`gatherlens.trace` is both the records subpackage and the tracer function: when the
    subpackage loads, the import system sets this attribute to it; keep the function instead.
    The subpackage (and torch) loads on first use, so `import gatherlens` stays light."""

    def __setattr__(self, name, value):
        if name == "trace" and isinstance(value, types.ModuleType):
            value = value.trace
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

_SUBPACKAGES = ("models", "eval", "dist")  # the edge, imported on first use

__all__ = sorted(_EXPORTS) + [*_SUBPACKAGES, "trace"]


_exported, _ = lazy_exports(__name__, _EXPORTS)


def __getattr__(name: str):
    if name == "trace":
        return importlib.import_module("gatherlens.trace").trace
    if name in _SUBPACKAGES:
        return importlib.import_module(f"gatherlens.{name}")
    return _exported(name)


def __dir__():
    return __all__
