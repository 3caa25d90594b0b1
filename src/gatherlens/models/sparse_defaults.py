"""use_sparse_decoding's default settings, in a module light enough for the command line's options.

    >>> DEFAULTS["budget"], DEFAULTS["page_size"], DEFAULTS["dense_layers"], DEFAULTS["share_selection"]
    (1024, 8, 2, False)

The best setting of `gatherlens eval-sparse`'s comparison table (8K of Jane Austen, 512 scored
tokens): pages of 8 tokens, the first two layers dense (as Quest), a recent window of a quarter
of the budget (recent=None), each query head choosing its own pages (perplexity +2.3% at budget
512 and +5.5% at 256, against +3.2% and +8.5% with one choice per KV group; the step's time
differs by less than this machine's noise, docs/bench/notes.md). A
budget of a third of the cache or more decodes densely (dense_share): below that, selection and
the gather cost more per layer than reading every page in place (`gatherlens bench generate`).
"""
from __future__ import annotations

__all__ = ["DEFAULTS", "recent_for"]

DEFAULTS = {"budget": 1024, "page_size": 8, "group_score": "max", "dense_layers": 2, "recent": None,
            "share_selection": False, "dense_share": 1 / 3}


def recent_for(budget, recent: int | None) -> int:
    """The recent window a setting reads: `recent`, or for None (the default) a quarter of the
    budget (0 when the budget is None: dense reads everything anyway).

    >>> recent_for(512, None), recent_for(512, 0), recent_for(None, None)
    (128, 0, 0)
    """
    if recent is not None:
        return recent
    return budget // 4 if isinstance(budget, int) and not isinstance(budget, bool) else 0
