"""`gatherlens explain "TEXT"`: every gather of a real model on your text, as a report.

    gatherlens explain                                   # SmolLM2 on a default sentence
    gatherlens explain "The capital of France is" --top-k 2 --layer 3 --head 4
    gatherlens explain "你好，世界" --model minilm --lang zh --out report-zh
    gatherlens explain "..." --model ./my-hf-model --out report --force

Runs the model once under `gatherlens.trace()` with top-k attention on, prints a summary to the
terminal (tokens and ids, the embedding gather, one query's top-k keys, the next-token
prediction, the table of every gather) and writes a self-contained HTML report with one SVG per
figure to --out (default ./gatherlens-report). A folder that already holds files is refused
unless --force; --force replaces only the report's own files (index.html, story.json, NN-*.svg).
"""
from __future__ import annotations

import shlex
import sys
import time

import click

from gatherlens.report.defaults import DEFAULT_TEXT


def _command_line(text, model, top_k, layer, head, query, lang, out) -> str:
    parts = ["gatherlens", "explain", text]
    if model != "smollm2":
        parts += ["--model", model]
    parts += ["--top-k", str(top_k)]
    if layer is not None:
        parts += ["--layer", str(layer)]
    if head:
        parts += ["--head", str(head)]
    if query != -1:
        parts += ["--query", str(query)]
    if lang != "en":
        parts += ["--lang", lang]
    parts += ["--out", out]
    return " ".join(shlex.quote(p) for p in parts)


@click.command("explain")
@click.argument("text", required=False, default=DEFAULT_TEXT)
@click.option("--model", "model", default="smollm2", show_default=True,
              help="smollm2 (SmolLM2-135M, causal LM), minilm (all-MiniLM-L6-v2, BERT encoder), or "
                   "a path to a local Hugging Face model folder or .gguf file.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=4, show_default=True,
              help="Keys each query gathers in every attention layer.")
@click.option("--layer", type=int, default=None,
              help="Attention layer drawn in detail (default: the middle layer; negative counts "
                   "from the end).")
@click.option("--head", type=int, default=0, show_default=True, help="Query head drawn in detail.")
@click.option("--query", type=int, default=-1, show_default=True,
              help="Token position whose value gather is drawn (-1 = the last token).")
@click.option("--lang", type=click.Choice(["en", "zh"]), default="en", show_default=True,
              help="Language of the report and its captions.")
@click.option("--out", "out", type=click.Path(file_okay=False), default="gatherlens-report",
              show_default=True, help="Folder for index.html, story.json and the SVG figures.")
@click.option("--force", is_flag=True,
              help="Write into a folder that already holds files (replaces only report files).")
def explain(text, model, top_k, layer, head, query, lang, out, force):
    """Explain every gather a real model runs on TEXT.

    TEXT defaults to "The cat sat on the mat because it was". Writes --out/index.html (one
    offline page), story.json and one SVG per figure, and prints a summary here.
    """
    from rich.console import Console

    from gatherlens.errors import GatherLensError
    from gatherlens.report.build import check_out_dir, write_report

    err = Console(stderr=True, log_path=False)
    if not text.strip():
        raise click.BadParameter("TEXT is empty; give a sentence, or leave it out for the default",
                                 param_hint="TEXT")
    try:
        check_out_dir(out, force)  # fail before the model loads, not after
    except GatherLensError as e:
        raise click.ClickException(str(e)) from None
    t0 = time.perf_counter()
    try:
        with err.status("loading the model", spinner="dots") as status:
            def say(message: str) -> None:
                status.update(f"[bold]{message}[/] [dim]({time.perf_counter() - t0:.1f} s)[/]")

            from gatherlens.models import load
            from gatherlens.report.collect import collect

            say(f"loading {model} (the first SmolLM2 load converts its GGUF file: ~25 s)")
            lm = load(model, progress=say)
            err.log(f"loaded {lm.name} in {lm.seconds:.1f} s"
                    + (" (from the converted copy in the cache)" if lm.from_cache else ""))
            story = collect(lm, text, top_k=top_k, layer=layer, head=head, query=query, say=say)
            say("drawing the figures and writing the report")
            command = _command_line(text, model, top_k, layer, head, query, lang, out)
            paths = write_report(story, out, lang=lang, force=force, command=command)
    except GatherLensError as e:
        raise click.ClickException(str(e)) from None
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 110)
    print_summary(story, paths, console, lang)
    err.log(f"done in {time.perf_counter() - t0:.1f} s")


# -- the terminal summary ------------------------------------------------------------------
def print_summary(story, paths, console, lang: str = "en") -> None:
    """Tokens and ids, the embedding gather, one query's top-k keys, the prediction, all gathers."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from gatherlens.report.text import human_bytes, op_meaning

    toks = story.shown_tokens
    att = story.attention
    hm = story.heads

    def heading(title: str) -> None:
        console.print(Text("\n" + title, style="bold"))

    console.rule(f"[bold]gatherlens explain[/] · {story.model_name} ({story.model_class})")
    console.print(Text.assemble(("text: ", "dim"), story.text))

    # tokens, ids and the rows they gather
    word = next((e for e in story.embeddings if e.kind == "word"), None)
    heading("1-2. tokens → ids → rows of the embedding table")
    t = Table(box=box.SIMPLE_HEAD)
    t.add_column("pos", justify="right")
    t.add_column("token")
    t.add_column("id", justify="right", style="cyan")
    if word is not None:
        t.add_column(f"{word.record.source_name}[id] (first 4 of {word.table_shape[1]})")
    for i, (tok, tid) in enumerate(zip(toks, story.ids)):
        row = [str(i), Text(tok), str(tid)]
        if word is not None:
            vals = word.record.output.reshape(-1, word.table_shape[1])[i, :4].tolist()
            row.append(" ".join(f"{v:+.3f}" for v in vals) + " …")
        t.add_row(*row)
    console.print(t)
    for e in story.embeddings:
        V, d = e.table_shape
        item = e.record.source.element_size()
        console.print(Text.assemble(
            ("embedding gather ", "bold"), (f"{e.module}", "cyan"),
            f": table ({V:,}, {d}) [ids ({len(e.ids)},)] → ({len(e.ids)}, {d}); "
            f"{len(set(e.ids))} distinct rows read, {human_bytes(len(e.ids) * d * item)} of "
            f"{human_bytes(V * d * item)}"))

    # heads
    groups = " | ".join(f"kv{g} ← " + " ".join(f"q{h}" for h in qs) for g, qs in enumerate(hm.groups))
    kind = "grouped-query" if hm.group > 1 else "multi-head"
    console.print(Text.assemble(("\n3. heads ", "bold"),
                                f"({kind}: {hm.q_heads} query heads over {hm.kv_heads} KV heads): ",
                                (groups if len(groups) < 300 else groups[:297] + "…", "dim")))

    # the top-k picks of one query
    Q, L = att.scores.shape
    qrow = att.query - (len(toks) - Q)
    picked = [j for j in att.indices[qrow].tolist() if j >= 0]
    keys = toks[-L:]
    heading(f"4-5. top-{att.top_k} keys of query {att.query} ({toks[att.query]}) · "
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

    # prediction
    p = story.prediction
    if p is not None:
        heading(f"6. next token after {toks[-1]}: logits[:, -1].gather(-1, top5)")
        t = Table(box=box.SIMPLE_HEAD)
        for name in ("rank", f"top-k (k={story.top_k})", "prob", "dense", "prob"):
            t.add_column(name, justify="right" if name in ("rank", "prob") else "left")
        for r, (a, b) in enumerate(zip(p.top, p.dense_top)):
            t.add_row(str(r + 1), Text(f"{a[1]} ({a[0]})"), f"{a[3]:.1%}",
                      Text(f"{b[1]} ({b[0]})"), f"{b[3]:.1%}")
        console.print(t)
    else:
        console.print(f"[bold]6.[/] {story.model_name} is an encoder: no next-token prediction.")

    # every gather
    heading(f"7. every gather of the forward pass ({story.events} calls, "
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

    index = next((p for p in paths if p.name == "index.html"), None)
    console.print(Text.assemble(("report: ", "bold"), str(index),
                                (f"  (+ {len(paths) - 1} files: "
                                 + ", ".join(p.name for p in paths if p is not index) + ")", "dim")))


if __name__ == "__main__":  # pragma: no cover
    explain(sys.argv[1:])
