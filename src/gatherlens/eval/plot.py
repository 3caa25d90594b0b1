"""The plots of quality reports (matplotlib, imported when a plot is asked for).

    >>> plot_quality(report, "quality.png")      # perplexity and recall/cosine against k
    >>> plot_long(long_report, "long.png")       # eval-long: accuracy against length, a panel per task
    >>> plot_quality(report, "q.png", force=False, what="--plot")   # a command without --force

Written by `gatherlens.outputs.open_output`: with force=False a file that appeared since the
command checked the path is refused, never overwritten.
"""
from __future__ import annotations

from pathlib import Path

from gatherlens.eval.topk_quality import QualityReport
from gatherlens.outputs import open_output

__all__ = ["plot_quality", "plot_long"]


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
    return _save(fig, path, force, what)


def plot_long(report, path: str | Path, *, force: bool = True, what: str = "output file") -> Path:
    """eval-long's accuracy against context length, one panel per task, a line per row with its 95% interval
    (dense black and first); `report` an eval.long_context.LongReport. force, what: as plot_quality."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    tasks = list(dict.fromkeys(r["task"] for r in report.rows))
    settings = list(dict.fromkeys(r["setting"] for r in report.rows))
    cols = min(3, len(tasks))
    fig, axes = plt.subplots((len(tasks) + cols - 1) // cols, cols, figsize=(4.2 * cols, 3.4 * ((len(tasks) + cols - 1) // cols)),
                             squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for i, s in enumerate(settings):
            mine = sorted((r for r in report.rows if r["task"] == task and r["setting"] == s), key=lambda r: r["length"])
            x = [r["length"] * (1 + 0.03 * (i - len(settings) / 2)) for r in mine]  # side by side at each length
            y = [r["accuracy"] for r in mine]
            err = [[a - r["ci"][0] for a, r in zip(y, mine)], [r["ci"][1] - a for a, r in zip(y, mine)]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=2, label=s, color="black" if s == "dense" else None,
                        lw=2 if s == "dense" else 1)
        ax.set_title(task)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    axes.flat[0].set_ylabel("accuracy (95% interval)")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"eval-long: {report.meta.get('model', '')} on {report.meta.get('text', '')}")
    return _save(fig, path, force, what)


def _save(fig, path: Path, force: bool, what: str) -> Path:
    """Write `fig` to `path` (its suffix names the format) by the output rule, then close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with open_output(path, what, force=force, binary=True) as fh:
            fig.savefig(fh, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    return path
