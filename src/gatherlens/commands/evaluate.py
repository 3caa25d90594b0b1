"""`gatherlens eval`: how much top-k attention changes a real model, on real text.

    gatherlens eval                                   # SmolLM2 on Pride and Prejudice, k = 8,32,128,512,
                                                      # 2048 tokens, windows of 1024 every 512
    gatherlens eval --corpus pydoc -k 16,64 --tokens 1024 --out q.json --plot q.png
    gatherlens eval --text my.txt --window 256 --stride 128 --out q.csv

Prints a table (perplexity over a sliding window, attention-mass recall, output cosine to dense)
for dense attention and each k; --out writes CSV or JSON by extension, --plot a PNG. Existing
files are not overwritten without --force. The metrics live in gatherlens.models.quality.
"""
from __future__ import annotations


import click

from gatherlens.commands.params import output_file, positive_ints, text_source_options


@click.command("eval")
@text_source_options('"smollm2", "minilm", or a local Hugging Face folder / .gguf file.')
@click.option("-k", "--top-k", "ks", multiple=True, help="k values, comma-separated or repeated (-k 8 -k 32)  "
              "[default: 8,32,128,512].")
@click.option("--tokens", default=2048, show_default=True, type=click.IntRange(min=2),
              help="Score the first N tokens of the text.")
@click.option("--window", default=None, type=click.IntRange(min=2),
              help="Context window of each forward pass  [default: 1024, or the model's limit].")
@click.option("--stride", default=None, type=click.IntRange(min=1),
              help="Step between windows; each token then has >= window - stride tokens of context "
                   "[default: window / 2].")
@click.option("--out", "out", default=None, help="Write the results to a .csv or .json file.")
@click.option("--plot", "plot", default=None, help="Write a plot to a .png file.")
@click.option("--force", is_flag=True, help="Overwrite --out / --plot files that exist.")
def evaluate(model_name, corpus, text_file, ks, tokens, window, stride, out, plot, force):
    """Perplexity, attention-mass recall and output cosine: top-k attention against dense."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from gatherlens.errors import GatherLensError

    ks_list = positive_ints(",".join(ks) or "8,32,128,512", "-k/--top-k", "k")
    if window is not None and stride is not None and stride > window:
        raise click.BadParameter(f"stride {stride} is larger than window {window}", param_hint="--stride")
    out_path = output_file(out, force, (".csv", ".json"), "--out")
    plot_path = output_file(plot, force, (".png",), "--plot")
    console = Console(stderr=True)
    try:
        from gatherlens.models import load
        from gatherlens.models.corpus import load_text
        from gatherlens.models.quality import evaluate_quality, sliding_windows
        from gatherlens.models.quality_io import plot_quality, write_report

        text = load_text(corpus, path=text_file)
        lm = load(model_name, progress=True)
        ids = lm.encode(text[: tokens * 12])                               # (1, N'): ~4 chars a token
        if ids.shape[1] < tokens and len(text) > tokens * 12:
            ids = lm.encode(text)
        ids = ids[:, :tokens]                                              # (1, N)
        limit = getattr(lm.config, "max_position_embeddings", None)
        if window is None:
            window = min(1024, limit or 1024)
        if limit and window > limit:
            raise click.BadParameter(f"window {window} exceeds the model's {limit} positions", param_hint="--window")
        if stride is None:
            stride = max(1, window // 2)
        if stride > window:
            raise click.BadParameter(f"stride {stride} is larger than window {window}", param_hint="--stride")
        n_win = len(sliding_windows(ids.shape[1], window, stride))
        with Progress(TextColumn("[bold]{task.description:>8}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as bar:
            task = bar.add_task("dense", total=n_win * (len(ks_list) + 1))
            report = evaluate_quality(lm.model, ids, ks_list, window=window, stride=stride,
                                      progress=lambda n, d: bar.update(task, advance=n, description=d))
    except GatherLensError as err:
        raise click.ClickException(str(err)) from None
    source = text_file or corpus
    report.meta.update({"model": lm.name, "text": str(source)})
    table = Table(title=f"{lm.name}: top-k vs dense on {source} ({ids.shape[1]} tokens, window {window}, "
                        f"stride {stride})")
    for col in ("attention", "perplexity", "scored tokens", "mass recall", "min layer recall", "output cosine"):
        table.add_column(col, justify="right")
    fmt = lambda x, p=4: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    for r in report.rows:
        table.add_row(r.setting, fmt(r.perplexity, 3), str(r.tokens), fmt(r.recall), fmt(r.recall_min_layer),
                      fmt(r.cosine))
    Console().print(table)
    if out_path is not None:
        write_report(report, out_path)
        console.print(f"wrote {out_path}")
    if plot_path is not None:
        plot_quality(report, plot_path)
        console.print(f"wrote {plot_path}")
