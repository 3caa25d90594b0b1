"""The article's two gather mistakes drawn beside the fix (one figure, in every format).

    >>> Path("mistakes.svg").write_text(mistakes_svg(lang="zh"))
    >>> print_mistakes(lang="en")                  # the same story in the terminal

The mistakes themselves are run and recorded by `gatherlens.trace.mistakes`; this module puts
them in words (mistake 1 raises, so it is explained in a text box) beside their records.
"""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.text import Text

from gatherlens.i18n import text
from gatherlens.render.html import render_blocks_html
from gatherlens.render.layout import layout
from gatherlens.render.png import svg_to_png
from gatherlens.render.scene import TextBox
from gatherlens.render.svg import render_blocks_svg
from gatherlens.render.terminal import figure_renderable
from gatherlens.trace.mistakes import article_mistakes

__all__ = ["mistakes_blocks", "mistakes_svg", "mistakes_html", "mistakes_png", "print_mistakes"]


def mistakes_blocks(lang: str = "en") -> list:
    """Text boxes and records, in order: the error, the silent mistake, the fix."""
    m = article_mistakes(lang)
    return [
        TextBox(text("mistake_ndim_title", lang),
                text("mistake_ndim_body", lang, idx=f"(B, S, d) = {m.index_shape}",
                     src=f"(V, d) = {m.table_shape}"), tone="error"),
        TextBox(text("mistake_silent_title", lang), text("mistake_silent_body", lang),
                tone="warn"),
        m.silent,
        TextBox(text("mistake_fix_title", lang), text("mistake_fix_body", lang), tone="ok"),
        m.fix,
    ]


def mistakes_svg(lang: str = "en") -> str:
    return render_blocks_svg(mistakes_blocks(lang), lang=lang, title=text("mistakes_title", lang))


def mistakes_html(lang: str = "en") -> str:
    return render_blocks_html(mistakes_blocks(lang), lang=lang, title=text("mistakes_title", lang))


def mistakes_png(path: str | Path, lang: str = "en", scale: float = 2.0) -> Path:
    return svg_to_png(mistakes_svg(lang), path, scale=scale)


def print_mistakes(lang: str = "en", console: Console | None = None) -> None:
    """The figure in the terminal: each text box as words, each record as its grids."""
    console = console or Console()
    for block in mistakes_blocks(lang):
        if isinstance(block, TextBox):
            console.print(Text("\n" + block.title, style="bold"))
            console.print(Text(block.body))
        else:
            console.print(figure_renderable(layout(block, lang=lang)))
