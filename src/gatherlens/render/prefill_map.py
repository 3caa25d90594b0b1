"""The query-block x key-block picture of a sparse prefill: which key blocks each query block gathered.

    >>> svg = prefill_map_svg(selection, head=0)            # selection: an ops.prefill PrefillSelection
    >>> svg = prefill_map_svg(selection, head=2, lang="zh", layer=7)

One map per (layer, selection head): rows are query blocks (the first on top), columns key blocks.
Blue: gathered; grey: allowed by causality (and the window), skipped by the rule; white: not
allowed. A long prompt has hundreds of blocks a side, so the map is one PNG (nearest neighbour,
crisp cells) inside the SVG; title, legend and axes stay SVG text in the theme's fonts, en or zh.
Drawn from the PrefillSelection itself (plain data of ops/prefill: a tensor and ints).
"""
from __future__ import annotations

import base64
import io

import numpy as np

from gatherlens.errors import GatherIndexError
from gatherlens.i18n import check_lang, text
from gatherlens.ops.prefill.selection import PrefillSelection
from gatherlens.render.templates import render_template
from gatherlens.render.theme import BLOCK_KEPT, BLOCK_OUTSIDE, BLOCK_SKIPPED, FONTS, MONO, text_width, wrap

__all__ = ["prefill_map_svg", "map_pixels"]

MARGIN = 16


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def map_pixels(sel: PrefillSelection, head: int = 0, batch: int = 0) -> np.ndarray:
    """(nq, nk, 3) uint8 RGB of one selection head's map."""
    kept = sel.blocks[batch, head].cpu().numpy()                              # (nq, nk)
    allowed = sel.allowed().cpu().numpy()                                     # (nq, nk)
    img = np.empty((*kept.shape, 3), dtype=np.uint8)                          # (nq, nk, 3)
    img[:] = _rgb(BLOCK_OUTSIDE)
    img[allowed] = _rgb(BLOCK_SKIPPED)
    img[kept] = _rgb(BLOCK_KEPT)
    return img


def _png(img: np.ndarray, size: tuple[int, int]) -> str:
    """Base64 PNG of an (H, W, 3) image scaled to `size` (w, h) by nearest neighbour (no timestamps)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).resize(size, Image.Resampling.NEAREST).save(
        buf, format="PNG", optimize=False, compress_level=9)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def prefill_map_svg(sel: PrefillSelection, head: int = 0, *, batch: int = 0, layer: int | None = None,
                    lang: str = "en", size: int = 320) -> str:
    """One selection head's map as a standalone SVG (title, legend, the map, the axes)."""
    check_lang(lang)
    heads = sel.blocks.shape[1]
    if not -heads <= head < heads:
        raise GatherIndexError(f"head {head} is outside [{-heads}, {heads}) (the selection's heads)")
    head %= heads
    nq, nk = sel.blocks.shape[2], sel.blocks.shape[3]
    allowed = float(sel.allowed().sum())
    kept = float(sel.blocks[batch, head].sum()) / max(allowed, 1.0)
    layer = sel.meta.get("layer", 0) if layer is None else layer
    title = text("prefill_map_title", lang, layer=layer, head=head, block=sel.block_size, kept=kept)
    cell = max(1, size // max(nq, nk))
    w, h = max(nk * cell, 1), max(nq * cell, 1)
    width = max(2 * MARGIN + w, 2 * MARGIN + 360)
    title_lines = wrap(title, width - 2 * MARGIN, 14)
    legend = wrap(text("prefill_map_legend", lang, rule=sel.rule), width - 2 * MARGIN, 11)
    legend_top = MARGIN + 14 + len(title_lines) * 17 + 8
    top = legend_top + len(legend) * 15 + 4
    axes = dict(x=MARGIN, y=top + h + 16, text=text("prefill_map_axes", lang))
    png = _png(map_pixels(sel, head, batch), (w, h))
    return render_template("prefill_map.svg.j2", width=max(width, text_width(axes["text"], 10) + 2 * MARGIN),
                           height=top + h + 26, title=title, title_lines=title_lines, legend=legend,
                           legend_top=legend_top, map=dict(x=MARGIN, y=top, w=w, h=h, png=png), axes=axes,
                           margin=MARGIN, font=FONTS[lang], mono=MONO)
