"""use_sparse_decoding's default settings as a dict: a thin view of `SparseConfig`'s defaults.

    >>> DEFAULTS["budget"], DEFAULTS["page_size"], DEFAULTS["dense_layers"], DEFAULTS["share_selection"]
    (1024, 8, 2, False)
    >>> recent_for(512, None), recent_for(512, 0), recent_for(None, None)
    (128, 0, 0)

The defaults and the recent-window rule live in gatherlens.ops.sparse.config (SparseConfig,
DEFAULT); this module keeps the names older code imports.
"""
from __future__ import annotations

from gatherlens.ops.sparse.config import DEFAULT, SparseConfig

__all__ = ["DEFAULTS", "recent_for"]

DEFAULTS = {name: getattr(DEFAULT, name) for name in
            ("budget", "page_size", "group_score", "dense_layers", "recent", "share_selection", "dense_share")}


def recent_for(budget, recent: int | None) -> int:
    """The recent window a setting reads: `SparseConfig(budget, recent=recent).recent_window()`."""
    return SparseConfig(budget, recent=recent).recent_window()
