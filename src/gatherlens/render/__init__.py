"""Pictures drawn only from selection records (`gatherlens.trace`).

    >>> rec = record_gather(x, 0, idx)
    >>> render_svg(rec, lang="zh"); render_html(rec); render_png(rec, "g.png"); print_terminal(rec)

layout.py turns a record into grids of cells (colours, elision, shape captions); scene.py places
them; svg.py / html.py (jinja2 templates in templates/), png.py (cairosvg) and terminal.py (rich)
draw the same layout. mistakes.py draws the article's two gather mistakes beside the fix.
"""
from gatherlens.render.html import render_blocks_html, render_html, render_html_fragment
from gatherlens.render.layout import Limits, layout
from gatherlens.render.mistakes import mistakes_html, mistakes_png, mistakes_svg
from gatherlens.render.png import render_png, svg_to_png
from gatherlens.render.svg import render_blocks_svg, render_svg
from gatherlens.render.terminal import print_terminal, render_terminal

__all__ = [
    "Limits", "layout", "render_svg", "render_blocks_svg", "render_html", "render_blocks_html",
    "render_html_fragment", "render_png", "svg_to_png", "render_terminal", "print_terminal",
    "mistakes_svg", "mistakes_html", "mistakes_png",
]
