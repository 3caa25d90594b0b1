"""The pages x steps picture of a generation: which pages every layer read at every decode step.

    >>> svg = page_trace_svg(trace)              # trace: a gatherlens.trace.page_trace.PageTrace
    >>> html = page_trace_html(trace, lang="zh")

One panel per layer, columns = decode steps, rows = pages of the KV cache (page 0 on top, the
cache growing downwards). A panel holds (pages x steps) cells, tens of thousands for a long
generation, so each is drawn as one PNG (Pillow; cells scaled by nearest neighbour, never
smoothed) inside the SVG, while titles, labels and the legend stay SVG text in the theme's fonts.
Same trace, same bytes.
"""
from __future__ import annotations

import base64
import io

import numpy as np
from markupsafe import Markup

from gatherlens.i18n import check_lang, text
from gatherlens.ops.sparse.geometry import ceil_div
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO, PALETTE, text_width, weight_colour, wrap
from gatherlens.trace.page_trace import PageTrace

__all__ = ["page_trace_svg", "page_trace_html", "panel_pixels"]

MARGIN, GAP, LABEL = 16, 18, 16
NOT_READ = (226, 226, 226)   # in the cache, not gathered
EMPTY = (255, 255, 255)      # not in the cache yet
DENSE = tuple(int(PALETTE[5][i:i + 2], 16) for i in (1, 3, 5))  # orange: read every page, no choice


def panel_pixels(trace: PageTrace, layer: int) -> np.ndarray:
    """(pages, steps, 3) uint8 RGB of one layer's panel."""
    read = trace.read[layer].T.numpy()  # (pages, steps)
    dense = trace.dense[layer].numpy()  # (steps,)
    ramp = np.array([_rgb(weight_colour(0.25 + 0.75 * i / 255)) for i in range(256)], dtype=np.uint8)  # (256, 3)
    img = ramp[np.clip(np.round(read * 255), 0, 255).astype(np.int64)]  # (pages, steps, 3)
    img[read == 0] = NOT_READ
    img[:, dense] = DENSE
    img[read < 0] = EMPTY
    return img


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _png(img: np.ndarray, size: tuple[int, int]) -> str:
    """Base64 PNG of an (H, W, 3) uint8 image scaled to `size` (w, h) by nearest neighbour, so every
    viewer shows crisp cells (Pillow writes no timestamps: same pixels, same bytes)."""
    from PIL import Image

    buf = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(img)).resize(size, Image.Resampling.NEAREST)
    image.save(buf, format="PNG", optimize=False, compress_level=9)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _panels(trace: PageTrace, lang: str, columns: int, size: tuple[int, int], top: int) -> list[dict]:
    w, h = size
    per_step = trace.pages_read().float().mean(1)  # (layers,) pages read per step, on average
    out = []
    for layer in range(trace.num_layers):
        row, col = divmod(layer, columns)
        dense = bool(trace.dense[layer].all())
        label = f"{layer}" + (f" ({text('page_trace_dense', lang)})" if dense else "")
        info = text("page_trace_panel", lang, layer=layer, pages=float(per_step[layer]), total=trace.num_pages)
        if trace.counts is not None and not dense:  # the auto budget: each head its own count
            info = text("page_trace_panel_heads", lang, layer=layer, pages=float(per_step[layer]),
                        total=trace.num_pages, head=float(trace.counts[layer].float().mean()))
        out.append(dict(x=MARGIN + col * (w + GAP), y=top + row * (h + GAP + LABEL) + LABEL, w=w, h=h,
                        label=label, info=info, png=_png(panel_pixels(trace, layer), (w, h))))
    return out


def page_trace_svg(trace: PageTrace, lang: str = "en", columns: int = 6, panel: tuple[int, int] = (150, 150)) -> str:
    """The whole trace as one standalone SVG: a title, the legend and one panel per layer."""
    check_lang(lang)
    columns = max(1, min(columns, trace.num_layers))
    title = _title(trace, lang)
    width = max(2 * MARGIN + columns * panel[0] + (columns - 1) * GAP, text_width(title, 14) + 2 * MARGIN)
    legend = wrap(text("page_trace_legend", lang), width - 2 * MARGIN, 11)
    top = MARGIN + 36 + len(legend) * 15 + 8
    panels = _panels(trace, lang, columns, panel, top)
    rows = ceil_div(trace.num_layers, columns)
    height = top + rows * (panel[1] + GAP + LABEL) + 14
    axes = dict(x=MARGIN, y=height - 10, text="steps → · pages ↓" if lang == "en" else "解码步 → · 页 ↓")
    return render_template("page_trace.svg.j2", width=width, height=height, title=title, legend=legend,
                           panels=panels, axes=axes, margin=MARGIN, font=FONTS[lang], mono=MONO)


def page_trace_html(trace: PageTrace, lang: str = "en", **kw) -> str:
    """An offline HTML page around page_trace_svg (hover a panel for its layer's numbers)."""
    svg = page_trace_svg(trace, lang=lang, **kw)
    return render_template("page.html.j2", lang=lang, title=_title(trace, lang), hint="",
                           svg=Markup(svg), font=FONTS[lang], mono=MONO)


def _title(trace: PageTrace, lang: str) -> str:
    budget = (text("page_trace_budget", lang, budget=trace.budget) if trace.budget is not None
              else text("page_trace_no_budget", lang))
    if trace.budget == "auto" and trace.mean_pages() is not None:
        budget = text("page_trace_budget_auto", lang, pages=trace.mean_pages())
    return text("page_trace_title", lang, steps=trace.num_steps, P=trace.page_size, budget=budget)
