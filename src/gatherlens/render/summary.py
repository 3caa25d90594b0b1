"""The terminal summary of `gatherlens explain`: the report's story in a few rich tables.

    >>> print_summary(story, paths, Console())

One function per section, in the report's order: the tokens and the rows they gather, the
embedding lookups, the heads, one query's top-k keys, the next-token prediction, every gather,
and where the report was written. Drawn from the story's plain data and records only; the
summary is in English (the written report carries the chosen language).
"""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gatherlens.i18n import op_meaning
from gatherlens.render.theme import human_bytes

__all__ = ["print_summary"]


def print_summary(story, paths, console: Console, lang: str = "en") -> None:
    """Tokens and ids, the embedding gather, one query's top-k keys, the prediction, all gathers.

    `story` is a gatherlens.report.collect.Story; `paths` the files the report wrote.
    """
    console.rule(f"[bold]gatherlens explain[/] · {story.model_name} ({story.model_class})")
    console.print(Text.assemble(("text: ", "dim"), story.text))
    for section in (_tokens, _embeddings, _heads, _top_k_keys, _prediction, _gathers):
        section(story, console)
    _files(paths, console)


def _heading(console: Console, title: str) -> None:
    console.print(Text("\n" + title, style="bold"))


def _tokens(story, console: Console) -> None:
    """1-2. Each token, its id, and the first values of the table row it gathers."""
    word = next((e for e in story.embeddings if e.kind == "word"), None)
    _heading(console, "1-2. tokens → ids → rows of the embedding table")
    t = Table(box=box.SIMPLE_HEAD)
    t.add_column("pos", justify="right")
    t.add_column("token")
    t.add_column("id", justify="right", style="cyan")
    if word is not None:
        d = word.table_shape[1]
        t.add_column(f"{word.record.source_name}[id] (first 4 of {d})")
        rows = word.record.output.reshape(-1, d)  # (S, d)
    for i, (tok, tid) in enumerate(zip(story.shown_tokens, story.ids)):
        row = [str(i), Text(tok), str(tid)]
        if word is not None:
            row.append(" ".join(f"{v:+.3f}" for v in rows[i, :4].tolist()) + " …")
        t.add_row(*row)
    console.print(t)


def _embeddings(story, console: Console) -> None:
    """One line per embedding lookup: table shape, ids, rows read and bytes."""
    for e in story.embeddings:
        V, d = e.table_shape
        item = e.record.source.element_size()
        console.print(Text.assemble(
            ("embedding gather ", "bold"), (f"{e.module}", "cyan"),
            f": table ({V:,}, {d}) [ids ({len(e.ids)},)] → ({len(e.ids)}, {d}); "
            f"{len(set(e.ids))} distinct rows read, {human_bytes(len(e.ids) * d * item)} of "
            f"{human_bytes(V * d * item)}"))


def _heads(story, console: Console) -> None:
    """3. Which query heads read which key/value head."""
    hm = story.heads
    groups = " | ".join(f"kv{g} ← " + " ".join(f"q{h}" for h in qs)
                        for g, qs in enumerate(hm.groups))
    kind = "grouped-query" if hm.group > 1 else "multi-head"
    console.print(Text.assemble(("\n3. heads ", "bold"),
                                f"({kind}: {hm.q_heads} query heads over {hm.kv_heads} KV heads): ",
                                (groups if len(groups) < 300 else groups[:297] + "…", "dim")))


def _top_k_keys(story, console: Console) -> None:
    """4-5. The keys one query kept, their scores and weights, and the value rows gathered."""
    att, toks = story.attention, story.shown_tokens
    Q, L = att.scores.shape
    qrow = att.query - (len(toks) - Q)
    picked = [j for j in att.indices[qrow].tolist() if j >= 0]
    keys = toks[-L:]
    _heading(console, f"4-5. top-{att.top_k} keys of query {att.query} ({toks[att.query]}) · "
                      f"layer {att.layer}, head {att.head} (KV head {att.kv_head})")
    t = Table(box=box.SIMPLE_HEAD)
    for name in ("key", "token", "score", "top-k weight", "dense weight"):
        t.add_column(name, justify="left" if name == "token" else "right")
    for j, w in zip(picked, att.weights[qrow].tolist()):
        t.add_row(str(j), Text(keys[j]), f"{float(att.scores[qrow, j]):.3f}", f"{w:.3f}",
                  f"{float(att.dense[qrow, j]):.3f}")
    console.print(t)
    console.print(f"   these {len(picked)} keys hold {att.mass:.0%} of the dense attention weight; "
                  f"their value rows are gathered: V.index_select(0, {picked})")


def _prediction(story, console: Console) -> None:
    """6. The five best next tokens with top-k attention beside dense attention's."""
    p = story.prediction
    if p is None:
        console.print(f"[bold]6.[/] {story.model_name} is an encoder: no next-token prediction.")
        return
    _heading(console, f"6. next token after {story.shown_tokens[-1]}: "
                      f"logits[:, -1].gather(-1, top5)")
    t = Table(box=box.SIMPLE_HEAD)
    for name in ("rank", f"top-k (k={story.top_k})", "prob", "dense", "prob"):
        t.add_column(name, justify="right" if name in ("rank", "prob") else "left")
    for r, (a, b) in enumerate(zip(p.top, p.dense_top)):
        t.add_row(str(r + 1), Text(f"{a[1]} ({a[0]})"), f"{a[3]:.1%}",
                  Text(f"{b[1]} ({b[0]})"), f"{b[3]:.1%}")
    console.print(t)


def _gathers(story, console: Console) -> None:
    """7. Every gather of the forward pass, grouped by op and module, with bytes read."""
    _heading(console, f"7. every gather of the forward pass ({story.events} calls, "
                      f"{human_bytes(story.bytes_read)} read)")
    t = Table(box=box.SIMPLE_HEAD, show_footer=True)
    t.add_column("op", footer="total")
    t.add_column("what it does", overflow="fold")
    t.add_column("module")
    t.add_column("calls", justify="right", footer=str(story.events))
    t.add_column("bytes read", justify="right", footer=human_bytes(story.bytes_read))
    for g in story.gathers:
        t.add_row(g["op"], op_meaning(g["op"], "en"), g["module"] or "(top)", str(g["count"]),
                  human_bytes(g["bytes_read"]))
    console.print(t)


def _files(paths, console: Console) -> None:
    """Where the report went: index.html, and how many other files beside it."""
    index = next((p for p in paths if p.name == "index.html"), None)
    others = ", ".join(p.name for p in paths if p is not index)
    console.print(Text.assemble(("report: ", "bold"), str(index),
                                (f"  (+ {len(paths) - 1} files: {others})", "dim")))
