"""The plot of a top-k quality report (matplotlib, imported when a plot is asked for).

    >>> plot_quality(report, "quality.png")      # perplexity and recall/cosine against k
    >>> plot_quality(report, "q.png", force=False, what="--plot")   # a command without --force

Written by `gatherlens.outputs.open_output`: with force=False a file that appeared since the
command checked the path is refused, never overwritten.
"""
from __future__ import annotations

from pathlib import Path

from gatherlens.eval.topk_quality import QualityReport
from gatherlens.outputs import open_output

__all__ = ["plot_quality"]


def plot_quality(report: QualityReport, path: str | Path, *, force: bool = True, what: str = "output file") -> Path:
    """Perplexity (left) and recall / cosine (right) against k, dense as a dashed line.

    force: replace a file that exists (False: refuse it). what: the option named in errors ("--plot").
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    dense = next((r for r in report.rows if r.top_k is None), None)
    topk = [r for r in report.rows if r.top_k is not None]
    ks = [r.top_k for r in topk]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    meta = report.meta
    if meta.get("perplexity") and dense is not None:
        ax1.plot(ks, [r.perplexity for r in topk], "o-", label="top-k attention")
        ax1.axhline(dense.perplexity, ls="--", color="gray", label=f"dense ({dense.perplexity:.2f})")
        ax1.set_ylabel("perplexity")
        ax1.legend()
    else:
        ax1.text(0.5, 0.5, "no language-model head:\nno perplexity", ha="center", va="center")
    ax2.plot(ks, [r.recall for r in topk], "o-", label="attention-mass recall")
    ax2.plot(ks, [r.cosine for r in topk], "s-", label="output cosine to dense")
    ax2.set_ylim(min([0.0] + [r.recall or 0 for r in topk]), 1.02)
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (keys gathered per query)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"top-k vs dense attention: {meta.get('model', meta.get('model_type', ''))}, "
                 f"{meta.get('tokens_total')} tokens, window {meta.get('window')}, stride {meta.get('stride')}")
    fig.tight_layout()
    try:
        with open_output(path, what, force=force, binary=True) as fh:
            fig.savefig(fh, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    return path
