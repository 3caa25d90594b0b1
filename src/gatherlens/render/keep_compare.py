"""Dense, top-k and sparse side by side for one query: which keys each keeps, and how far off it is.

    >>> svg = keep_comparison_svg(rec, lang="zh")     # rec: a gatherlens.trace.KeepComparison

Three strips over the same L keys (position 0 at the left): dense attention keeps every key,
shaded by its weight; top-k keeps its k keys (outlined; the rest grey); sparse decoding keeps the
keys of the pages it chose (each page outlined). A strip's shade is the dense weight it keeps,
so what a strip loses is what is grey. On a local layer (sliding or chunked) the sparse strip is its ring:
the window it keeps and reads whole, choosing no pages. Past STRIP_CELLS keys, each cell sums the weight of
ceil(L / STRIP_CELLS) neighbouring keys (its title says so). Below: the share of the dense weight
each keeps and the relative L2 error of its output against dense. Drawn from the record only.
"""
from __future__ import annotations

from gatherlens.i18n import check_lang, text
from gatherlens.ops.sparse.geometry import ceil_div
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO, PICKED, UNPICKED, short, text_width, weight_colour
from gatherlens.trace.keep_records import KeepComparison

__all__ = ["keep_comparison_svg", "STRIP_CELLS"]

MARGIN, STRIP_W, STRIP_H, GAP = 16, 760, 26, 16
STRIP_CELLS = 380   # cells per strip at most (2 px each); more keys share a cell


def _cells(weights: list[float], kept: set[int], per: int, x0: int, cw: float) -> list[dict]:
    """One rect per cell of `per` keys: the dense weight of its kept keys, grey when it keeps none."""
    out = []
    for c in range(ceil_div(len(weights), per)):
        keys = range(c * per, min((c + 1) * per, len(weights)))
        mine = [j for j in keys if j in kept]
        w = sum(weights[j] for j in mine)
        out.append(dict(x=round(x0 + c * cw, 2), w=round(cw + 0.05, 2),
                        fill=weight_colour(min(1.0, w)) if mine else UNPICKED))
    return out


def _marks(spans: list[tuple[int, int]], per: int, x0: int, cw: float) -> list[dict]:
    """Outlines of key spans [a, b) (a top-k key, a page), at least 3 px wide."""
    return [dict(x=round(x0 + a / per * cw, 2), w=round(max(3.0, (b - a) / per * cw), 2)) for a, b in spans]


def _strips(rec: KeepComparison, lang: str, x0: int, top: int) -> list[dict]:
    L, P = rec.length, rec.page_size
    per = ceil_div(L, STRIP_CELLS)
    cw = STRIP_W / ceil_div(L, per)
    w = rec.dense.tolist()
    allowed = {j for j in range(L) if w[j] > 0}
    pages = [(p * P, min((p + 1) * P, rec.seen or L)) for p in rec.pages]
    sparse = text("kc_sparse_label", lang, n=len(rec.pages))
    if rec.ring is not None:                 # a local layer: its ring, read densely (no page choice)
        pages, sparse = [rec.ring], text("kc_ring_label", lang, n=rec.ring[1] - rec.ring[0])
    rows = [("dense", text("kc_dense_label", lang, n=len(allowed)), allowed, []),
            ("topk", text("kc_topk_label", lang, k=len(rec.topk)), set(rec.topk), [(j, j + 1) for j in rec.topk]),
            ("sparse", sparse, set(rec.sparse_tokens), pages)]
    info = text("kc_cells", lang, per=per) if per > 1 else ""
    return [dict(kind=kind, label=label, y=top + i * (STRIP_H + GAP), h=STRIP_H, info=info,
                 cells=_cells(w, kept, per, x0, cw), marks=_marks(spans, per, x0, cw))
            for i, (kind, label, kept, spans) in enumerate(rows)]


def _lines(rec: KeepComparison, lang: str) -> list[str]:
    keys = ", ".join(f"{j} {short(rec.labels[j], 10)}" if rec.labels else str(j) for j in rec.topk[:8])
    top = text("kc_topk_line", lang, k=len(rec.topk), mass=rec.topk_mass, err=rec.topk_error, keys=keys)
    if rec.ring is not None:
        return [top, text("kc_ring_line", lang, kind=text(f"layer_{rec.kind}", lang), window=rec.window,
                          a=rec.ring[0], b=rec.ring[1] - 1, tokens=rec.ring[1] - rec.ring[0])]
    return [top, text("kc_sparse_line", lang, n=len(rec.pages), P=rec.page_size, tokens=len(rec.sparse_tokens),
                 budget=rec.budget, mass=rec.sparse_mass, err=rec.sparse_error)]


def keep_comparison_svg(rec: KeepComparison, lang: str = "en") -> str:
    """The figure of one KeepComparison (see the module doc)."""
    check_lang(lang)
    title = text("kc_title", lang, layer=rec.layer, head=rec.head, q=rec.query, tok=short(rec.query_token, 14))
    label_w = max(text_width(text(k, lang, n=9999, k=9999), 11)
                  for k in ("kc_dense_label", "kc_topk_label", "kc_sparse_label", "kc_ring_label")) + 12
    x0, top = MARGIN + label_w, MARGIN + 30
    strips = _strips(rec, lang, x0, top)
    ticks_y = top + 3 * (STRIP_H + GAP) + 2
    L = rec.length
    ticks = [dict(x=round(x0 + (j + 0.5) / L * STRIP_W, 1), text=str(j))
             for j in sorted({0, L // 4, L // 2, 3 * L // 4, L - 1})]
    lines = _lines(rec, lang)
    width = max(x0 + STRIP_W + MARGIN, text_width(title, 13) + 2 * MARGIN,
                max(text_width(s, 11) for s in lines) + 2 * MARGIN)
    return render_template("keep_compare.svg.j2", width=width, height=ticks_y + 22 + 16 * len(lines) + 8,
                           title=title, strips=strips, ticks=ticks, ticks_y=ticks_y, lines=lines,
                           lines_y=ticks_y + 22, x0=x0, strip_w=STRIP_W, margin=MARGIN, picked=PICKED,
                           font=FONTS[lang], mono=MONO)
