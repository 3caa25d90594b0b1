"""The model map: embed -> [attention -> MLP] x N -> norm -> head -> next token, each gather on its stage.

    >>> svg = model_map_svg(m, lang="zh")      # m: a gatherlens.trace.model_map.ModelMap

Drawn from the record only. Every gather is a tag under its stage: blue for the model's own (it was
trained with it), orange for gatherlens' change (top-k attention, sparse pages, sparse prefill: not how
the model was trained; they approximate dense attention). A tag is a link to the page element that
draws it (`target`); one with no such element on this page is dashed and says so. The page's script
marks the tag of the section in view (class "gl-here").
"""
from __future__ import annotations

from gatherlens.i18n import check_lang, text
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO, PICKED, text_width
from gatherlens.trace.model_map import ModelMap

__all__ = ["model_map_svg", "OWN", "OURS"]

MARGIN, BOX_H, TAG_H, GAP, ARROW = 16, 44, 24, 6, 26
OWN = ("#dbe8f6", "#1f4e8c")      # fill, stroke: the model's own gather
OURS = ("#fde0c5", "#b35806")     # gatherlens' change


def _layers_text(m: ModelMap, lang: str) -> str:
    """'× 30 layers' or '× 6 layers: 5 sliding 512, 1 global'."""
    local = [(k, w) for k, w in m.kinds if k != "full"]
    if not local:
        return text("map_layers", lang, n=m.layers)
    kind, window = local[0]
    return text("map_layers_mixed", lang, n=m.layers, local=len(local), kind=text(f"layer_{kind}", lang),
                window=window, full=len(m.kinds) - len(local))


def _stages(m: ModelMap, lang: str) -> list[dict]:
    """The stage boxes left to right with their widths (wide enough for their tags)."""
    names = [("embed", "map_embed"), ("attention", "map_attention"),
             ("mlp", "map_mlp_moe" if m.mlp == "moe" else "map_mlp"), ("norm", "map_norm"), ("head", "map_head")]
    out = []
    for stage, key in names:
        tags = [text(f"map_{g.key}", lang) for g in m.at(stage)] if stage != "norm" else []
        w = max([text_width(text(key, lang), 12)] + [text_width(t, 11) for t in tags]) + 20
        out.append(dict(stage=stage, label=text(key, lang), w=w, tags=m.at(stage) if stage != "norm" else ()))
    return out


def _place(m: ModelMap, lang: str) -> tuple[list[dict], list[dict], dict, int, int]:
    """(boxes, tags, the layer block, width, height): x and y of everything."""
    x, y0 = MARGIN + text_width(text("map_ids", lang), 12) + ARROW + 8, MARGIN + 34
    boxes, tags = [], []
    for s in _stages(m, lang):
        boxes.append(dict(x=x, y=y0, w=s["w"], h=BOX_H, label=s["label"], stage=s["stage"]))
        for i, g in enumerate(s["tags"]):
            fill, stroke = OURS if g.ours else OWN
            label = text(f"map_{g.key}", lang) + ("" if g.target else " " + text("map_off", lang))
            tags.append(dict(x=x, y=y0 + BOX_H + 10 + i * (TAG_H + GAP), w=max(s["w"], text_width(label, 11) + 14),
                             h=TAG_H, label=label, target=g.target, key=g.key, ours=g.ours, fill=fill,
                             stroke=stroke, stage=g.stage))
        x += s["w"] + ARROW
    attn, mlp = boxes[1], boxes[2]
    block = dict(x=attn["x"] - 8, y=y0 - 22, w=mlp["x"] + mlp["w"] - attn["x"] + 16, h=BOX_H + 30,
                 label=_layers_text(m, lang))
    bottom = max([t["y"] + TAG_H for t in tags] + [y0 + BOX_H])
    width = max(x + text_width(text("map_next_token", lang), 12) + MARGIN,
                max(t["x"] + t["w"] for t in tags) + MARGIN)
    return boxes, tags, block, width, bottom


def model_map_svg(m: ModelMap, lang: str = "en") -> str:
    """The map of `m` as one SVG (see the module doc)."""
    check_lang(lang)
    boxes, tags, block, width, bottom = _place(m, lang)
    legend_y = bottom + 26
    legend = [dict(x=MARGIN, fill=OWN[0], stroke=OWN[1], text=text("map_own", lang))]
    legend.append(dict(x=MARGIN + 24 + text_width(legend[0]["text"], 11) + 20, fill=OURS[0], stroke=OURS[1],
                       text=text("map_ours", lang)))
    width = max(width, legend[1]["x"] + 24 + text_width(legend[1]["text"], 11) + MARGIN)
    arrows = [dict(x1=a["x"] + a["w"], x2=b["x"], y=a["y"] + BOX_H // 2) for a, b in zip(boxes, boxes[1:])]
    last = boxes[-1]
    return render_template(
        "model_map.svg.j2", width=width, height=legend_y + 14, font=FONTS[lang], mono=MONO, margin=MARGIN,
        title=text("map_title", lang, model=m.model), boxes=boxes, tags=tags, block=block, arrows=arrows,
        ids=dict(x=MARGIN, y=boxes[0]["y"] + BOX_H // 2 + 4, text=text("map_ids", lang),
                 x2=boxes[0]["x"]), next=dict(x=last["x"] + last["w"] + 6, y=last["y"] + BOX_H // 2 + 4,
                                                 text=text("map_next_token", lang)),
        loop=m.causal, legend=legend, legend_y=legend_y, here=PICKED, box_h=BOX_H)
