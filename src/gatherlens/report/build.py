"""Assemble the report: figures (SVG) and one self-contained HTML page, written to a folder.

    >>> report = build_report(story, lang="zh")
    >>> [f.name for f in report.figures][:2]
    ['01-embedding', '03-heads']
    >>> write_report(story, "gatherlens-report", force=False)      # index.html, *.svg, story.json

Figures of gathers come from selection records through `gatherlens.render` (the record's SVG,
and on the page its hover fragment: point at an output cell to see where it came from). The
score grid and the head groups are drawn by `gatherlens.report.figures`. The page inlines all
CSS, JS and SVG and forbids every fetch with a Content-Security-Policy, so it works offline.

Overwriting: `write_report` refuses a folder that already holds files, unless `force=True`;
then it replaces the files a report writes (index.html, story.json, NN-*.svg), removing such
files left by an earlier report, and leaves every other file alone.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from markupsafe import Markup

from gatherlens.errors import GatherValueError
from gatherlens.render.layout import Limits
from gatherlens.render.scene import FONTS, MONO
from gatherlens.report.collect import Story
from gatherlens.report.figures import environment, heads_svg, scores_svg
from gatherlens.report.text import human_bytes, op_meaning, say

__all__ = ["Figure", "Report", "build_report", "write_report", "REPORT_FILES"]

# what a report writes: anything else in the folder is the user's and is never touched
REPORT_FILES = re.compile(r"^(index\.html|story\.json|\d\d-[a-z0-9-]+\.svg)$")


@dataclass
class Figure:
    name: str            # file stem, e.g. "01-embedding"
    title: str
    svg: str             # standalone SVG document
    inline: Markup       # what the page embeds (the record's hover fragment, or the SVG)

    @property
    def filename(self) -> str:
        return f"{self.name}.svg"


@dataclass
class Report:
    html: str
    figures: list[Figure]
    data: dict = field(default_factory=dict)


def _record_figure(name: str, title: str, record, lang: str, limits: Limits | None = None) -> Figure:
    from gatherlens.render.html import render_html_fragment

    return Figure(name=name, title=title, svg=record.to_svg(lang=lang, limits=limits),
                  inline=Markup(render_html_fragment(record, lang=lang, limits=limits)))


def _svg_figure(name: str, title: str, svg: str) -> Figure:
    return Figure(name=name, title=title, svg=svg, inline=Markup(svg))


def build_report(story: Story, lang: str = "en", command: str = "") -> Report:
    """Every figure and the HTML page of a story (nothing is written)."""
    if lang not in ("en", "zh"):
        raise GatherValueError(f"lang must be one of ('en', 'zh'), got {lang!r}")
    toks = story.shown_tokens
    att = story.attention
    model = story.model_name
    sections = []
    figures: list[Figure] = []

    # 1. tokens
    body = [say("tokens_body", lang, n=len(toks))]
    if any(re.fullmatch(r"(<0x[0-9A-F]{2}>)+", t) for t in story.tokens):
        body.append(say("tokens_bytes", lang))
    sections.append(dict(id="tokens", title=say("tokens_title", lang), body=body, figures=[],
                         table=dict(head=[say("col_pos", lang), say("col_token", lang), say("col_id", lang)],
                                    rows=[[i, t, d] for i, (t, d) in enumerate(zip(toks, story.ids))])))

    # 2. embeddings
    word = [e for e in story.embeddings if e.kind == "word"] or story.embeddings[:1]
    others = [e for e in story.embeddings if e not in word]
    if word:
        e = word[0]
        V, d = e.table_shape
        item = e.record.source.element_size()
        fig = _record_figure("01-embedding", say("emb_title", lang), e.record, lang,
                             Limits(rows=10, cols=7, slices=3))
        figures.append(fig)
        body = [say("emb_body", lang, sym=e.record.source_name, V=V, d=d, n=len(e.ids),
                    kb=human_bytes(len(e.ids) * d * item), mb=human_bytes(V * d * item))]
        if not others and getattr(story, "rope", False):
            body.append(say("emb_rope", lang, model=model))
        sections.append(dict(id="embedding", title=say("emb_title", lang), body=body,
                             figures=[fig], table=None))
    if others:
        figs = []
        for n, e in enumerate(others):
            slug = {"position": "position", "token_type": "token-type"}.get(e.kind, f"lookup-{n}")
            figs.append(_record_figure(f"02-{slug}", e.module, e.record, lang,
                                       Limits(rows=10, cols=6, slices=3)))
        figures.extend(figs)
        sections.append(dict(id="lookups", title=say("emb_extra_title", lang),
                             body=[say("emb_extra_body", lang, model=model)], figures=figs, table=None))

    # 3. heads
    hm = story.heads
    fig = _svg_figure("03-heads", say("heads_title", lang), heads_svg(hm, att.head, lang))
    figures.append(fig)
    body = (say("heads_gqa", lang, q=hm.q_heads, kv=hm.kv_heads, g=hm.group, head=att.head,
                kvh=att.kv_head) if hm.group > 1 else say("heads_mha", lang, q=hm.q_heads, head=att.head))
    sections.append(dict(id="heads", title=say("heads_title", lang), body=[body], figures=[fig], table=None))

    # 4. scores + the score gather
    f_scores = _svg_figure("04-scores", say("scores_title", lang, k=att.top_k), scores_svg(att, toks, lang))
    f_pick = _record_figure("05-score-gather", "scores.gather", att.score_record, lang,
                            Limits(rows=12, cols=10, slices=3))
    figures.extend([f_scores, f_pick])
    causal = bool(torch.equal(att.allowed, torch.ones_like(att.allowed).tril()))
    why = "why_none" if bool(att.allowed.all()) else ("why_causal" if causal else "why_masked")
    sections.append(dict(
        id="scores", title=say("scores_title", lang, k=att.top_k),
        body=[say("scores_body", lang, layer=att.layer, head=att.head, scale=att.scale, k=att.top_k,
                  why=say(why, lang))],
        figures=[f_scores], table=None,
        after=[say("score_gather_body", lang)], after_figures=[f_pick]))

    # 5. the value gather for one query
    Q = att.scores.shape[0]
    qrow = att.query - (len(toks) - Q)
    picked = [j for j in att.indices[qrow].tolist() if j >= 0]
    w = att.weights[qrow].tolist()[: len(picked)]
    formula = " + ".join(f"{wi:.3g}·V[{j}]" for wi, j in zip(w, picked))
    f_val = _record_figure("06-value-gather", say("values_title", lang), att.value_record, lang,
                           Limits(rows=12, cols=6, slices=3))
    figures.append(f_val)
    keys = toks[-att.scores.shape[1]:]
    sections.append(dict(
        id="values", title=say("values_title", lang),
        body=[say("values_body", lang, q=att.query, tok=toks[att.query], keys=", ".join(
            f"{j} {keys[j]}" for j in picked), kvh=att.kv_head, formula=formula, n=len(picked),
            mass=att.mass, allowed=int(att.allowed[qrow].sum()))]
        + ([say("sink", lang, tok=keys[0], w=float(att.dense[qrow, 0]))]
           if float(att.dense[qrow, 0]) > 0.5 and att.query > 0 else []),
        figures=[f_val],
        table=dict(head=[say("col_key", lang), say("col_token", lang), say("col_score", lang),
                         say("col_weight", lang), say("col_dense", lang)],
                   rows=[[j, keys[j], f"{float(att.scores[qrow, j]):.3f}", f"{wi:.3f}",
                          f"{float(att.dense[qrow, j]):.3f}"] for j, wi in zip(picked, w)])))

    # 6. prediction
    p = story.prediction
    if p is not None:
        f_pred = _record_figure("07-next-token", say("pred_title", lang), p.record, lang,
                                Limits(rows=1, cols=7, slices=1))
        figures.append(f_pred)
        body = say("pred_body", lang, V=story.vocab_size, tok=toks[-1], k=story.top_k,
                   best=f"“{p.top[0][1]}”", dense=f"“{p.dense_top[0][1]}”")
        if story.tied:
            body += say("pred_tied", lang, model=model)
        rows = []
        for r, (a, b) in enumerate(zip(p.top, p.dense_top)):
            rows.append([r + 1, f"{a[1]} ({a[0]})", f"{a[2]:.2f}", f"{a[3]:.1%}",
                         f"{b[1]} ({b[0]})", f"{b[2]:.2f}", f"{b[3]:.1%}"])
        topk_h, dense_h = say("topk_run", lang, k=story.top_k), say("dense_run", lang)
        sections.append(dict(
            id="prediction", title=say("pred_title", lang), body=[body], figures=[f_pred],
            table=dict(head=[say("col_rank", lang), f"{topk_h}: {say('col_token', lang)}",
                             say("col_logit", lang), say("col_prob", lang),
                             f"{dense_h}: {say('col_token', lang)}", say("col_logit", lang),
                             say("col_prob", lang)], rows=rows)))
    else:
        sections.append(dict(id="prediction", title=say("pred_title", lang),
                             body=[say("pred_none", lang, model=model)], figures=[], table=None))

    # 7. every gather
    rows = []
    for g in story.gathers:
        shapes = f"{_shape(g['input_shape'])} → {_shape(g['index_shape'])} → {_shape(g['output_shape'])}"
        rows.append([g["op"], op_meaning(g["op"], lang), g["module"] or "(top)", g["count"], shapes,
                     human_bytes(g["bytes_read"])])
    rows.append([say("total", lang), "", "", story.events, "", human_bytes(story.bytes_read)])
    body = [say("table_body", lang, events=story.events, bytes=human_bytes(story.bytes_read))]
    attn_modules = {g["module"] for g in story.gathers if g["op"] == "topk_attention"}
    if any(g["module"] in attn_modules and g["op"] != "topk_attention" for g in story.gathers):
        body.append(say("table_kernel", lang))
    sections.append(dict(
        id="gathers", title=say("table_title", lang), body=body, figures=[],
        table=dict(head=[say("col_op", lang), say("col_meaning", lang), say("col_module", lang),
                         say("col_count", lang), say("col_shapes", lang), say("col_bytes", lang)],
                   rows=rows, numeric=(3, 5))))

    facts = say("facts", lang, cls=story.model_class, layers=story.layers, q_heads=hm.q_heads,
                kv_heads=hm.kv_heads, vocab=story.vocab_size, d=story.hidden_size, k=story.top_k)
    html = environment().get_template("report.html.j2").render(
        lang=lang, title=say("page_title", lang, model=model), intro=say("intro", lang, model=model),
        facts=facts, text_label=say("your_text", lang), text=story.text, tokens=toks,
        sections=sections, toc=say("toc", lang), font=FONTS[lang], mono=MONO,
        files_title=say("files_title", lang), files_body=say("files_body", lang),
        files=[f.filename for f in figures], rerun=say("rerun", lang), command=command,
    )
    return Report(html=html, figures=figures, data=story_data(story))


def _shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def story_data(story: Story) -> dict:
    """The story as JSON-ready data (no tensors): tokens, ids, selections, prediction, gathers."""
    att = story.attention
    return {
        "model": story.model_name, "model_class": story.model_class, "text": story.text,
        "tokens": story.tokens, "ids": story.ids, "top_k": story.top_k,
        "heads": {"query": story.heads.q_heads, "kv": story.heads.kv_heads,
                  "groups": story.heads.groups},
        "embeddings": [{"kind": e.kind, "module": e.module, "table_shape": list(e.table_shape),
                        "ids": e.ids} for e in story.embeddings],
        "attention": {"layer": att.layer, "module": att.module, "head": att.head,
                      "kv_head": att.kv_head, "query": att.query, "scale": att.scale,
                      "indices": att.indices.tolist(),
                      "weights": [[round(float(x), 6) for x in r] for r in att.weights.tolist()],
                      "dense_mass_on_selected": round(att.mass, 6)},
        "prediction": None if story.prediction is None else {
            "topk": [dict(id=i, token=t, logit=round(lg, 4), prob=round(pr, 6)) for i, t, lg, pr in story.prediction.top],
            "dense": [dict(id=i, token=t, logit=round(lg, 4), prob=round(pr, 6))
                      for i, t, lg, pr in story.prediction.dense_top]},
        "gathers": [{**g, "input_shape": list(g["input_shape"]), "index_shape": list(g["index_shape"]),
                     "output_shape": list(g["output_shape"])} for g in story.gathers],
        "events": story.events, "bytes_read": story.bytes_read,
    }


# -- writing ---------------------------------------------------------------------------------
def _write(path: Path, content: str) -> None:
    """Write through a temporary file in the same folder, then rename (no half-written file).

    The file is created with open() so it gets the user's umask (mkstemp would make it 0600).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_out_dir(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """The output folder, or a clear error when writing there would overwrite a user's files."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise GatherValueError(f"--out {str(out)!r} is a file, not a folder; choose a folder path")
    if out.is_dir() and not force:
        present = sorted(p.name for p in out.iterdir())
        if present:
            shown = ", ".join(present[:5]) + (", …" if len(present) > 5 else "")
            raise GatherValueError(
                f"output folder {str(out)!r} is not empty ({len(present)} entries: {shown}); "
                f"pass --force to replace the report files in it, or choose another --out")
    return out


def write_report(story: Story, out_dir: str | os.PathLike, lang: str = "en", force: bool = False,
                 command: str = "") -> list[Path]:
    """Write index.html, story.json and one SVG per figure into `out_dir`; return the paths.

    An existing non-empty folder is refused unless `force`; with `force`, earlier report files
    (index.html, story.json, NN-*.svg) are replaced or removed and other files are kept.
    """
    out = check_out_dir(out_dir, force)
    report = build_report(story, lang=lang, command=command)
    out.mkdir(parents=True, exist_ok=True)
    if force:
        for old in out.iterdir():
            if old.is_file() and REPORT_FILES.match(old.name):
                old.unlink()
    written = []
    for fig in report.figures:
        path = out / fig.filename
        _write(path, fig.svg)
        written.append(path)
    path = out / "story.json"
    _write(path, json.dumps(report.data, ensure_ascii=False, indent=1) + "\n")
    written.append(path)
    path = out / "index.html"
    _write(path, report.html)
    written.append(path)
    return written
