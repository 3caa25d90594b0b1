"""The sections of the `explain` report, one function each: words, figures and a table per step.

    >>> [s.id for s in sections(story, lang="en")]
    ['map', 'tokens', 'embedding', 'gallery', 'heads', 'scores', 'values', 'prediction', 'gathers']

Figures of gathers come from selection records through `gatherlens.render` (the record's SVG,
and on the page its hover fragment: point at an output cell to see where it came from); the
score grid and the head groups come from `gatherlens.render.report_figures`, drawn from plain
records (report.records.score_grid, the story's HeadMap). Every word comes from
`gatherlens.i18n`. Nothing here writes files.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import torch
from markupsafe import Markup, escape

from gatherlens.i18n import op_meaning, text
from gatherlens.render.explorer import Slot, plain, slotted
from gatherlens.render.gallery import gallery_svg
from gatherlens.render.html import svg_fragment
from gatherlens.render.keep_compare import keep_comparison_svg
from gatherlens.render.layout import Limits
from gatherlens.render.model_gathers import moe_svg, scale_svg
from gatherlens.render.model_map import model_map_svg
from gatherlens.render.sampling import sampling_svg
from gatherlens.render.prefill_map import prefill_map_svg
from gatherlens.render.report_figures import heads_svg, scores_svg
from gatherlens.render.theme import human_bytes
from gatherlens.report.heads import RULES, head_gallery
from gatherlens.report.records import drawn_query, score_grid
from gatherlens.report.keep_compare import keep_comparison
from gatherlens.report.model_map import model_map
from gatherlens.report.sampling import OFFLINE, sample_view, shown_ids
from gatherlens.ops.sparse.config import TOY

__all__ = ["Figure", "Section", "sections"]


@dataclass
class Figure:
    name: str                        # file stem, e.g. "01-embedding"
    title: str
    picture: str | Callable[[], str]  # the standalone SVG, or how to draw it when first asked
    inline: Markup                   # what the page embeds (the record's hover fragment)
    draw: str = ""                   # drawn on the page by the explorer script instead ("scores", ...)

    @property
    def svg(self) -> str:
        """The standalone SVG document (the file); drawn on first use, as a live page needs none."""
        if callable(self.picture):
            self.picture = self.picture()
        return self.picture

    @property
    def filename(self) -> str:
        return f"{self.name}.svg"


@dataclass
class Section:
    id: str
    title: str
    body: list[str]                                       # paragraphs above the figures
    figures: list[Figure] = field(default_factory=list)
    table: dict | None = None                             # head, rows (, numeric: column ids)
    after: list[str] = field(default_factory=list)        # paragraphs below the table
    after_figures: list[Figure] = field(default_factory=list)

    @property
    def all_figures(self) -> list[Figure]:
        return self.figures + self.after_figures


def _record_figure(name: str, title: str, record, lang: str, limits: Limits) -> Figure:
    svg = record.to_svg(lang=lang, limits=limits)          # drawn once: the file and the page
    return Figure(name, title, svg, inline=Markup(svg_fragment(svg)))


def _drawn_figure(name: str, title: str, picture: Callable[[], str], draw: str) -> Figure:
    """A figure the page's script draws for the reader's layer, head, query and k; the file
    keeps the picture of the run's own choice."""
    return Figure(name, title, picture, inline=Markup(""), draw=draw)


def sections(story, lang: str = "en", live: bool = False) -> list[Section]:
    """Every section of the report of `story` (a gatherlens.report.collect.Story), in order; live: the
    served page's (its map sends sparse pages to Generate)."""
    return [_map(story, lang, live), _tokens(story, lang), *_embeddings(story, lang), *_scale(story, lang),
            *_rope(story, lang), _gallery(story, lang), _heads(story, lang), _scores(story, lang),
            _values(story, lang), *_prefill(story, lang), *_moe(story, lang), _prediction(story, lang),
            *_sampling(story, lang, live), _gathers(story, lang)]


# 0. the model at a glance: every gather on its stage, the model's own apart from gatherlens' change
def _map(story, lang: str, live: bool) -> Section:
    svg = model_map_svg(model_map(story, live=live), lang)
    fig = Figure("00-model-map", text("map_section", lang), svg, inline=Markup(svg))
    return Section("map", text("map_section", lang), [text("map_body", lang, model=story.model_name)], figures=[fig])


# 1. text -> tokens -> ids
def _tokens(story, lang: str) -> Section:
    toks = story.shown_tokens
    body = [text("tokens_body", lang, n=len(toks))]
    if any(re.fullmatch(r"(<0x[0-9A-F]{2}>)+", t) for t in story.tokens):
        body.append(text("tokens_bytes", lang))
    head = [text(k, lang) for k in ("col_pos", "col_token", "col_id")]
    rows = [[i, t, d] for i, (t, d) in enumerate(zip(toks, story.ids))]
    return Section("tokens", text("tokens_title", lang), body, table=dict(head=head, rows=rows))


# 2. the embedding lookups: the word table, then (BERT) positions and token types
def _embeddings(story, lang: str) -> list[Section]:
    word = [e for e in story.embeddings if e.kind == "word"] or story.embeddings[:1]
    others = [e for e in story.embeddings if e not in word]
    out = [_word_lookup(story, word[0], bool(others), lang)] if word else []
    return out + ([_other_lookups(story, others, lang)] if others else [])


def _word_lookup(story, e, others: bool, lang: str) -> Section:
    if e.quantized:
        return _quantized_lookup(story, e, lang)
    V, d = e.table_shape
    item = e.record.source.element_size()
    fig = _record_figure("01-embedding", text("emb_title", lang), e.record, lang,
                         Limits(rows=10, cols=7, slices=3))
    body = [text("emb_body", lang, sym=e.record.source_name, V=V, d=d, n=len(e.ids),
                 kb=human_bytes(len(e.ids) * d * item), mb=human_bytes(V * d * item))]
    if not others and getattr(story, "rope", False):
        body.append(text("emb_rope", lang, model=story.model_name))
    return Section("embedding", text("emb_title", lang), body, figures=[fig])


def _quantized_lookup(story, e, lang: str) -> Section:
    """The word lookup of a model run from its GGUF blocks: the quantized row gather, drawn from
    the record of the user's own ids on the real table (render/quantized.py)."""
    rec = e.record
    svg = rec.to_svg(lang=lang)
    fig = Figure("01-embedding", text("emb_title", lang), svg, inline=Markup(svg_fragment(svg)))
    V, d = e.table_shape
    n, distinct = len(e.ids), len(rec.rows)
    body = [text("emb_q_body", lang, name=rec.table_name, qtype=rec.qtype, V=V, d=d,
                 row_bytes=rec.row_bytes, float_bytes=d * 4, n=n, distinct=distinct,
                 read=human_bytes(rec.bytes_read), float_read=human_bytes(distinct * d * 4),
                 size=human_bytes(V * rec.row_bytes), float_size=human_bytes(V * d * 4),
                 model=story.model_name)]
    if getattr(story, "rope", False):
        body.append(text("emb_rope", lang, model=story.model_name))
    return Section("embedding", text("emb_title", lang), body, figures=[fig])


def _other_lookups(story, others: list, lang: str) -> Section:
    figs = []
    for n, e in enumerate(others):
        slug = {"position": "position", "token_type": "token-type"}.get(e.kind, f"lookup-{n}")
        figs.append(_record_figure(f"02-{slug}", e.module, e.record, lang,
                                   Limits(rows=10, cols=6, slices=3)))
    return Section("lookups", text("emb_extra_title", lang),
                   [text("emb_extra_body", lang, model=story.model_name)], figures=figs)


# gathers the model runs itself (report/model_gathers.py): Gemma's scaled rows, RoPE's rows, MoE routing
def _drawn_section(sid: str, name: str, title: str, svg: str, body: str) -> list[Section]:
    """[one section of one figure whose cells light up on hover or tap (the fragment script)]."""
    fig = Figure(name, title, svg, inline=Markup(svg_fragment(svg)))
    return [Section(sid, title, [body], figures=[fig])]


def _scale(story, lang: str) -> list[Section]:
    rec = getattr(story, "embed_scale", None)
    if rec is None:
        return []
    return _drawn_section("embedding-scale", "02-embedding-scale", text("scale_section", lang), scale_svg(rec, lang),
                          text("scale_body", lang, model=story.model_name, scale=rec.scale))


def _rope(story, lang: str) -> list[Section]:
    rec = getattr(story, "rope_record", None)
    if rec is None:
        return []
    fig = _record_figure("02-rope", text("rope_section", lang), rec, lang, Limits(rows=12, cols=8, slices=1))
    kind = rec.meta.get("layer_type", "")
    kind = text("rope_kind", lang, kind=text(f"layer_{LAYER_TYPE_KIND.get(kind, 'full')}", lang)) if kind else ""
    body = text("rope_body", lang, model=story.model_name, last=rec.source.shape[0] - 1, D=rec.source.shape[1],
                kind=kind, verdict=text("rope_equal" if rec.meta.get("equal") else "rope_differs", lang))
    return [Section("rope", text("rope_section", lang), [body], figures=[fig])]


def _moe(story, lang: str) -> list[Section]:
    r = getattr(story, "moe", None)
    if r is None:
        return []
    body = text("moe_body", lang, model=story.model_name, layers=r.layers, E=r.experts, k=r.top_k, layer=r.layer)
    return _drawn_section("moe", "07-moe-routing", text("moe_section", lang), moe_svg(r, lang), body)


LAYER_TYPE_KIND = {"sliding_attention": "sliding", "chunked_attention": "chunked", "full_attention": "full"}


# every layer and head at a glance: the head gallery (its rules: report/heads.py)
def _gallery(story, lang: str) -> Section:
    g = head_gallery(story)
    svg = gallery_svg(g, lang)
    fig = Figure("02-heads-gallery", text("gal_title", lang), svg,
                 inline=Markup(svg + '<div class="gl-figinfo" aria-live="polite"></div>'))
    body = [text("gal_body", lang, grid=RULES.grid, k=g.top_k, size=human_bytes(len(svg.encode()))),
            text("gal_rules", lang, copying=f"{RULES.copying:.0%}", previous=f"{RULES.previous:.0%}",
                 sink=f"{RULES.sink:.0%}", broad=f"{RULES.broad:.0%}")]
    return Section("gallery", text("gal_title", lang), body, figures=[fig])


# 3. which query heads share which key/value head
def _heads(story, lang: str) -> Section:
    hm, att = story.heads, story.attention
    fig = _drawn_figure("03-heads", text("heads_title", lang),
                        lambda: heads_svg(hm, att.head, lang), "heads")
    head, kvh = Slot("head", att.head), Slot("kvh", att.kv_head)
    if hm.group > 1:
        body = text("heads_gqa", lang, q=hm.q_heads, kv=hm.kv_heads, g=hm.group, head=head,
                    kvh=kvh)
    else:
        body = text("heads_mha", lang, q=hm.q_heads, head=head)
    return Section("heads", text("heads_title", lang), [slotted(body)], figures=[fig])


# 4. the score grid, and the same selection as scores.gather
def _scores(story, lang: str) -> Section:
    att = story.attention
    title = text("scores_title", lang, k=Slot("k", att.top_k))
    grid = _drawn_figure("04-scores", plain(title),
                         lambda: scores_svg(score_grid(att, story.shown_tokens, story.tensors), lang), "scores")
    pick = _drawn_figure("05-score-gather", "scores.gather", lambda: att.score_record.to_svg(
        lang=lang, limits=Limits(rows=12, cols=10, slices=3)), "gather")
    causal = bool(torch.equal(att.allowed, torch.ones_like(att.allowed).tril()))
    why = "why_none" if bool(att.allowed.all()) else ("why_causal" if causal else "why_masked")
    body = text("scores_body", lang, layer=Slot("layer", att.layer), head=Slot("head", att.head),
                scale=Slot("scale", att.scale), k=Slot("k", att.top_k), why=text(why, lang))
    return Section("scores", slotted(title), [slotted(body)], figures=[grid],
                   after=[text("score_gather_body", lang)], after_figures=[pick])


# 5. the value rows one query gathers
def _values(story, lang: str) -> Section:
    att, toks = story.attention, story.shown_tokens
    qrow, picked, keys = drawn_query(story)
    w = att.weights[qrow].tolist()[: len(picked)]
    fig = _drawn_figure("06-value-gather", text("values_title", lang), lambda: att.value_record.to_svg(
        lang=lang, limits=Limits(rows=12, cols=6, slices=3)), "values")
    slots = dict(q=Slot("query", att.query), tok=Slot("query_token", toks[att.query]),
                 keys=Slot("keys", ", ".join(f"{j} {keys[j]}" for j in picked)),
                 kvh=Slot("kvh", att.kv_head), n=Slot("n", len(picked)), mass=Slot("mass", att.mass),
                 formula=Slot("formula", " + ".join(f"{wi:.3g}·V[{j}]" for wi, j in zip(w, picked))),
                 allowed=Slot("allowed", int(att.allowed[qrow].sum())))
    sink = float(att.dense[qrow, 0])
    shown = " hidden" if not (sink > 0.5 and att.query > 0) else ""
    sink_text = slotted(text("sink", lang, tok=Slot("sink_token", keys[0]), w=Slot("sink", sink)))
    body = [slotted(text("values_body", lang, **slots)),
            Markup(f'<span class="gl-sink"{shown}>{sink_text}</span>')]
    head = [text(k, lang) for k in ("col_key", "col_token", "col_score", "col_weight", "col_dense")]
    rows = [[j, keys[j], f"{float(att.scores[qrow, j]):.3f}", f"{wi:.3f}",
             f"{float(att.dense[qrow, j]):.3f}"] for j, wi in zip(picked, w)]
    return Section("values", text("values_title", lang), body, figures=[fig],
                   table=dict(head=head, rows=rows), **_compare(story, lang))


def _compare(story, lang: str) -> dict:
    """Dense, top-k and sparse side by side for the run's query (report.keep_compare); the live
    page redraws it for the reader's choice (GET /api/attention)."""
    att, config = story.attention, TOY
    Q = story.tensors.shape[2]
    rec = keep_comparison(story.tensors, story.shown_tokens, att.layer, att.head,
                          att.query - (len(story.shown_tokens) - Q), att.top_k, config)
    svg = keep_comparison_svg(rec, lang)
    note = text("kc_offline", lang, layer=att.layer, head=att.head, q=att.query)
    return dict(after=[text("kc_body", lang, P=config.page_size, budget=config.budget),
                       Markup(f'<span class="gl-kc-offline">{escape(note)}</span>')],
                after_figures=[Figure("06-compare", text("kc_fig_title", lang), svg, inline=Markup(svg))])


# 5b. a sparse prefill of the text: the key blocks each query block gathered (report/prefill.py)
def _prefill(story, lang: str) -> list[Section]:
    """[the section] when the story has a sparse prefill (explain --sparse-prefill, serve's toggle), else []. The
    page's script draws the reader's layer and head; the file (prefill-map.svg) is the run's layer and head."""
    maps, title = story.prefill, text("pf_title", lang)
    if maps is None:
        return []
    if not maps.selections:
        return [Section("prefill", title, [text("pf_encoder", lang, model=story.model_name)])]
    att, c = story.attention, maps.config
    layer = maps.layer_near(att.layer)
    sel, group = maps.selections[layer], maps.selection_head(att.head)
    shares = maps.shares(layer)
    allowed = int(sel.allowed().sum())                                      # causal blocks of the (nq, nk) map
    fig = _drawn_figure("prefill-map", title, lambda: prefill_map_svg(sel, group, layer=layer, lang=lang), "prefill")
    choice = text({(False, False): "pf_mass_budget", (False, True): "pf_mass", (True, False): "pf_budget",
                   (True, True): "pf_every"}[c.threshold is None, c.budget is None], lang,
                  threshold=c.threshold, budget=c.budget)
    body = [text("pf_body", lang, L=sel.key_len, nq=sel.blocks.shape[2], block=sel.block_size, rule=sel.rule,
                 choice=choice, local=c.local_blocks, kept=maps.kept_share()),
            text("prefill_map_legend", lang, rule=sel.rule),
            slotted(text("pf_share", lang, layer=Slot("layer", att.layer), head=Slot("head", att.head),
                         group=Slot("pf_group", group), kept=Slot("pf_kept", round(shares[group] * allowed)),
                         allowed=Slot("pf_allowed", allowed), share=Slot("pf_share", shares[group])))]
    return [Section("prefill", title, body, figures=[fig])]


# 6. the next token: top-k attention against dense
def _prediction(story, lang: str) -> Section:
    p, model, title = story.prediction, story.model_name, text("pred_title", lang)
    if p is None:
        return Section("prediction", title, [text("pred_none", lang, model=model)])
    fig = _record_figure("07-next-token", title, p.record, lang, Limits(rows=1, cols=7, slices=1))
    body = text("pred_body", lang, V=story.vocab_size, tok=story.shown_tokens[-1], k=story.top_k,
                best=f"“{p.top[0][1]}”", dense=f"“{p.dense_top[0][1]}”")
    if story.tied:
        body += text("pred_tied", lang, model=model)
    rows = [[r + 1, f"{a[1]} ({a[0]})", f"{a[2]:.2f}", f"{a[3]:.1%}", f"{b[1]} ({b[0]})",
             f"{b[2]:.2f}", f"{b[3]:.1%}"] for r, (a, b) in enumerate(zip(p.top, p.dense_top))]
    token, logit, prob = (text(k, lang) for k in ("col_token", "col_logit", "col_prob"))
    topk, dense = text("topk_run", lang, k=story.top_k), text("dense_run", lang)
    head = [text("col_rank", lang), text("col_of", lang, run=topk, col=token), logit, prob,
            text("col_of", lang, run=dense, col=token), logit, prob]
    return Section("prediction", title, [body], figures=[fig], table=dict(head=head, rows=rows))


# 6b. sampling: the sampler's cut and draw over the last logits row (report/sampling.py, render/sampling.py)
def _sampling(story, lang: str, live: bool) -> list[Section]:
    run = story.tensors
    if run is None or run.logits is None or story.tokenizer is None:
        return []
    rec, words = sample_view(run, OFFLINE, story.tokenizer)
    svg = sampling_svg(rec, words, lang, shown_ids(rec))
    fig = Figure("08-sampling", text("smp_section", lang), svg, inline=Markup(svg))
    body = [text("smp_body", lang)] + ([] if live else [text("smp_offline", lang)])
    return [Section("sampling", text("smp_section", lang), body, figures=[fig])]


# 7. every gather of the forward pass
def _gathers(story, lang: str) -> Section:
    top = text("module_top", lang)
    rows = [[g["op"], op_meaning(g["op"], lang), g["module"] or top, g["count"], _shapes(g),
             human_bytes(g["bytes_read"])] for g in story.gathers]
    rows.append([text("total", lang), "", "", story.events, "", human_bytes(story.bytes_read)])
    body = [text("table_body", lang, events=story.events, bytes=human_bytes(story.bytes_read))]
    attn_modules = {g["module"] for g in story.gathers if g["op"] == "topk_attention"}
    if any(g["module"] in attn_modules and g["op"] != "topk_attention" for g in story.gathers):
        body.append(text("table_kernel", lang))
    head = [text(k, lang) for k in ("col_op", "col_meaning", "col_module", "col_count",
                                    "col_shapes", "col_bytes")]
    return Section("gathers", text("table_title", lang), body,
                   table=dict(head=head, rows=rows, numeric=(3, 5)))


def _shapes(g: dict) -> str:
    return " → ".join(shape_text(g[k]) for k in ("input_shape", "index_shape", "output_shape"))


def shape_text(shape) -> str:
    """(3,) -> '(3,)', (2, 5) -> '(2, 5)'."""
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
