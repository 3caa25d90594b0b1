"""Pictures drawn only from selection records (`gatherlens.trace`).

    >>> rec = record_gather(x, 0, idx)
    >>> render_svg(rec, lang="zh"); render_html(rec); render_png(rec, "g.png"); print_terminal(rec)

layout.py turns a record into grids of cells (colours, elision, shape captions); scene.py places
them; svg.py / html.py (templates.py: the one jinja2 environment), png.py (cairosvg) and
terminal.py (rich) take fonts, colours and text widths from theme.py and
draw the same layout; `draw(obj, fmt)` (formats.py) is the one entry for every format, and
`picture_file(suffix, svg, html)` what a picture file holds (the suffix table: drawable.py).
mistakes.py draws the article's two gather mistakes beside the fix; report_figures.py (score
grid, head groups) and summary.py (the terminal summary) draw the `explain` report's pictures.
Every word comes from `gatherlens.i18n`.
"""
from gatherlens.render.formats import draw, picture_file
from gatherlens.render.html import render_blocks_html, render_html, render_html_fragment
from gatherlens.render.layout import Limits, layout
from gatherlens.render.mistakes import mistakes_html, mistakes_png, mistakes_svg, print_mistakes
from gatherlens.render.png import png_bytes, render_png, svg_to_png
from gatherlens.render.svg import render_blocks_svg, render_svg
from gatherlens.render.terminal import print_terminal, render_terminal

__all__ = [
    "draw", "picture_file",
    "Limits", "layout", "render_svg", "render_blocks_svg", "render_html", "render_blocks_html",
    "render_html_fragment", "render_png", "svg_to_png", "png_bytes", "render_terminal", "print_terminal",
    "mistakes_svg", "mistakes_html", "mistakes_png", "print_mistakes",
]
