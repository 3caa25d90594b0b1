"""HTML: a self-contained page (inline CSS and JS, no CDN, no network) around the SVG.

    >>> Path("gather.html").write_text(render_html(record))

Hovering an output cell highlights it, the index cell that chose it and the source cell it was
copied from, and writes the copy (`out[0, 1] = 5 ← input[1, 1]`) under the picture. A
Content-Security-Policy meta tag forbids every network fetch, so the page works from a file on
a plane and cannot leak. The same fragment (without <html>) is a record's `_repr_html_`.
"""
from __future__ import annotations

from markupsafe import Markup

from gatherlens.i18n import text
from gatherlens.render.layout import Limits
from gatherlens.render.svg import render_blocks_svg
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO


def render_html(record, lang: str = "en", limits: Limits | None = None) -> str:
    """A complete HTML page showing one record."""
    return render_blocks_html([record], lang=lang, page_title=record.call, limits=limits)


def render_blocks_html(blocks: list, lang: str = "en", title: str = "", page_title: str = "",
                       limits: Limits | None = None) -> str:
    """A complete HTML page showing records and text boxes stacked (see render_blocks_svg)."""
    svg = render_blocks_svg(blocks, lang=lang, title=title, limits=limits)
    return render_template("page.html.j2", lang=lang, title=page_title or title,
                           hint=text("hover", lang), svg=Markup(svg), font=FONTS[lang], mono=MONO)


def render_html_fragment(record, lang: str = "en", limits: Limits | None = None) -> str:
    """The picture with its hover script and style, to embed in a notebook or another page."""
    return svg_fragment(render_blocks_svg([record], lang=lang, limits=limits))


def svg_fragment(svg: str) -> str:
    """A record's SVG (render_svg) with the hover script and style: render_html_fragment's body."""
    style = render_template("style.css.j2", mono=MONO)
    body = render_template("fragment.html.j2", svg=Markup(svg))
    return f"<style>{style}</style>\n{body}"
