"""HTML: a self-contained page (inline CSS and JS, no CDN, no network) around the SVG.

    >>> Path("gather.html").write_text(render_html(record))

Hovering an output cell highlights it, the index cell that chose it and the source cell it was
copied from, and writes the copy (`out[0, 1] = 5 ← input[1, 1]`) under the picture. A
Content-Security-Policy meta tag forbids every network fetch, so the page works from a file on
a plane and cannot leak. The same fragment (without <html>) is a record's `_repr_html_`.
"""
from __future__ import annotations

from markupsafe import Markup

from gatherlens.render.i18n import text
from gatherlens.render.layout import Limits, layout
from gatherlens.render.scene import FONTS, MONO, TextBox, place
from gatherlens.render.svg import environment, scene_svg


def _svg(blocks, lang, title, limits) -> str:
    items = [b if isinstance(b, TextBox) else layout(b, lang=lang, limits=limits) for b in blocks]
    return scene_svg(place(items, lang=lang, title=title))


def render_html(record, lang: str = "en", limits: Limits | None = None) -> str:
    """A complete HTML page showing one record."""
    return render_blocks_html([record], lang=lang, page_title=record.call, limits=limits)


def render_blocks_html(blocks: list, lang: str = "en", title: str = "", page_title: str = "",
                       limits: Limits | None = None) -> str:
    """A complete HTML page showing records and text boxes stacked (see render_blocks_svg)."""
    svg = _svg(blocks, lang, title, limits)
    return environment().get_template("page.html.j2").render(
        lang=lang, title=page_title or title, hint=text("hover", lang), svg=Markup(svg),
        font=FONTS[lang], mono=MONO)


def render_html_fragment(record, lang: str = "en", limits: Limits | None = None) -> str:
    """The picture with its hover script and style, to embed in a notebook or another page."""
    env = environment()
    svg = _svg([record], lang, "", limits)
    style = env.get_template("style.css.j2").render(mono=MONO)
    body = env.get_template("fragment.html.j2").render(svg=Markup(svg))
    return f"<style>{style}</style>\n{body}"
