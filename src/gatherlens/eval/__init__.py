"""Evaluation at the edge: how much a gather changes a real model, on real text.

    >>> from gatherlens.eval import load_text, evaluate_quality, write_report
    >>> ids = lm.encode(load_text("austen"))[:, :2048]               # (1, N)
    >>> write_report(evaluate_quality(lm.model, ids, ks=(8, 32)), "quality.json")

- corpus.py, rdata.py      real prose no one here wrote (Jane Austen read without R, pydoc topics)
- stats.py                 what both quality runs share: per-layer recall/cosine, row and report base
- topk_quality.py          top-k attention against dense: sliding-window perplexity, recall, cosine
- sparse_quality.py        page-selected sparse decoding against dense, teacher-forced decode steps
- passkey.py               the passkey retrieval test through sparse decode steps
- io.py, plot.py           one CSV/JSON writer for every report; the top-k plot

May import ops, trace, render and models; never commands. Names load on first use (PEP 562), so
reading a corpus does not import transformers.
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "load_text": "corpus", "austen_available": "corpus", "read_lazyload": "rdata",
    "LayerStats": "stats", "EvalRow": "stats", "EvalReport": "stats",
    "evaluate_quality": "topk_quality", "QualityRow": "topk_quality", "QualityReport": "topk_quality",
    "sliding_windows": "topk_quality",
    "evaluate_sparse_quality": "sparse_quality", "SparseQualityRow": "sparse_quality",
    "SparseQualityReport": "sparse_quality",
    "passkey_trials": "passkey", "PasskeyResult": "passkey",
    "write_report": "io", "write_table": "io", "plot_quality": "plot",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
