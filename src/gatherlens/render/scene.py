"""Geometry: figure models (and text boxes) -> positioned rectangles, cells and text.

    >>> scene = place([layout(rec)])
    >>> scene.width, scene.height, len(scene.cells)

Every coordinate is an integer, so the SVG drawn from a scene is byte-for-byte deterministic.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gatherlens.render.layout import FigureModel, Panel

CELL_W, CELL_H, CELL_H2 = 46, 24, 32
GAP = 14           # width / height of an elided column / row ("...")
PANEL_GAP = 40
MARGIN = 16
HEAD_H = 14        # column-heading row
MIN_WIDTH = 560

FONTS = {
    "en": "DejaVu Sans, Noto Sans, Arial, sans-serif",
    "zh": "Noto Sans CJK SC, Droid Sans Fallback, WenQuanYi Micro Hei, Microsoft YaHei, "
          "PingFang SC, sans-serif",
}
MONO = "DejaVu Sans Mono, Noto Sans Mono, Menlo, Consolas, monospace"


@dataclass
class TextBox:
    """A block of words in a figure (the mistakes figure's error explanation)."""

    title: str
    body: str
    tone: str = "error"   # "error" | "warn" | "ok"


@dataclass
class Scene:
    width: int
    height: int
    lang: str
    label: str
    texts: list[dict] = field(default_factory=list)
    rects: list[dict] = field(default_factory=list)
    cells: list[dict] = field(default_factory=list)


def text_width(s: str, size: float) -> int:
    """Estimated width in px: CJK glyphs are square, Latin ones about 0.6 em."""
    w = 0.0
    for ch in s:
        w += size if ord(ch) >= 0x2E80 else size * 0.62
    return int(w + 0.999)


def wrap(s: str, width_px: int, size: float) -> list[str]:
    """Greedy wrap of English words and single CJK characters to `width_px`."""
    tokens = re.findall(r"[\u2e80-\uffff]|[^\s\u2e80-\uffff]+\s*|\s+", s)
    lines, cur = [], ""
    for tok in tokens:
        if cur and text_width((cur + tok).rstrip(), size) > width_px:
            lines.append(cur.rstrip())
            cur = tok.lstrip()
        else:
            cur += tok
    if cur.strip():
        lines.append(cur.rstrip())
    return lines or [""]


def _panel_size(p: Panel) -> tuple[int, int, int]:
    """(width, height, row-heading width) of a panel."""
    heads = [h for sl in p.slices if sl for h in sl.row_heads]
    head_w = max([text_width(h, 11) for h in heads] + [0]) + (8 if any(heads) else 0)
    ch = CELL_H2 if p.two_line else CELL_H
    w = h = 0
    for sl in p.slices:
        if sl is None:
            h += GAP
            continue
        sw = head_w + sum(GAP if c is None else CELL_W for c in sl.cols)
        w = max(w, sw)
        h += (16 if sl.label else 0) + HEAD_H + sum(GAP if r is None else ch for r in sl.rows) + 6
    w = max(w, text_width(p.title, 12), text_width(p.shape, 11), text_width(p.more, 11))
    h += 20 + (16 if p.more else 0) + 18  # title, more, shape caption
    return w, h, head_w


def _place_panel(scene: Scene, p: Panel, x: int, y: int, prefix: str) -> None:
    w, h, head_w = _panel_size(p)
    ch = CELL_H2 if p.two_line else CELL_H
    scene.texts.append(dict(x=x, y=y + 12, text=p.title, size=12, anchor="start", weight="bold",
                            cls="gl-panel-title", mono=False))
    cy = y + 20
    for sl in p.slices:
        if sl is None:
            scene.texts.append(dict(x=x + head_w + 4, y=cy + 11, text="⋮", size=12,
                                    anchor="start", weight="normal", cls="gl-gap", mono=False))
            cy += GAP
            continue
        if sl.label:
            scene.texts.append(dict(x=x, y=cy + 12, text=sl.label, size=11, anchor="start",
                                    weight="normal", cls="gl-slice", mono=True))
            cy += 16
        # column headings
        cx = x + head_w
        for c, head in zip(sl.cols, sl.col_heads):
            cw = GAP if c is None else CELL_W
            if c is None:
                scene.texts.append(dict(x=cx + cw // 2, y=cy + 11, text="…", size=10,
                                        anchor="middle", weight="normal", cls="gl-gap",
                                        mono=False))
            elif head:
                scene.texts.append(dict(x=cx + cw // 2, y=cy + 11, text=head, size=10,
                                        anchor="middle", weight="normal", cls="gl-head",
                                        mono=False))
            cx += cw
        cy += HEAD_H
        for r, rhead in zip(sl.rows, sl.row_heads):
            rh = GAP if r is None else ch
            if r is None:
                scene.texts.append(dict(x=x + head_w + CELL_W // 2, y=cy + 11, text="⋮", size=11,
                                        anchor="middle", weight="normal", cls="gl-gap",
                                        mono=False))
                cy += rh
                continue
            if rhead:
                scene.texts.append(dict(x=x + head_w - 6, y=cy + ch // 2 + 4, text=rhead,
                                        size=11, anchor="end", weight="normal", cls="gl-head",
                                        mono=False))
            cx = x + head_w
            for c in sl.cols:
                if c is None:
                    scene.texts.append(dict(x=cx + GAP // 2, y=cy + ch // 2 + 4, text="…",
                                            size=10, anchor="middle", weight="normal",
                                            cls="gl-gap", mono=False))
                    cx += GAP
                    continue
                cell = sl.cells[(r, c)]
                scene.cells.append(dict(
                    role=p.role, key=f"{prefix}{cell.key}", x=cx, y=cy, w=CELL_W, h=ch,
                    fill=cell.fill, text=cell.text, sub=cell.sub, picked=cell.picked,
                    info=cell.info,
                    data_src=f"{prefix}{cell.data_src}" if cell.data_src else "",
                    data_idx=f"{prefix}{cell.data_idx}" if cell.data_idx else "",
                    tx=cx + CELL_W // 2, ty=cy + (13 if p.two_line else 16),
                    sy=cy + 26,
                ))
                cx += CELL_W
            cy += rh
        cy += 6
    if p.more:
        scene.texts.append(dict(x=x, y=cy + 12, text=p.more, size=11, anchor="start",
                                weight="normal", cls="gl-gap", mono=False))
        cy += 16
    scene.texts.append(dict(x=x, y=cy + 13, text=p.shape, size=11, anchor="start",
                            weight="normal", cls="gl-shape", mono=True))


def _lines(scene, lines, x, y, size, cls, mono=False, weight="normal") -> int:
    for ln in lines:
        y += int(size * 1.45)
        scene.texts.append(dict(x=x, y=y, text=ln, size=size, anchor="start", weight=weight,
                                cls=cls, mono=mono))
    return y


def place(blocks: list, lang: str = "en", title: str = "") -> Scene:
    """Stack figure models and text boxes vertically into one scene."""
    # widths first: the widest block sets the figure width
    widths = []
    for b in blocks:
        if isinstance(b, FigureModel):
            ws = [_panel_size(p)[0] for p in b.panels]
            widths.append(sum(ws) + PANEL_GAP * (len(ws) - 1))
            widths.append(text_width(b.title, 13))
    width = max([MIN_WIDTH] + [w + 2 * MARGIN for w in widths])
    inner = width - 2 * MARGIN
    label = title or next((b.title for b in blocks if isinstance(b, FigureModel)), "")
    scene = Scene(width=width, height=0, lang=lang, label=label)
    y = MARGIN - 4
    if title:
        y = _lines(scene, wrap(title, inner, 16), MARGIN, y, 16, "gl-title", weight="bold") + 8
    for n, b in enumerate(blocks):
        prefix = f"b{n}-" if len(blocks) > 1 else ""
        if n:
            scene.rects.append(dict(x=MARGIN, y=y + 6, w=inner, h=1, fill="#cccccc", stroke="none",
                                    cls="gl-rule"))
            y += 14
        if isinstance(b, TextBox):
            top = y + 4
            y = _lines(scene, wrap(b.title, inner - 16, 13), MARGIN + 8, top, 13, "gl-box-title",
                       weight="bold")
            y = _lines(scene, wrap(b.body, inner - 16, 12), MARGIN + 8, y + 2, 12, "gl-box-body")
            fill = {"error": "#fdecea", "warn": "#fff4e5", "ok": "#edf7ed"}[b.tone]
            stroke = {"error": "#d62728", "warn": "#ff7f0e", "ok": "#2ca02c"}[b.tone]
            scene.rects.insert(0, dict(x=MARGIN, y=top, w=inner, h=y - top + 10, fill=fill,
                                       stroke=stroke, cls="gl-box"))
            y += 14
            continue
        y = _lines(scene, wrap(b.title, inner, 13), MARGIN, y, 13, "gl-call", mono=True,
                   weight="bold")
        y = _lines(scene, wrap(b.caption, inner, 12), MARGIN, y + 2, 12, "gl-caption")
        y = _lines(scene, wrap(b.legend, inner, 11), MARGIN, y + 2, 11, "gl-legend")
        y += 12
        x = MARGIN
        bottom = y
        for p in b.panels:
            pw, ph, _ = _panel_size(p)
            _place_panel(scene, p, x, y, prefix)
            x += pw + PANEL_GAP
            bottom = max(bottom, y + ph)
        y = bottom + 4
    scene.height = y + MARGIN
    return scene
