"""Pictures of gathers a model runs itself: a mixture of experts' routing, Gemma's scaled rows.

    >>> svg = moe_svg(routing, lang="zh")      # a trace.model_gathers.MoeRouting
    >>> svg = scale_svg(rec, lang="en")        # a trace.model_gathers.ScaleRecord

MoE: left, the router's probability of every expert for every token (shaded), the top-k it picked
outlined with their weights: index = topk(softmax(logits)), a gather of whole expert matrices per token;
right, the same choice read per expert: the tokens each expert gathers into its batch. Hover or tap a
picked cell to light its expert's row. Scale: the first values of each gathered row W[id], the factor,
and what the model's embedding module returned. Drawn from the record only (render's Scene, the scene
template); RoPE's cos/sin rows are a GatherRecord and draw as every gather does.
"""
from __future__ import annotations

from gatherlens.i18n import check_lang, text
from gatherlens.render.scene import Scene
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO, PICKED, fmt_value, palette, short, text_width, weight_colour
from gatherlens.trace.model_gathers import MoeRouting, ScaleRecord

__all__ = ["moe_svg", "scale_svg", "MOE_ROWS"]

MARGIN, ROW_H, GREY = 16, 22, "#555555"
MOE_ROWS = 24        # tokens drawn (the rest are counted under the grid)


def _moe_grid(scene: Scene, r: MoeRouting, lang: str, x0: int, y0: int, cw: int) -> int:
    """Tokens x experts: the router's probabilities, the picked ones outlined (their weight inside)."""
    for e in range(r.experts):
        scene.text(x0 + e * cw + cw // 2, y0 - 6, str(e), 9, fill=GREY, anchor="middle", mono=True)
    rows = min(len(r.labels), MOE_ROWS)
    index, weights, probs = r.index.tolist(), r.weights.tolist(), r.probs.tolist()
    for t in range(rows):
        y = y0 + t * ROW_H
        scene.text(x0 - 6, y + 15, f"{t} {short(r.labels[t], 10)}", 10, anchor="end", mono=True)
        for e in range(r.experts):
            picked = e in index[t]
            w = weights[t][index[t].index(e)] if picked else 0.0
            info = text("moe_cell", lang, t=t, tok=r.labels[t], e=e, p=probs[t][e]) + \
                (" " + text("moe_cell_picked", lang, w=w) if picked else "")
            scene.cell(x0 + e * cw, y, cw - 1, ROW_H - 2, weight_colour(probs[t][e]),
                       fmt_value(round(w, 2)) if picked and cw >= 26 else "", info, f"rt-{t}-{e}", size=9,
                       role="route", src=f"ex-{e}" if picked else "", stroke=PICKED if picked else "#dddddd",
                       sw=2.5 if picked else 1)
    if len(r.labels) > rows:
        scene.text(x0, y0 + rows * ROW_H + 14, text("moe_more", lang, n=len(r.labels) - rows), 10, fill=GREY)
    return y0 + rows * ROW_H + 22


def _moe_experts(scene: Scene, r: MoeRouting, lang: str, x0: int, y0: int) -> int:
    """Per expert: the tokens it gathers (chips in the expert's colour)."""
    fills = palette(r.experts)
    scene.text(x0, y0 - 6, text("moe_per_expert", lang), 11, weight="bold")
    y = y0
    for e, tokens in enumerate(r.per_expert):
        scene.cell(x0, y, 62, ROW_H - 2, fills[e], text("moe_expert", lang, e=e), text("moe_expert_info", lang, e=e,
                   n=len(tokens)), f"ex-{e}", role="expert", size=10)
        x = x0 + 70
        for t in tokens[:MOE_ROWS]:
            label = short(r.labels[t], 8)
            w = text_width(label, 10) + 10
            scene.rect(x, y + 2, w, ROW_H - 6, fills[e])
            scene.text(x + 5, y + 14, label, 10, mono=True)
            x += w + 3
        if len(tokens) > MOE_ROWS:
            scene.text(x + 2, y + 14, f"+{len(tokens) - MOE_ROWS}", 10, fill=GREY)
        y += ROW_H
    return y


def moe_svg(r: MoeRouting, lang: str = "en") -> str:
    """The routing of one MoE layer (see the module doc)."""
    check_lang(lang)
    cw = max(8, min(34, 540 // r.experts))
    left = MARGIN + max(text_width(f"{t} {short(s, 10)}", 10) for t, s in enumerate(r.labels[:MOE_ROWS])) + 10
    title = text("moe_title", lang, layer=r.layer, k=r.top_k, E=r.experts, layers=r.layers)
    scene = Scene(width=0, height=0, lang=lang, label=title)
    scene.text(MARGIN, MARGIN + 8, title, 13, weight="bold", mono=True)
    scene.text(MARGIN, MARGIN + 26, text("moe_axes", lang), 10, fill=GREY)
    y0 = MARGIN + 52
    bottom = _moe_grid(scene, r, lang, left, y0, cw)
    x1 = left + r.experts * cw + 30
    bottom = max(bottom, _moe_experts(scene, r, lang, x1, y0))
    call = "index = softmax(router(x)).topk(k); experts[index[t]] (t = 0 .. T-1)"
    scene.text(MARGIN, bottom + 12, call, 10, fill=GREY, mono=True)
    widest = max([c["x"] + c["w"] for c in scene.cells] + [r_["x"] + r_["w"] for r_ in scene.rects])
    scene.width = max(widest + MARGIN, text_width(title, 13) + 2 * MARGIN, text_width(call, 10) + 2 * MARGIN)
    scene.height = bottom + 26
    return render_template("quantized.svg.j2", s=scene, font=FONTS[lang], mono=MONO, cls="gl-moe")


def scale_svg(rec: ScaleRecord, lang: str = "en") -> str:
    """W[id] -> x scale -> the embedding's output, first columns of each row (see the module doc)."""
    check_lang(lang)
    C, cw = rec.rows.shape[1], 52
    rows = min(len(rec.ids), MOE_ROWS)
    left = MARGIN + max(text_width(f"{i} {short(s, 10)}", 10) for i, s in zip(rec.ids, rec.labels)) + 10
    title = text("scale_title", lang, scale=f"{rec.scale:.6g}", d=rec.d)
    scene = Scene(width=0, height=0, lang=lang, label=title)
    scene.text(MARGIN, MARGIN + 8, title, 13, weight="bold", mono=True)
    x_out, y0 = left + C * cw + 70, MARGIN + 52
    scene.text(left, y0 - 8, "W[ids] · " + text("panel_source", lang), 11, weight="bold")
    scene.text(x_out, y0 - 8, "embed_tokens(ids) · " + text("panel_output", lang), 11, weight="bold")
    palette_rows = palette(rows)
    for s in range(rows):
        y = y0 + s * ROW_H
        scene.text(left - 6, y + 15, f"{rec.ids[s]} {short(rec.labels[s], 10)}", 10, anchor="end", mono=True)
        for c in range(C):
            a, b = float(rec.rows[s, c]), float(rec.out[s, c])
            scene.cell(left + c * cw, y, cw - 2, ROW_H - 2, palette_rows[s], fmt_value(a), f"W[{rec.ids[s]}, {c}] = {a!r}",
                       f"w-{s}-{c}", size=10)
            scene.cell(x_out + c * cw, y, cw - 2, ROW_H - 2, palette_rows[s], fmt_value(b),
                       f"{a!r} × {rec.scale!r} = {b!r}", f"o-{s}-{c}", size=10, src=f"w-{s}-{c}")
        scene.text(left + C * cw + 8, y + 15, f"× {rec.scale:.4g} →", 10, fill=GREY, mono=True)
    bottom = y0 + rows * ROW_H + 16
    verdict = text("scale_equal" if rec.equal else "scale_differs", lang, n=len(rec.ids), d=rec.d)
    scene.text(MARGIN, bottom, verdict, 11, fill=GREY)
    scene.width = max(x_out + C * cw + MARGIN, text_width(title, 13) + 2 * MARGIN, text_width(verdict, 11) + 2 * MARGIN)
    scene.height = bottom + 14
    return render_template("quantized.svg.j2", s=scene, font=FONTS[lang], mono=MONO, cls="gl-scale")
