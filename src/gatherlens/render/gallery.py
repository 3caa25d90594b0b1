"""The head gallery: every layer x head of a run as a small score map, its tag and kept share.

    >>> svg = gallery_svg(gallery, lang="zh")     # gallery: a trace.head_records.HeadGallery
    >>> svg.count('class="gl-thumb"')             # SmolLM2: 30 layers x 9 heads
    270

Layers run across, heads down. Every map is a block of one palette PNG (render/palette_png.py)
that the SVG holds once and shows a part of per tile (a nested <svg> with a viewBox over the
image): a few kilobytes for 270 maps. Under each map: the head's tag (its frame has the tag's
colour) and the share of dense weight the run's top-k keeps. Above each layer: how it attends ("G" global,
"S512" a sliding window of 512, "C" chunked). Each tile is a button (tab, Enter) with a hit box of its own
pitch, so neighbours never overlap. The page's script (explore.js)
opens a clicked head in the sections below and moves the red outline to it; the outline starts
on the head the report shows.
"""
from __future__ import annotations

from markupsafe import Markup

from gatherlens.i18n import check_lang, text
from gatherlens.render.palette_png import data_uri, palette_png
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MASKED, MONO, PICKED, text_width, weight_colour
from gatherlens.trace.head_records import HEAD_TAGS, HeadGallery

__all__ = ["gallery_svg", "TAG_COLOURS", "MAP_PX"]

MARGIN = 16
MAP_PX = 32            # a map's side on the page
PITCH_X = 38           # one layer's column
PITCH_Y = MAP_PX + 26  # one head's row: the map, its tag, its kept share
TAG_COLOURS = {"sink": "#8c564b", "previous": "#1f77b4", "copying": "#9467bd", "broad": "#2ca02c",
               "mixed": "#7f7f7f"}


def _atlas(g: HeadGallery) -> str:
    """Every tile's grid in one palette PNG: layer l, head h at (l * Gk, h * Gq); index
    `levels` (past the weight levels) is the colour of blocks no query may see."""
    gq, gk = len(g.tiles[0].grid), len(g.tiles[0].grid[0])
    palette = [weight_colour(v / (g.levels - 1)) for v in range(g.levels)] + [MASKED]
    rows = [[0] * (g.layers * gk) for _ in range(g.heads * gq)]
    for t in g.tiles:
        for r, line in enumerate(t.grid):
            y = t.head * gq + r
            rows[y][t.layer * gk:(t.layer + 1) * gk] = [g.levels if v < 0 else v for v in line]
    return data_uri(palette_png(rows, palette))


def _tiles(g: HeadGallery, x0: int, y0: int, lang: str) -> list[dict]:
    gq, gk = len(g.tiles[0].grid), len(g.tiles[0].grid[0])
    return [dict(layer=t.layer, head=t.head, tag=t.tag, colour=TAG_COLOURS[t.tag],
                 x=x0 + t.layer * PITCH_X, y=y0 + t.head * PITCH_Y,
                 view=f"{t.layer * gk} {t.head * gq} {gk} {gq}",
                 label=text(f"gal_short_{t.tag}", lang), kept=f"{t.kept:.0%}",
                 aria=text("gal_thumb_label", lang, layer=t.layer, head=t.head, tag=text(f"gal_short_{t.tag}", lang),
                           kept=f"{t.kept:.0%}"))
            for t in g.tiles]


def _kind_marks(g: HeadGallery, x0: int, y: int, lang: str) -> list[dict]:
    """Above each layer's column: "G" (global) or "S512" (sliding, its window), "C" (chunked)."""
    return [dict(x=x0 + n * PITCH_X + MAP_PX // 2, y=y, kind=kind,
                 text=text(f"gal_kind_{kind}", lang) + ("" if window is None else str(window)))
            for n, (kind, window) in enumerate(g.kinds)]


def _legend(y: int, lang: str) -> list[dict]:
    """One swatch per tag with its short label and full name, left to right."""
    items, x = [], MARGIN
    for tag in HEAD_TAGS:
        brief, name = text(f"gal_short_{tag}", lang), text(f"gal_tag_{tag}", lang)
        words = name if brief == name else f"{brief} = {name}"
        items.append(dict(x=x, y=y, colour=TAG_COLOURS[tag], text=words))
        x += 18 + text_width(words, 11) + 16
    return items


def _stretch(g: HeadGallery) -> Markup:
    """A map's attribute to fill its square when its grid is not square (fewer queries than keys)."""
    square = len(g.tiles[0].grid) == len(g.tiles[0].grid[0])
    return Markup("" if square else ' preserveAspectRatio="none"')


def gallery_svg(g: HeadGallery, lang: str = "en") -> str:
    """The gallery of `g` as one SVG (the page inlines it; `explain` writes it as a file)."""
    check_lang(lang)
    head_labels = [text("gal_head", lang, h=h) for h in range(g.heads)]
    x0 = MARGIN + max(text_width(s, 11) for s in head_labels) + 10
    y0 = MARGIN + 46 + (14 if g.kinds else 0)
    title = text("gal_fig_title", lang, layers=g.layers, heads=g.heads, k=g.top_k)
    kept = text("gal_kept_dense" if g.dense_run else "gal_kept", lang, k=g.top_k)
    if g.kinds:
        kept += " " + text("gal_kinds", lang)
    legend_y = y0 + g.heads * PITCH_Y + 16
    legend = _legend(legend_y, lang)
    width = max(x0 + g.layers * PITCH_X + MARGIN, text_width(title, 13) + 2 * MARGIN,
                legend[-1]["x"] + 18 + text_width(legend[-1]["text"], 11) + MARGIN,
                text_width(kept, 11) + 2 * MARGIN)
    chosen = dict(x=x0 + g.layer * PITCH_X, y=y0 + g.head * PITCH_Y)
    return render_template(
        "gallery.svg.j2", width=width, height=legend_y + 40, title=title, font=FONTS[lang], mono=MONO,
        margin=MARGIN, atlas=_atlas(g), atlas_w=g.layers * len(g.tiles[0].grid[0]),
        atlas_h=g.heads * len(g.tiles[0].grid), stretch=_stretch(g), tiles=_tiles(g, x0, y0, lang), px=MAP_PX,
        layers=[dict(x=x0 + n * PITCH_X + MAP_PX // 2, text=str(n)) for n in range(g.layers)],
        heads=[dict(y=y0 + h * PITCH_Y + MAP_PX // 2 + 4, text=s) for h, s in enumerate(head_labels)],
        axis=text("gal_layer_axis", lang), x0=x0, y0=y0, legend=legend, kept=kept,
        kept_y=legend_y + 26, chosen=chosen, picked=PICKED, marks=_kind_marks(g, x0, y0 - 20, lang),
        pitch_x=PITCH_X, pitch_y=PITCH_Y,
    )
