"""`gatherlens eval-sparse`: how much page-selected sparse decoding changes a real model.

    gatherlens eval-sparse                                   # SmolLM2, 8K of Pride and Prejudice
    gatherlens eval-sparse --context 2048 --budgets 128,512 --decode-tokens 64 --passkey-trials 2
    gatherlens eval-sparse --json q.json --csv q.csv --pictures figs/ --force

The first context - N tokens of the text are prefilled densely; the last N (--decode-tokens) are
decoded one step at a time, teacher-forced, with dense attention and with each budget. Prints a
table: perplexity and its ratio to dense, attention-mass recall, output cosine, passkey trials
retrieved (a 5-digit number hidden at spread depths in --context tokens of filler, greedy
generation). --pictures DIR saves, per budget, an SVG and HTML of the pages one layer / KV head
read at the last decode step. The metrics live in gatherlens.models.sparse_quality / passkey.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import click

from gatherlens.commands.params import output_file, positive_ints, text_source_options

_COLUMNS = ("setting", "budget", "perplexity", "ppl_ratio", "nll", "tokens", "recall", "recall_min_layer",
            "cosine", "cosine_min_layer", "passkey_ok", "passkey_trials")


def _rows(report, passkeys, budgets) -> list[dict]:
    if report is not None:
        rows = report.as_dicts()
    else:  # passkey only
        rows = [{k: None for k in _COLUMNS} | {"setting": "dense" if b is None else f"budget={b}", "budget": b}
                for b in [None, *budgets]]
    for row in rows:
        mine = [p for p in passkeys if p.setting == row["setting"]]
        row["passkey_ok"] = sum(p.ok for p in mine) if mine else None
        row["passkey_trials"] = len(mine) if mine else None
    return rows


@click.command("eval-sparse")
@text_source_options('"smollm2" or a local Hugging Face Llama-family folder / .gguf file.')
@click.option("--context", default=8192, show_default=True, type=click.IntRange(min=64),
              help="Tokens of context (prefix + decoded tokens; also the passkey prompt length).")
@click.option("--budgets", default="256,512,1024,2048", show_default=True,
              help="Comma-separated token budgets per decode step.")
@click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1), help="Tokens per page.")
@click.option("--decode-tokens", default=256, show_default=True, type=click.IntRange(min=0),
              help="Last N tokens of the context decoded step by step and scored; 0 skips perplexity.")
@click.option("--passkey-trials", default=5, show_default=True, type=click.IntRange(min=0),
              help="Passkey prompts (needle depths spread over the context); 0 skips the test.")
@click.option("--dense-layers", default=0, show_default=True, type=click.IntRange(min=0),
              help="Leading layers that decode densely (Quest keeps 2).")
@click.option("--per-head", is_flag=True, help="Each query head chooses its pages (default: one choice per KV group).")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch threads (default: torch's).")
@click.option("--json", "json_out", default=None, help="Write rows, passkey trials and meta to a .json file.")
@click.option("--csv", "csv_out", default=None, help="Write the table to a .csv file.")
@click.option("--pictures", "pictures", default=None, type=click.Path(file_okay=False),
              help="Folder for SVG/HTML pictures of the pages one layer read (one per budget).")
@click.option("--layer", default=None, type=click.IntRange(min=0), help="Layer to draw (default: the middle one).")
@click.option("--head", default=0, show_default=True, type=click.IntRange(min=0), help="KV group (or query head) to draw.")
@click.option("--force", is_flag=True, help="Overwrite output files that exist.")
def evaluate_sparse(model_name, corpus, text_file, context, budgets, page_size, decode_tokens, passkey_trials,
                    dense_layers, per_head, threads, json_out, csv_out, pictures, layer, head, force):
    """Perplexity, attention-mass recall, output cosine and passkey: sparse decoding against dense."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from gatherlens.errors import GatherLensError

    budget_list = positive_ints(budgets, "--budgets", "budget")
    if not decode_tokens and not passkey_trials:
        raise click.BadParameter("nothing to measure: --decode-tokens 0 and --passkey-trials 0",
                                 param_hint="--decode-tokens")
    if decode_tokens >= context:
        raise click.BadParameter(f"{decode_tokens} must be smaller than --context {context}",
                                 param_hint="--decode-tokens")
    json_path = output_file(json_out, force, (".json",), "--json")
    csv_path = output_file(csv_out, force, (".csv",), "--csv")
    pic_dir = Path(pictures) if pictures else None
    if pic_dir is not None and pic_dir.exists() and any(pic_dir.glob("pages_*")) and not force:
        raise click.BadParameter(f"{pictures!r} already holds pictures; pass --force to overwrite them",
                                 param_hint="--pictures")
    console = Console(stderr=True)
    try:
        import torch

        from gatherlens.models import load
        from gatherlens.models.corpus import load_text
        from gatherlens.models.passkey import passkey_trials as run_passkey
        from gatherlens.models.sparse import observe_sparse
        from gatherlens.models.sparse_quality import evaluate_sparse_quality

        if threads:
            torch.set_num_threads(threads)
        text = load_text(corpus, path=text_file)
        lm = load(model_name, progress=True)
        limit = getattr(lm.config, "max_position_embeddings", None)
        if limit and context > limit:
            raise click.BadParameter(f"context {context} exceeds the model's {limit} positions", param_hint="--context")
        ids = lm.encode(text, truncation=False)[:, :context]  # (1, S)
        if ids.shape[1] < context:
            raise click.BadParameter(f"the text has only {ids.shape[1]} tokens; lower --context",
                                     param_hint="--context")
        draw_layer = layer if layer is not None else lm.config.num_hidden_layers // 2
        if draw_layer >= lm.config.num_hidden_layers:
            raise click.BadParameter(f"layer {draw_layer} is outside [0, {lm.config.num_hidden_layers})",
                                     param_hint="--layer")
        last = {}  # budget -> the last PageSelection of draw_layer

        def keep(call):
            if call.layer == draw_layer:
                last[call.selection.budget] = call.selection

        n_settings = len(budget_list) + 1
        with Progress(TextColumn("[bold]{task.description:>22}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as bar:
            task = bar.add_task("dense", total=decode_tokens * n_settings + passkey_trials * n_settings)
            advance = lambda n, d: bar.update(task, advance=n, description=d)  # noqa: E731
            report = None
            if decode_tokens:
                with observe_sparse(keep):
                    report = evaluate_sparse_quality(lm.model, ids, budget_list, page_size=page_size,
                                                     decode_tokens=decode_tokens, share_selection=not per_head,
                                                     dense_layers=dense_layers, progress=advance)
            passkeys = run_passkey(lm.model, lm.tokenizer, context=context, trials=passkey_trials,
                                   budgets=budget_list, page_size=page_size, share_selection=not per_head,
                                   dense_layers=dense_layers, progress=advance) if passkey_trials else []
    except GatherLensError as err:
        raise click.ClickException(str(err)) from None
    source = text_file or corpus
    meta = report.meta if report is not None else {"context": ids.shape[1], "page_size": page_size,
                                                    "dense_layers": dense_layers, "share_selection": not per_head}
    meta.update({"model": lm.name, "text": str(source), "passkey_trials": passkey_trials})
    rows = _rows(report, passkeys, budget_list)
    table = Table(title=f"{lm.name}: sparse decoding vs dense, {source}, context {ids.shape[1]}, "
                        f"{decode_tokens} decoded tokens, page {page_size}")
    for col in ("decode", "perplexity", "vs dense", "mass recall", "min layer recall", "output cosine", "passkey"):
        table.add_column(col, justify="right")
    fmt = lambda x, p=4: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    for r in rows:
        pk = "-" if r["passkey_trials"] is None else f"{r['passkey_ok']}/{r['passkey_trials']}"
        ratio = "-" if r["ppl_ratio"] is None else f"{100 * (r['ppl_ratio'] - 1):+.2f}%"
        table.add_row(r["setting"], fmt(r["perplexity"], 3), ratio, fmt(r["recall"]),
                      fmt(r["recall_min_layer"]), fmt(r["cosine"]), pk)
    Console().print(table)
    if json_path is not None:
        json_path.write_text(json.dumps({"meta": meta, "rows": rows,
                                         "passkey": [p.as_dict() for p in passkeys]}, indent=2) + "\n")
        console.print(f"wrote {json_path}")
    if csv_path is not None:
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=_COLUMNS)
            w.writeheader()
            for r in rows:
                w.writerow({k: r[k] for k in _COLUMNS})
        console.print(f"wrote {csv_path}")
    if pic_dir is not None:
        _pictures(pic_dir, last, draw_layer, head, console)


def _pictures(folder: Path, selections: dict, layer: int, head: int, console) -> None:
    from gatherlens.errors import GatherLensError

    folder.mkdir(parents=True, exist_ok=True)
    for budget, sel in sorted(selections.items()):
        if head >= sel.pages.shape[1]:
            raise click.BadParameter(f"head {head} is outside [0, {sel.pages.shape[1]})", param_hint="--head")
        try:
            record = sel.to_record(batch=0, head=head)
            stem = folder / f"pages_layer{layer}_head{head}_budget{budget}"
            stem.with_suffix(".svg").write_text(record.to_svg())
            stem.with_suffix(".html").write_text(record.to_html())
        except GatherLensError as err:
            raise click.ClickException(f"drawing the pages of budget {budget}: {err}") from None
        console.print(f"wrote {stem}.svg / .html")
