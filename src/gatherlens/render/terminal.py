"""Terminal: the same grids in colour with rich (true colour where the terminal has it).

    >>> print_terminal(record_embedding(ids, W))

rich handles colour depth, width detection and plain-text fallbacks (NO_COLOR, pipes), so the
view degrades to readable text without escape codes when it must.
"""
from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from gatherlens.render.layout import FigureModel, Limits, Panel, layout
from gatherlens.render.theme import UNPICKED


def _panel_table(p: Panel) -> Table:
    outer = Table.grid(padding=(0, 0))
    outer.add_row(Text(p.title, style="bold"))
    for sl in p.slices:
        if sl is None:
            outer.add_row(Text("⋮", style="dim"))
            continue
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                  title=Text(sl.label) if sl.label else None, title_justify="left",
                  title_style="dim")
        t.add_column("", justify="right", style="dim", no_wrap=True)
        for c, head in zip(sl.cols, sl.col_heads):
            t.add_column(Text("…" if c is None else head), justify="center", no_wrap=True)
        for r, rhead in zip(sl.rows, sl.row_heads):
            if r is None:
                t.add_row(Text("⋮"), *[Text("") for _ in sl.cols])
                continue
            row = []
            for c in sl.cols:
                if c is None:
                    row.append(Text("…", style="dim"))
                    continue
                cell = sl.cells[(r, c)]
                label = f"{cell.text}:{cell.sub}" if cell.sub else cell.text
                style = "#777777" if cell.fill == UNPICKED else f"bold #000000 on {cell.fill}"
                row.append(Text(f" {label} ", style=style))
            t.add_row(Text(rhead), *row)
        outer.add_row(t)
    if p.more:
        outer.add_row(Text(p.more, style="dim"))
    outer.add_row(Text(p.shape, style="italic dim"))
    return outer


def figure_renderable(fig: FigureModel) -> Group:
    """A rich renderable of a laid-out figure: call, caption, then the panels side by side."""
    row = Table.grid(padding=(0, 3))
    for _ in fig.panels:
        row.add_column(vertical="top")
    row.add_row(*[_panel_table(p) for p in fig.panels])
    return Group(Text(fig.title, style="bold cyan"), Text(fig.caption), Text(fig.legend,
                 style="dim"), Text(""), row)


def render_terminal(record, lang: str = "en", limits: Limits | None = None) -> Group:
    """A rich renderable of one record."""
    return figure_renderable(layout(record, lang=lang, limits=limits))


def print_terminal(record, lang: str = "en", console: Console | None = None,
                   limits: Limits | None = None) -> None:
    """Print one record to the terminal (or to `console`).

    Written to a pipe or file, the view gets the width it needs instead of rich's default 80
    columns, so cells are never cut; a real terminal keeps its own width.
    """
    view = render_terminal(record, lang=lang, limits=limits)
    if console is None:
        console = Console()
        if not console.is_terminal:
            panels = view.renderables[-1]
            wide = console.options.update_width(1000)
            console.width = max(console.width, console.measure(panels, options=wide).maximum)
    console.print(view)
