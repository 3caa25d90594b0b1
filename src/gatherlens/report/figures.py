"""The two pictures selection records do not cover, drawn from plain data with jinja2 SVG.

    >>> svg = scores_svg(view, labels, lang="en")     # the (Q, L) score grid, top-k outlined
    >>> svg = heads_svg(HeadMap(9, 3), head=0)         # which query heads share a KV head

Geometry is computed here in integers (same data, same bytes); the templates only place it,
with autoescaping on, so a token such as `<script>` is drawn as text.
"""
from __future__ import annotations

from functools import lru_cache

import jinja2

from gatherlens.render.layout import PALETTE, fmt_value, short
from gatherlens.render.scene import FONTS, MONO, text_width
from gatherlens.report.text import say

__all__ = ["scores_svg", "heads_svg", "environment"]

MASKED = "#e4e4e4"
PICKED = "#d62728"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("gatherlens.report", "templates"),
        autoescape=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
    )


def _blue(w: float) -> str:
    """Weight in [0, 1] -> white .. dark blue."""
    w = min(max(w, 0.0), 1.0) ** 0.6
    lo, hi = (255, 255, 255), (33, 84, 160)
    r, g, b = (round(a + (c - a) * w) for a, c in zip(lo, hi))
    return f"#{r:02x}{g:02x}{b:02x}"


def scores_svg(view, labels: list[str], lang: str = "en") -> str:
    """The (Q, L) score grid of one head: numbers, dense weight as colour, top-k outlined."""
    scores, dense, allowed, idx = view.scores, view.dense, view.allowed, view.indices
    Q, L = scores.shape
    keys = labels[-L:] if len(labels) >= L else [str(j) for j in range(L)]
    queries = labels[-Q:] if len(labels) >= Q else [str(i) for i in range(Q)]
    qoff = len(labels) - Q if len(labels) >= Q else 0
    cw = 44 if L <= 16 else max(12, min(44, 720 // L))
    ch = max(cw * 2 // 3, 12) if cw < 44 else 28
    if cw < 24:
        ch = cw
    numbers = cw >= 34
    qlab = [f"{qoff + i} {short(t, 12)}" for i, t in enumerate(queries)]
    klab = [f"{j} {short(t, 12)}" for j, t in enumerate(keys)]
    font = 11 if ch >= 14 else 9                                     # label size
    angle = -45 if cw >= 24 else -90                                  # narrow columns: upright
    left = max(text_width(s, font) for s in qlab) + 28
    widest = max(text_width(s, font) for s in klab)
    top_h = (widest * 71 // 100 if angle == -45 else widest) + 24
    margin = 16
    title = f"scores · layer {view.layer}, head {view.head} · top-{view.top_k}"
    x0, y0 = margin + left, margin + 24 + top_h
    picked = set()
    for i in range(Q):
        for j in idx[i].tolist():
            if j >= 0:
                picked.add((i, j))
    cells = []
    for i in range(Q):
        for j in range(L):
            ok = bool(allowed[i, j])
            w = float(dense[i, j]) if ok else 0.0
            s = float(scores[i, j])
            cells.append(dict(
                x=x0 + j * cw, y=y0 + i * ch, w=cw, h=ch,
                fill=_blue(w) if ok else MASKED,
                text=fmt_value(s) if (numbers and ok) else "",
                light=w > 0.45, picked=(i, j) in picked,
                info=f"query {qoff + i} {queries[i]!s} → key {j} {keys[j]!s}: "
                     + (f"score {s:.3f}, dense weight {w:.3f}" + (" (kept)" if (i, j) in picked else "")
                        if ok else "not allowed"),
            ))
    qrow = view.query - qoff
    rows = [dict(x=x0 - 6, y=y0 + i * ch + ch // 2 + font // 3, text=qlab[i], bold=(i == qrow))
            for i in range(Q)]
    cols = [dict(x=x0 + j * cw + cw // 2 + (0 if angle == -45 else font // 3), y=y0 - 6,
                 text=klab[j]) for j in range(L)]
    width = max(x0 + L * cw + margin, text_width(title, 13) + 2 * margin,
                text_width(say("scores_legend", lang, k=view.top_k), 11) + 2 * margin)
    height = y0 + Q * ch + 44
    marker = None
    if 0 <= qrow < Q:
        marker = dict(x=margin, y=y0 + qrow * ch + ch // 2 + font // 3)
    return environment().get_template("scores.svg.j2").render(
        width=width, height=height, title=title, font=FONTS[lang], mono=MONO, cells=cells,
        rows=rows, cols=cols, legend=say("scores_legend", lang, k=view.top_k),
        axes=say("scores_axes", lang), legend_y=y0 + Q * ch + 22, margin=margin,
        numbers=numbers, picked_colour=PICKED, label_size=font, angle=angle, marker=marker, x0=x0, y0=y0, grid_w=L * cw,
        grid_h=Q * ch,
    )


def heads_svg(heads, head: int = 0, lang: str = "en") -> str:
    """Query heads (top) joined to the key/value head they read (bottom), one colour per group."""
    box_w, box_h, gap = 44, 26, 10
    margin, label_w = 16, max(text_width(say("heads_q", lang), 11),
                              text_width(say("heads_kv", lang), 11)) + 16
    Hq, Hkv, g = heads.q_heads, heads.kv_heads, heads.group
    row_w = Hq * box_w + (Hq - 1) * gap
    x0 = margin + label_w
    qy, kvy = margin + 8, margin + 8 + box_h + 70
    qboxes = []
    for h in range(Hq):
        qboxes.append(dict(x=x0 + h * (box_w + gap), y=qy, w=box_w, h=box_h, text=f"q{h}",
                           fill=PALETTE[(h // g) % len(PALETTE)], chosen=h == head))
    kvboxes, links = [], []
    for k in range(Hkv):
        members = qboxes[k * g:(k + 1) * g]
        cx = (members[0]["x"] + members[-1]["x"] + box_w) // 2
        kvboxes.append(dict(x=cx - box_w // 2, y=kvy, w=box_w, h=box_h, text=f"kv{k}",
                            fill=PALETTE[k % len(PALETTE)], chosen=k == heads.kv_of(head)))
        for m, q in zip(range(k * g, (k + 1) * g), members):
            links.append(dict(x1=q["x"] + box_w // 2, y1=qy + box_h, x2=cx, y2=kvy,
                              chosen=m == head))
    width = x0 + row_w + margin
    height = kvy + box_h + margin
    return environment().get_template("heads.svg.j2").render(
        width=width, height=height, font=FONTS[lang], mono=MONO, qboxes=qboxes, kvboxes=kvboxes,
        links=links, qlabel=dict(x=margin, y=qy + box_h // 2 + 4, text=say("heads_q", lang)),
        kvlabel=dict(x=margin, y=kvy + box_h // 2 + 4, text=say("heads_kv", lang)),
        title=f"{Hq} query heads → {Hkv} key/value heads",
    )
