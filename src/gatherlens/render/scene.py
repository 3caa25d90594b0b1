"""Geometry: figure models (and text boxes) -> positioned rectangles, cells and text.

    >>> scene = place([layout(rec)])
    >>> scene.width, scene.height, len(scene.cells)

Every coordinate is an integer, so the SVG drawn from a scene is byte-for-byte deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gatherlens.render.layout import FigureModel, Panel
from gatherlens.render.theme import TONES, text_width, wrap

CELL_W, CELL_H, CELL_H2 = 46, 24, 32
GAP = 14           # width / height of an elided column / row ("...")
PANEL_GAP = 40
MARGIN = 16
HEAD_H = 14        # column-heading row
MIN_WIDTH = 560


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

    def text(self, x: int, y: int, s: str, size: int = 11, *, fill: str = "#1a1a1a", weight: str = "normal",
             mono: bool = False, anchor: str = "start") -> None:
        """A line of text at (x, y) (its baseline)."""
        self.texts.append(dict(x=x, y=y, text=s, size=size, fill=fill, weight=weight, mono=mono, anchor=anchor))

    def rect(self, x: int, y: int, w: int, h: int, fill: str, stroke: str = "none", sw: float = 0,
             info: str = "") -> None:
        """A plain rectangle (a title when `info`)."""
        self.rects.append(dict(x=x, y=y, w=w, h=h, fill=fill, stroke=stroke, sw=sw, rx=1, info=info))

    def cell(self, x: int, y: int, w: int, h: int, fill: str, label: str, info: str, key: str, sub: str = "",
             role: str = "code", size: int = 11, mono: bool = False, src: str = "", stroke: str = "#9a9a9a",
             sw: float = 1) -> None:
        """A cell with its text (and a second, smaller line `sub`); hovering or tapping it shows `info` and
        lights the cell keyed `src` (the fragment script)."""
        ty = y + (h // 2 + 4 if not sub else h // 2 - 2)
        self.cells.append(dict(x=x, y=y, w=w, h=h, fill=fill, text=label, sub=sub, info=info, key=key, role=role,
                               tx=x + w // 2, ty=ty, sy=ty + 12, size=size, mono=mono, src=src, stroke=stroke, sw=sw))


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


def _text(scene: Scene, x: int, y: int, text: str, size: int, cls: str, anchor: str = "start",
          weight: str = "normal", mono: bool = False) -> None:
    scene.texts.append(dict(x=x, y=y, text=text, size=size, anchor=anchor, weight=weight,
                            cls=cls, mono=mono))


def _place_panel(scene: Scene, p: Panel, x: int, y: int, prefix: str) -> None:
    """One panel with its top-left corner at (x, y): title, slices, '… n more', shape caption."""
    _, _, head_w = _panel_size(p)
    _text(scene, x, y + 12, p.title, 12, "gl-panel-title", weight="bold")
    cy = y + 20
    for sl in p.slices:
        if sl is None:
            _text(scene, x + head_w + 4, cy + 11, "⋮", 12, "gl-gap")
            cy += GAP
            continue
        if sl.label:
            _text(scene, x, cy + 12, sl.label, 11, "gl-slice", mono=True)
            cy += 16
        _place_col_heads(scene, sl, x + head_w, cy)
        cy = _place_rows(scene, p, sl, x, cy + HEAD_H, head_w, prefix) + 6
    if p.more:
        _text(scene, x, cy + 12, p.more, 11, "gl-gap")
        cy += 16
    _text(scene, x, cy + 13, p.shape, 11, "gl-shape", mono=True)


def _place_col_heads(scene: Scene, sl, x: int, y: int) -> None:
    for c, head in zip(sl.cols, sl.col_heads):
        cw = GAP if c is None else CELL_W
        if c is None:
            _text(scene, x + cw // 2, y + 11, "…", 10, "gl-gap", anchor="middle")
        elif head:
            _text(scene, x + cw // 2, y + 11, head, 10, "gl-head", anchor="middle")
        x += cw


def _place_rows(scene: Scene, p: Panel, sl, x: int, y: int, head_w: int, prefix: str) -> int:
    """Row headings and cells of one slice from `y` down; returns the y below its last row."""
    ch = CELL_H2 if p.two_line else CELL_H
    for r, rhead in zip(sl.rows, sl.row_heads):
        if r is None:
            _text(scene, x + head_w + CELL_W // 2, y + 11, "⋮", 11, "gl-gap", anchor="middle")
            y += GAP
            continue
        if rhead:
            _text(scene, x + head_w - 6, y + ch // 2 + 4, rhead, 11, "gl-head", anchor="end")
        cx = x + head_w
        for c in sl.cols:
            if c is None:
                _text(scene, cx + GAP // 2, y + ch // 2 + 4, "…", 10, "gl-gap", anchor="middle")
                cx += GAP
                continue
            scene.cells.append(_cell(p, sl.cells[(r, c)], cx, y, ch, prefix))
            cx += CELL_W
        y += ch
    return y


def _cell(p: Panel, cell, x: int, y: int, h: int, prefix: str) -> dict:
    return dict(role=p.role, key=f"{prefix}{cell.key}", x=x, y=y, w=CELL_W, h=h, fill=cell.fill,
                text=cell.text, sub=cell.sub, picked=cell.picked, info=cell.info,
                data_src=f"{prefix}{cell.data_src}" if cell.data_src else "",
                data_idx=f"{prefix}{cell.data_idx}" if cell.data_idx else "",
                tx=x + CELL_W // 2, ty=y + (13 if p.two_line else 16), sy=y + 26)


def _lines(scene, lines, x, y, size, cls, mono=False, weight="normal") -> int:
    for ln in lines:
        y += int(size * 1.45)
        _text(scene, x, y, ln, size, cls, weight=weight, mono=mono)
    return y


def _place_box(scene: Scene, b: TextBox, y: int, inner: int, prefix: str) -> int:
    """A text box (title, body) on a tinted rectangle from `y` down; returns the y below it."""
    top = y + 4
    y = _lines(scene, wrap(b.title, inner - 16, 13), MARGIN + 8, top, 13, "gl-box-title",
               weight="bold")
    y = _lines(scene, wrap(b.body, inner - 16, 12), MARGIN + 8, y + 2, 12, "gl-box-body")
    fill, stroke = TONES[b.tone]
    scene.rects.insert(0, dict(x=MARGIN, y=top, w=inner, h=y - top + 10, fill=fill,
                               stroke=stroke, cls="gl-box"))
    return y + 14


def _place_figure(scene: Scene, b: FigureModel, y: int, inner: int, prefix: str) -> int:
    """A figure (call, caption, legend, panels side by side) from `y` down; returns the y below."""
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
    return bottom + 4


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
        y = (_place_box if isinstance(b, TextBox) else _place_figure)(scene, b, y, inner, prefix)
    scene.height = y + MARGIN
    return scene
