"""A benchmark's ratios as a picture: time against the strongest baseline, one line per series.

    >>> plot_ratios(rows, "attention.png", x="context", series=("mode", "top_k"),
    ...             title="top-k attention / SDPA")                        # one line per (mode, k)

matplotlib is imported only when a plot is asked for. The y axis is the time ratio (log scale), with
1 (the baseline) drawn dashed: below it the op is faster.
"""
from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import Path

from gatherlens.bench.output import check_output
from gatherlens.outputs import open_output

__all__ = ["check_plot_path", "plot_ratios", "save_figure"]


def check_plot_path(path: Path | None, force: bool) -> Path | None:
    """Refuse, before any timing, a --plot path that exists (without --force) or is not a .png/.svg/.pdf."""
    return check_output(path, force, "--plot", (".png", ".svg", ".pdf"))


def plot_ratios(rows, path: str | Path, *, x: str, series: tuple[str, ...], title: str,
                y: str = "ratio", xlabel: str | None = None, force: bool = True) -> Path:
    """rows (dataclasses or dicts) -> a log-log plot of row[y] against row[x], one line per series key.

    Written by `gatherlens.outputs.open_output` (force=False: a file made meanwhile is refused)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    rows = [asdict(r) if is_dataclass(r) else dict(r) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key in dict.fromkeys(tuple(r[s] for s in series) for r in rows):
        mine = sorted((r for r in rows if tuple(r[s] for s in series) == key), key=lambda r: r[x])
        label = ", ".join(f"{s}={v}" for s, v in zip(series, key))
        ax.plot([r[x] for r in mine], [r[y] for r in mine], "o-", label=label)
    ax.axhline(1.0, ls="--", color="gray", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel("time / baseline's time (below 1: faster)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, force, dpi=120)


def save_figure(fig, path: Path, force: bool, what: str = "--plot", **savefig) -> Path:
    """`save_figure(fig, Path("a.svg"), force)`: the figure in the format its suffix names, then closed.

    Written by `gatherlens.outputs.open_output` (force=False: a file made meanwhile is refused);
    `savefig` goes to matplotlib's `Figure.savefig` (dpi=...)."""
    import matplotlib.pyplot as plt

    try:
        with open_output(path, what, force=force, binary=True) as fh:
            fig.savefig(fh, format=path.suffix.lstrip(".").lower() or "png", **savefig)
    finally:
        plt.close(fig)
    return path
