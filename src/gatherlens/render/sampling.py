"""The sampling gather: logits -> temperature -> the top-k / top-p / min-p cuts -> renormalized -> the draw.

    >>> svg = sampling_svg(rec, words, lang="zh")     # rec: ops/sampling's SampleRecord; words: {id: text}

One row per candidate the picture lists (the best logits, and the chosen token if it is not among
them), best first. Columns: the logit; its probability at the temperature over the whole vocabulary;
one column per cut that ran (kept, or cut); the renormalized probability over what the last cut kept;
the cumulative probability the uniform draw walks (the first row past u is the token). The chosen row
is outlined; under the table, its id gathers the next step's embedding row. Drawn from the record only.
"""
from __future__ import annotations

import math

from gatherlens.i18n import check_lang, text
from gatherlens.render.scene import Scene
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO, PICKED, UNPICKED, fmt_value, short, text_width, weight_colour

__all__ = ["sampling_svg"]

MARGIN, ROW_H, CW, LABEL_W, GREY = 16, 22, 64, 150, "#555555"


def _tempered(rec) -> list[float]:
    """softmax(logits / T) over the whole vocabulary (T = 1 when greedy), as floats per id."""
    t = rec.temperature or 1.0
    top = max(float(x) for x in rec.logits.tolist() if math.isfinite(x))
    ex = [math.exp((float(x) - top) / t) if math.isfinite(x) else 0.0 for x in rec.logits.tolist()]
    total = sum(ex)
    return [e / total for e in ex]


def _columns(rec, lang: str) -> list[tuple[str, str]]:
    """(key, header) of each column left to right: logit, p at T, each cut, renormalized, cumulative."""
    cols = [("logit", text("smp_logit", lang)),
            ("pt", text("smp_pt", lang, t=f"{rec.temperature:g}" if rec.temperature else "1"))]
    cols += [(c.stage, text("smp_cut", lang, stage=c.stage.replace("_", "-"), n=c.ids.numel())) for c in rec.cuts]
    return cols + [("p", text("smp_p", lang, n=rec.kept.numel())), ("cum", text("smp_cum", lang))]


def _row(scene: Scene, rec, i: int, y: int, x0: int, cols, probs: list[float], kept: dict, cum: dict, lang: str):
    for c, (key, _) in enumerate(cols):
        x, info = x0 + c * CW, f"{key}: {i}"
        if key == "logit":
            scene.cell(x, y, CW - 2, ROW_H - 2, "#ffffff", f"{float(rec.logits[i]):.2f}", info, f"lg-{i}", size=10)
        elif key == "pt":
            scene.cell(x, y, CW - 2, ROW_H - 2, weight_colour(probs[i]), fmt_value(probs[i]), info, f"pt-{i}", size=10)
        elif key in ("p", "cum"):
            v = kept.get(i) if key == "p" else cum.get(i)
            scene.cell(x, y, CW - 2, ROW_H - 2, weight_colour(v) if v is not None else UNPICKED,
                       "" if v is None else f"{v:.3f}", info, f"{key}-{i}", size=10)
        else:
            on = i in set(rec.cut(key).ids.tolist())
            scene.cell(x, y, CW - 2, ROW_H - 2, "#dbe8f6" if on else UNPICKED, "✓" if on else "✕",
                       text("smp_kept" if on else "smp_dropped", lang, stage=key.replace("_", "-")), f"{key}-{i}",
                       size=11)


def sampling_svg(rec, words: dict, lang: str = "en", shown: list[int] | None = None) -> str:
    """The picture of one SampleRecord (see the module doc); `shown`: the ids to list (default: words' keys)."""
    check_lang(lang)
    ids = sorted(shown or list(words), key=lambda i: (-float(rec.logits[i]), i))
    probs, cols = _tempered(rec), _columns(rec, lang)
    kept = {i: float(p) for i, p in zip(rec.kept.tolist(), rec.probs.tolist())}
    cum, acc = {}, 0.0
    for i, p in zip(rec.kept.tolist(), rec.probs.tolist()):
        acc += float(p)
        cum[i] = acc
    title = text("smp_title", lang, V=rec.vocab_size, t=f"{rec.temperature:g}", n=rec.kept.numel())
    scene = Scene(width=0, height=0, lang=lang, label=title)
    scene.text(MARGIN, MARGIN + 8, title, 13, weight="bold", mono=True)
    x0, y0 = MARGIN + LABEL_W, MARGIN + 56
    for c, (_, head) in enumerate(cols):
        scene.text(x0 + c * CW + CW // 2, y0 - 8, head, 10, fill=GREY, anchor="middle")
    for r, i in enumerate(ids):
        y = y0 + r * ROW_H
        scene.text(x0 - 8, y + 15, f"{i} {short(words.get(i, str(i)), 14)}", 11, anchor="end", mono=True,
                   weight="bold" if i == rec.token else "normal")
        _row(scene, rec, i, y, x0, cols, probs, kept, cum, lang)
        if i == rec.token:
            scene.rect(x0 - LABEL_W + 4, y - 1, LABEL_W - 4 + len(cols) * CW, ROW_H, "none", PICKED, 2.5)
    bottom = y0 + len(ids) * ROW_H + 18
    lines = [text("smp_draw", lang, u=f"{rec.uniform:.4f}", id=rec.token, tok=words.get(rec.token, ""))
             if rec.uniform is not None else text("smp_greedy", lang, id=rec.token, tok=words.get(rec.token, "")),
             text("smp_next", lang, id=rec.token), "logits.index_select(0, kept) → softmax(· / T) → draw"]
    for n, line in enumerate(lines):
        scene.text(MARGIN, bottom + n * 16, line, 11, fill=GREY, mono=n == 2)
    scene.width = max(x0 + len(cols) * CW + MARGIN, text_width(title, 13) + 2 * MARGIN,
                      max(text_width(s, 11) for s in lines) + 2 * MARGIN)
    scene.height = bottom + 16 * len(lines) + 4
    return render_template("quantized.svg.j2", s=scene, font=FONTS[lang], mono=MONO, cls="gl-sampling")
