"""SVG: a deterministic, standalone picture of a record.

    >>> svg = render_svg(record_gather(x, 0, idx), lang="zh")

Drawn with a jinja2 template (templates.py, autoescaping on), not an SVG library: the picture
is a few kinds of element (rect, text, g) whose positions come from `scene.place`, jinja2 is
already a dependency for the HTML page, and autoescaping guarantees every label (a token such as
`<script>`) lands in the file as text, never as markup. Same record, same bytes.
"""
from __future__ import annotations

from gatherlens.render.layout import Limits, layout
from gatherlens.render.scene import Scene, TextBox, place
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO


def scene_svg(scene: Scene) -> str:
    """Draw a placed scene as an SVG document (no XML prolog, so it can be inlined in HTML)."""
    return render_template("figure.svg.j2", s=scene, font=FONTS[scene.lang], mono=MONO)


def render_svg(record, lang: str = "en", limits: Limits | None = None) -> str:
    """A standalone SVG of one record."""
    return scene_svg(place([layout(record, lang=lang, limits=limits)], lang=lang))


def render_blocks_svg(blocks: list, lang: str = "en", title: str = "",
                      limits: Limits | None = None) -> str:
    """Several records (and text boxes) stacked into one SVG."""
    items = [b if isinstance(b, TextBox) else layout(b, lang=lang, limits=limits) for b in blocks]
    return scene_svg(place(items, lang=lang, title=title))
