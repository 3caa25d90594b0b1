"""The terminal summary of `gatherlens explain`: the report's story in a few rich tables.

    >>> print_summary(summary, paths, Console(), lang="zh")    # summary: an ExplainSummary

One function per section, in the report's order: the tokens and the rows they gather, the
embedding lookups, the heads, one query's top-k keys, the next-token prediction, every gather,
and where the report was written. Drawn from the summary record only
(gatherlens.trace.story_records.ExplainSummary, built by gatherlens.report.records), in the
chosen language: every word comes from gatherlens.i18n.
"""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gatherlens.i18n import check_lang, op_meaning, text
from gatherlens.render.theme import human_bytes
from gatherlens.trace.story_records import ExplainSummary

__all__ = ["print_summary"]


def print_summary(summary: ExplainSummary, paths, console: Console, lang: str = "en") -> None:
    """Tokens and ids, the embedding gather, one query's top-k keys, the prediction, all gathers.

    `summary` is the story's ExplainSummary record; `paths` the files the report wrote.
    """
    check_lang(lang)
    console.rule(f"[bold]gatherlens explain[/] · {escape(summary.model_name)} "
                 f"({escape(summary.model_class)})")
    console.print(Text.assemble((text("sum_text", lang), "dim"), summary.text))
    for section in (_tokens, _lookups, _heads, _top_k_keys, _prediction, _gathers):
        section(summary, console, lang)
    _files(paths, console, lang)


def _heading(console: Console, title: str) -> None:
    console.print(Text("\n" + title, style="bold"))


def _table(*columns: str, right: tuple[int, ...] = ()) -> Table:
    """A table with these column heads (plain text, never markup: "W_tok[id]"); the columns
    numbered in `right` are right-justified."""
    t = Table(box=box.SIMPLE_HEAD)
    for n, name in enumerate(columns):
        t.add_column(Text(name), justify="right" if n in right else "left")
    return t


def _tokens(s: ExplainSummary, console: Console, lang: str) -> None:
    """1-2. Each token, its id, and the first values of the table row it gathers."""
    _heading(console, text("sum_tokens", lang))
    heads = [text("sum_pos", lang), text("col_token", lang), text("col_id", lang)]
    shown = bool(s.table) and any(r.values for r in s.tokens)
    if shown:
        n = max(len(r.values) for r in s.tokens)
        heads.append(text("sum_values", lang, table=s.table, n=n, d=s.width))
    t = _table(*heads, right=(0, 2))
    t.columns[2].style = "cyan"
    for i, r in enumerate(s.tokens):
        row = [str(i), Text(r.token), str(r.id)]
        if shown:
            row.append(" ".join(f"{v:+.3f}" for v in r.values) + " …")
        t.add_row(*row)
    console.print(t)


def _lookups(s: ExplainSummary, console: Console, lang: str) -> None:
    """One line per embedding lookup: table shape, ids, rows read and bytes."""
    for e in s.lookups:
        V, d = e.table_shape
        n = len(e.ids)
        console.print(Text.assemble(
            (text("sum_lookup", lang), "bold"), (e.module, "cyan"),
            text("sum_lookup_body", lang, V=V, d=d, n=n, distinct=len(set(e.ids)),
                 read=human_bytes(n * e.row_bytes), size=human_bytes(V * e.row_bytes))))


def _heads(s: ExplainSummary, console: Console, lang: str) -> None:
    """3. Which query heads read which key/value head."""
    hm = s.heads
    groups = " | ".join(f"kv{g} ← " + " ".join(f"q{h}" for h in qs)
                        for g, qs in enumerate(hm.groups))
    kind = text("sum_heads_gqa" if hm.group > 1 else "sum_heads_mha", lang, q=hm.q_heads,
                kv=hm.kv_heads)
    console.print(Text.assemble(("\n" + text("sum_heads", lang), "bold"), kind,
                                (groups if len(groups) < 300 else groups[:297] + "…", "dim")))


def _top_k_keys(s: ExplainSummary, console: Console, lang: str) -> None:
    """4-5. The keys one query kept, their scores and weights, and the value rows gathered."""
    k = s.keys
    _heading(console, text("sum_keys", lang, k=k.top_k, q=k.query, tok=k.query_token,
                           layer=k.layer, head=k.head, kvh=k.kv_head))
    t = _table(*(text(c, lang) for c in ("col_key", "col_token", "col_score", "col_weight",
                                         "col_dense")), right=(0, 2, 3, 4))
    for r in k.rows:
        t.add_row(str(r.key), Text(r.token), f"{r.score:.3f}", f"{r.weight:.3f}", f"{r.dense:.3f}")
    console.print(t)
    console.print(Text(text("sum_keys_mass", lang, n=len(k.rows), mass=k.mass,
                            picked=[r.key for r in k.rows])))


def _prediction(s: ExplainSummary, console: Console, lang: str) -> None:
    """6. The five best next tokens with top-k attention beside dense attention's."""
    p = s.next_token
    if p is None:
        _heading(console, text("sum_encoder", lang, model=s.model_name))
        return
    _heading(console, text("sum_next", lang, tok=p.after))
    prob = text("sum_prob", lang)
    t = _table(text("col_rank", lang), text("sum_topk", lang, k=p.top_k), prob,
               text("sum_dense", lang), prob, right=(0, 2, 4))
    for r, (a, b) in enumerate(zip(p.top, p.dense)):
        t.add_row(str(r + 1), Text(f"{a.token} ({a.id})"), f"{a.prob:.1%}",
                  Text(f"{b.token} ({b.id})"), f"{b.prob:.1%}")
    console.print(t)


def _gathers(s: ExplainSummary, console: Console, lang: str) -> None:
    """7. Every gather of the forward pass, grouped by op and module, with bytes read."""
    total = human_bytes(s.bytes_read)
    _heading(console, text("sum_gathers", lang, events=s.events, bytes=total))
    t = Table(box=box.SIMPLE_HEAD, show_footer=True)
    t.add_column(Text(text("col_op", lang)), footer=Text(text("total", lang)))
    t.add_column(Text(text("col_meaning", lang)), overflow="fold")
    t.add_column(Text(text("col_module", lang)))
    t.add_column(Text(text("col_count", lang)), justify="right", footer=str(s.events))
    t.add_column(Text(text("col_bytes", lang)), justify="right", footer=total)
    for g in s.gathers:
        t.add_row(Text(g.op), Text(op_meaning(g.op, lang)), Text(g.module or text("module_top", lang)),
                  str(g.count), human_bytes(g.bytes_read))
    console.print(t)


def _files(paths, console: Console, lang: str) -> None:
    """Where the report went: index.html, and how many other files beside it."""
    index = next((p for p in paths if p.name == "index.html"), None)
    others = ", ".join(p.name for p in paths if p is not index)
    console.print(Text.assemble((text("sum_report", lang), "bold"), str(index),
                                (text("sum_files", lang, n=len(paths) - 1, names=others), "dim")))
