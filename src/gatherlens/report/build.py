"""Assemble the report: figures (SVG) and one self-contained HTML page, written to a folder.

    >>> report = build_report(story, lang="zh")
    >>> [f.name for f in report.figures][:2]
    ['01-embedding', '03-heads']
    >>> write_report(story, "gatherlens-report", force=False)      # index.html, *.svg, story.json

The sections (words, figures, tables) come from `gatherlens.report.sections`, one function per
step of the story; the page is drawn with render's one template environment. It inlines all
CSS, JS and SVG and forbids every fetch with a Content-Security-Policy, so it works offline.

Overwriting: `write_report` refuses a folder that already holds files, unless `force=True`;
then it replaces the files a report writes (index.html, story.json, NN-*.svg, prefill-map.svg), removing such
files left by an earlier report, and leaves every other file alone.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from markupsafe import Markup

from gatherlens.i18n import check_lang, text
from gatherlens.outputs import output_dir, output_folder, write_new
from gatherlens.render.explorer import (csp, explorer_js, fragment_script, inline_scripts,
                                        json_block, strings_data, theme_data)
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO
from gatherlens.render.report_figures import layer_kind_text
from gatherlens.report.explore import explore_run
from gatherlens.report.long_page import limits_text, long_explore
from gatherlens.report.run_tensors import kind_data
from gatherlens.report.window import grid_span
from gatherlens.report.collect import Story
from gatherlens.report.sections import Figure, Section, sections

__all__ = ["Figure", "Report", "build_report", "write_report", "story_data", "page_data",
           "page_sections", "controls", "REPORT_FILES"]

# what a report writes: anything else in the folder is the user's and is never touched
REPORT_FILES = re.compile(r"^(index\.html|story\.json|prefill-map\.svg|\d\d-[a-z0-9-]+\.svg)$")


@dataclass
class Report:
    html: str
    figures: list[Figure]
    data: dict = field(default_factory=dict)
    csp: str = ""          # the page's Content-Security-Policy (a server sends it as a header too)


def build_report(story: Story, lang: str = "en", command: str = "", live: dict | None = None) -> Report:
    """Every figure and the HTML page of a story (nothing is written).

    live: the settings of `gatherlens serve`'s page (models, limits); None for the offline page.
    """
    check_lang(lang)
    parts = sections(story, lang, live=live is not None)
    figures = [f for s in parts for f in s.all_figures]
    html, policy = _page(story, parts, figures, lang, command, live)
    return Report(html=html, figures=figures, data=story_data(story), csp=policy)


def _page(story: Story, parts: list[Section], figures: list[Figure], lang: str,
          command: str, live: dict | None) -> tuple[str, str]:
    """The one HTML page: title, the model's facts, the text and its tokens, the explorer's
    controls, then the sections; its data block and script make every attention figure follow
    the reader's layer, head, query and k."""
    hm, model = story.heads, story.model_name
    facts = text("facts", lang, cls=story.model_class, layers=story.layers, q_heads=hm.q_heads,
                 kv_heads=hm.kv_heads, vocab=story.vocab_size, d=story.hidden_size, k=story.top_k)
    js, data = explorer_js(), page_data(story, lang, live)
    scripts = [x for f in figures for x in inline_scripts(str(f.inline))] + [js, fragment_script()]
    policy = csp(scripts, connect_self=live is not None)
    return render_template(
        "report.html.j2", lang=lang, title=text("page_title", lang, model=model),
        intro=text("intro", lang, model=model), facts=facts, text_label=text("your_text", lang),
        text=story.text, tokens=story.shown_tokens, sections=page_sections(parts),
        toc=text("toc", lang),
        font=FONTS[lang], mono=MONO, files_title=text("files_title", lang),
        files_body=text("files_body", lang), files=[f.filename for f in figures],
        rerun=text("rerun", lang), command=command, csp=Markup(policy),
        controls=controls(story, lang, live), data=json_block(data),
        limits=limits_text(story, data["explore"], lang, live),
        js=Markup(js), live=live, words=_words(lang),
    ), policy


def page_sections(parts: list[Section]) -> list[dict]:
    """The sections as plain data for the page template: render reads no report object."""
    def figure(f: Figure) -> dict:
        return dict(name=f.name, draw=f.draw, inline=f.inline, filename=f.filename)

    return [dict(id=s.id, title=s.title, body=s.body, table=s.table, after=s.after,
                 figures=[figure(f) for f in s.figures],
                 after_figures=[figure(f) for f in s.after_figures]) for s in parts]


def _words(lang: str) -> dict:
    """The page's own labels (controls, live panel) from the string table."""
    keys = ("ex_controls", "ex_layer", "ex_head", "ex_query", "ex_k", "live_title", "live_text",
            "live_model", "live_topk", "live_generate", "live_tokens", "live_stop",
            "live_steps_title", "live_steps_body", "ex_no_steps", "st_click", "live_prefill", "live_lang",
            "smp_temperature", "smp_seed", "chat_title", "chat_body", "chat_send", "chat_placeholder", "chat_reset",
            "chat_none")
    return {k: text(k, lang) for k in keys}


def _view_k(story: Story, live: dict | None) -> int:
    """The k the page opens with: the run's, or after a dense run the k the reader asked for."""
    if story.dense_run and live and live.get("k"):
        return min(int(live["k"]), story.tensors.shape[3])
    return story.attention.top_k


def controls(story: Story, lang: str, live: dict | None = None) -> dict:
    """The explorer's controls (layer, head, query, k) with the run's choice selected; each layer named
    with its kind ("5 · global", "0 · sliding 512"); an offline page of a long text offers the query rows
    it carries."""
    att, n = story.attention, story.tensors.shape
    rows = range(len(story.shown_tokens))
    if live is None and story.explore is None:
        (r0, r1), _ = grid_span(story.tensors, att.query - (len(story.shown_tokens) - n[2]))
        rows = range(len(story.shown_tokens) - n[2] + r0, len(story.shown_tokens) - n[2] + r1)
    return {"layers": [(i, f"{i} · {layer_kind_text(k.kind, k.window, lang)}")
                       for i, k in enumerate(story.tensors.kinds)], "heads": list(range(n[1])),
            "queries": [(i, f"{i} {story.shown_tokens[i]}") for i in rows],
            "layer": att.layer, "head": att.head, "query": att.query, "k": _view_k(story, live),
            "k_max": n[3], "noscript": {f"{f}": text("ex_noscript", lang, file=f"{f}.svg")
                                        for f in ("03-heads", "04-scores", "05-score-gather",
                                                  "06-value-gather", "prefill-map")}}


def page_data(story: Story, lang: str, live: dict | None = None) -> dict:
    """What the page's script reads: the run's every layer and head, the words, the theme."""
    att = story.attention
    return {"explore": _explore(story, live),
            "tokens": story.shown_tokens, "text": story.text,
            "sel": {"layer": att.layer, "head": att.head, "query": att.query,
                    "k": _view_k(story, live)},
            "model": story.model_name, "strings": strings_data(lang), "theme": theme_data(lang),
            "lang": lang, "live": live, "prefill": _prefill_data(story)}


def _explore(story: Story, live: dict | None) -> dict:
    """The page's explorer data: every row of a short text; past MAX_TOKENS, offline, the rows around the
    drawn query (report.window.grid_span); live, the first window the script extends from the server."""
    if story.explore is not None:
        return story.explore.pack()
    if live is not None:
        return long_explore(story, _view_k(story, live))
    t, att = story.tensors, story.attention
    rows, keys = grid_span(t, att.query - (len(story.shown_tokens) - t.shape[2]))
    return explore_run(t, rows=rows, keys=keys).pack()


def _prefill_data(story: Story) -> dict | None:
    """The packed block maps of the story's sparse prefill (report/prefill.py), or None without one."""
    maps = story.prefill
    return maps.pack() if maps is not None and maps.selections else None


def story_data(story: Story) -> dict:
    """The story as JSON-ready data (no tensors): tokens, ids, selections, prediction, gathers."""
    att = story.attention
    return {
        "model": story.model_name, "model_class": story.model_class, "text": story.text,
        "tokens": story.tokens, "ids": story.ids, "top_k": story.top_k,
        "heads": {"query": story.heads.q_heads, "kv": story.heads.kv_heads,
                  "groups": story.heads.groups},
        "quantized": story.quantized,
        "layer_kinds": [kind_data(k) for k in story.tensors.kinds],
        "embeddings": [{"kind": e.kind, "module": e.module, "table_shape": list(e.table_shape),
                        "ids": e.ids, **_blocks(e)} for e in story.embeddings],
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
        "prefill": story.prefill.summary() if story.prefill is not None and story.prefill.selections else None,
    }


def _blocks(e) -> dict:
    """A lookup from GGUF blocks: the table's format and the bytes of blocks the gather read."""
    if not e.quantized:
        return {}
    return {"qtype": e.record.qtype, "row_bytes": e.record.row_bytes, "rows_read": len(e.record.rows),
            "bytes_read": e.record.bytes_read}


# -- writing ---------------------------------------------------------------------------------
def check_out_dir(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """The output folder, or a clear error when writing there would overwrite a user's files
    (`gatherlens.outputs.output_dir`'s rule: missing or empty, unless `force`; writable)."""
    return output_dir(out_dir, "--out", force=force)


def write_report(story: Story, out_dir: str | os.PathLike, lang: str = "en", force: bool = False,
                 command: str = "") -> list[Path]:
    """Write index.html, story.json and one SVG per figure into `out_dir`; return the paths.

    An existing non-empty folder is refused unless `force`; with `force`, earlier report files
    (index.html, story.json, NN-*.svg, prefill-map.svg) are replaced or removed and other files are kept.
    """
    report = build_report(story, lang=lang, command=command)
    out = check_out_dir(out_dir, force)  # checked again just before writing (the command checked at its start)
    files = [(fig.filename, fig.svg) for fig in report.figures]
    files += [("story.json", json.dumps(report.data, ensure_ascii=False, indent=1) + "\n"), ("index.html", report.html)]
    # written whole into a temporary folder, then swapped in: a stopped run leaves the earlier report as it was
    with output_folder(out, "--out", force=force, owned=REPORT_FILES.match) as tmp:
        for name, content in files:
            write_new(tmp / name, content, shown=out / name)
    return [out / name for name, _ in files]
