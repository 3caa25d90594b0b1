"""The `explain` report's two pictures that are not gather records: the score grid, the head groups.

    >>> svg = scores_svg(grid, lang="zh")              # the (Q, L) score grid, top-k outlined
    >>> svg = heads_svg(HeadMap(9, 3), head=0)         # which query heads share a KV head

Drawn from the plain records of gatherlens.trace.story_records only (a ScoreGrid, built by
gatherlens.report.records from the story; a HeadMap), every word in the chosen language from
gatherlens.i18n. Geometry is computed here in integers (same data, same bytes); the templates
(templates.py) only place it, with autoescaping on, so a token such as `<script>` is drawn as text.
"""
from __future__ import annotations

from dataclasses import dataclass

from gatherlens.i18n import check_lang, text
from gatherlens.render.templates import render_template
from gatherlens.render.theme import (BAND, FONTS, MASKED, MONO, OUTSIDE, PICKED, fmt_value, palette, short,
                                     text_width, weight_colour)
from gatherlens.trace.story_records import HeadMap, ScoreGrid

__all__ = ["scores_svg", "heads_svg", "layer_kind_text"]

MARGIN = 16


@dataclass
class _Grid:
    """Where the score grid sits: cell size, label size and angle, the grid's top-left corner."""

    cw: int
    ch: int
    font: int           # label size
    angle: int          # -45, or -90 (upright) for narrow columns
    x0: int
    y0: int
    numbers: bool       # cells wide enough to print their score


def _grid(qlab: list[str], klab: list[str], L: int) -> _Grid:
    cw = 44 if L <= 16 else max(12, min(44, 720 // L))
    ch = max(cw * 2 // 3, 12) if cw < 44 else 28
    if cw < 24:
        ch = cw
    font = 11 if ch >= 14 else 9
    angle = -45 if cw >= 24 else -90
    left = max(text_width(s, font) for s in qlab) + 28
    widest = max(text_width(s, font) for s in klab)
    top_h = (widest * 71 // 100 if angle == -45 else widest) + 24
    return _Grid(cw=cw, ch=ch, font=font, angle=angle, x0=MARGIN + left, y0=MARGIN + 24 + top_h,
                 numbers=cw >= 34)


def _cell_info(q: int, qt: str, j: int, kt: str, s: float, w: float, ok: bool, kept: bool,
               lang: str) -> str:
    """A cell's hover text: which query and key, the score and dense weight, whether kept."""
    if not ok:
        return text("fig_cell_masked", lang, q=q, qt=qt, j=j, kt=kt)
    info = text("ex_scores_info", lang, q=q, qt=qt, j=j, kt=kt, s=f"{s:.3f}", w=f"{w:.3f}")
    return info + (" " + text("ex_kept", lang) if kept else "")


def _score_cells(grid: ScoreGrid, g: _Grid, queries: list[str], keys: list[str], qoff: int,
                 lang: str) -> list[dict]:
    """One cell per (query, key): its score, dense weight as colour, and whether top-k kept it; a cell
    a local layer's window hides (an earlier key, not allowed) gets OUTSIDE, a later key MASKED."""
    Q, L = grid.scores.shape
    picked = {(i, j - grid.col0) for i in range(Q) for j in grid.indices[i].tolist() if j >= 0}
    cells = []
    for i in range(Q):
        q = qoff + grid.row0 + i                                       # the query's position
        for j in range(L):
            ok = bool(grid.allowed[i, j])
            w = float(grid.dense[i, j]) if ok else 0.0
            s = float(grid.scores[i, j])
            kept = (i, j) in picked
            before = grid.col0 + j + (len(grid.labels) - (grid.keys or L)) <= q
            cells.append(dict(
                x=g.x0 + j * g.cw, y=g.y0 + i * g.ch, w=g.cw, h=g.ch,
                fill=weight_colour(w) if ok else (OUTSIDE if before and grid.window else MASKED),
                text=fmt_value(s) if (g.numbers and ok) else "", light=w > 0.45, picked=kept,
                info=_cell_info(q, queries[i], grid.col0 + j, keys[j], s, w, ok, kept, lang)))
    return cells


def _band(grid: ScoreGrid, g: _Grid) -> str:
    """The window's edge on a local layer: a step line left of each row's first allowed key ("" else)."""
    if not grid.window:
        return ""
    points = []
    for i, row in enumerate(grid.allowed.tolist()):
        if not any(row) or row[0]:                                     # nothing hidden on this row's left
            continue
        x = g.x0 + row.index(True) * g.cw
        points += [f"M{x},{g.y0 + i * g.ch}", f"V{g.y0 + (i + 1) * g.ch}"]
    return " ".join(points)


def _labels(grid: ScoreGrid) -> tuple[list[str], list[str], int]:
    """(query labels, key labels, qoff) of the grid's rows and columns (numbers when labels are short)."""
    Q, L = grid.scores.shape
    Qf, Lf = grid.queries or Q, grid.keys or L
    labels = list(grid.labels)
    keys = labels[-Lf:] if len(labels) >= Lf else [str(j) for j in range(Lf)]
    queries = labels[-Qf:] if len(labels) >= Qf else [str(i) for i in range(Qf)]
    qoff = len(labels) - Qf if len(labels) >= Qf else 0
    return queries[grid.row0:grid.row0 + Q], keys[grid.col0:grid.col0 + L], qoff


def scores_svg(grid: ScoreGrid, lang: str = "en") -> str:
    """The (Q, L) score grid of one head: numbers, dense weight as colour, top-k outlined; a local
    layer's window edge drawn as a step line, the keys it hides shaded OUTSIDE."""
    check_lang(lang)
    Q, L = grid.scores.shape
    queries, keys, qoff = _labels(grid)
    qlab = [f"{qoff + grid.row0 + i} {short(t, 12)}" for i, t in enumerate(queries)]
    klab = [f"{grid.col0 + j} {short(t, 12)}" for j, t in enumerate(keys)]
    g = _grid(qlab, klab, L)
    title = text("ex_scores_title", lang, layer=grid.layer, head=grid.head, k=grid.top_k) + _kind_suffix(grid, lang)
    legend = text("scores_legend", lang, k=grid.top_k)
    if grid.window:
        legend += " " + text("scores_window_legend", lang, window=grid.window, kind=text(f"layer_{grid.kind}", lang))
    qrow = grid.query - qoff - grid.row0
    mid = g.ch // 2 + g.font // 3                                    # a row label's baseline
    rows = [dict(x=g.x0 - 6, y=g.y0 + i * g.ch + mid, text=qlab[i], bold=(i == qrow))
            for i in range(Q)]
    cols = [dict(x=g.x0 + j * g.cw + g.cw // 2 + (0 if g.angle == -45 else g.font // 3),
                 y=g.y0 - 6, text=klab[j]) for j in range(L)]
    marker = dict(x=MARGIN, y=g.y0 + qrow * g.ch + mid) if 0 <= qrow < Q else None
    width = max(g.x0 + L * g.cw + MARGIN, text_width(title, 13) + 2 * MARGIN,
                text_width(legend, 11) + 2 * MARGIN)
    return render_template(
        "scores.svg.j2", width=width, height=g.y0 + Q * g.ch + 44, title=title, font=FONTS[lang],
        mono=MONO, cells=_score_cells(grid, g, queries, keys, qoff, lang), rows=rows, cols=cols,
        legend=legend, axes=text("scores_axes", lang), legend_y=g.y0 + Q * g.ch + 22,
        margin=MARGIN, numbers=g.numbers, picked_colour=PICKED, label_size=g.font, angle=g.angle,
        marker=marker, x0=g.x0, y0=g.y0, grid_w=L * g.cw, grid_h=Q * g.ch, band=_band(grid, g), band_colour=BAND,
    )


def _kind_suffix(grid: ScoreGrid, lang: str) -> str:
    """' · sliding 8' for a local layer, ' · global' for a global one: every grid says how its layer attends."""
    return " · " + layer_kind_text(grid.kind, grid.window, lang)


def layer_kind_text(kind: str, window: int | None, lang: str) -> str:
    """'global', 'sliding 512', 'chunked 8192' in `lang`: how a layer attends (one wording everywhere)."""
    name = text(f"layer_{kind}", lang)
    return name if window is None else text("layer_window", lang, kind=name, window=window)


def heads_svg(heads: HeadMap, head: int = 0, lang: str = "en") -> str:
    """Query heads (top) joined to the key/value head they read (bottom), one colour per group."""
    box_w, box_h, gap = 44, 26, 10
    label_w = max(text_width(text(key, lang), 11) for key in ("heads_q", "heads_kv")) + 16
    Hq, Hkv, g = heads.q_heads, heads.kv_heads, heads.group
    x0 = MARGIN + label_w
    qy, kvy = MARGIN + 8, MARGIN + 8 + box_h + 70
    fills = palette(Hkv)                                             # one colour per KV group, never repeated
    qboxes = [dict(x=x0 + h * (box_w + gap), y=qy, w=box_w, h=box_h, text=f"q{h}",
                   fill=fills[h // g], chosen=h == head) for h in range(Hq)]
    kvboxes, links = [], []
    for k in range(Hkv):
        members = qboxes[k * g:(k + 1) * g]
        cx = (members[0]["x"] + members[-1]["x"] + box_w) // 2
        kvboxes.append(dict(x=cx - box_w // 2, y=kvy, w=box_w, h=box_h, text=f"kv{k}",
                            fill=fills[k], chosen=k == heads.kv_of(head)))
        for m, q in zip(range(k * g, (k + 1) * g), members):
            links.append(dict(x1=q["x"] + box_w // 2, y1=qy + box_h, x2=cx, y2=kvy,
                              chosen=m == head))
    return render_template(
        "heads.svg.j2", width=x0 + Hq * box_w + (Hq - 1) * gap + MARGIN,
        height=kvy + box_h + MARGIN, font=FONTS[lang], mono=MONO, qboxes=qboxes, kvboxes=kvboxes,
        links=links,
        qlabel=dict(x=MARGIN, y=qy + box_h // 2 + 4, text=text("heads_q", lang)),
        kvlabel=dict(x=MARGIN, y=kvy + box_h // 2 + 4, text=text("heads_kv", lang)),
        title=text("fig_heads_title", lang, q=Hq, kv=Hkv),
    )
