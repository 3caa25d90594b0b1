"""use_sparse_decoding's default settings, in a module light enough for the command line's options.

    >>> DEFAULTS["budget"], DEFAULTS["page_size"]
    (1024, 16)

The best setting of `gatherlens eval-sparse`'s comparison table (docs/benchmarks.md has the table).
"""
from __future__ import annotations

__all__ = ["DEFAULTS"]

DEFAULTS = {"budget": 1024, "page_size": 16, "group_score": "max", "dense_layers": 0, "recent": 0}
