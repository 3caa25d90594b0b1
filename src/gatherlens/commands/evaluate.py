"""`gatherlens eval`: how much top-k attention changes a real model, on real text.

    gatherlens eval                                   # SmolLM2 on Pride and Prejudice, k = 8,32,128,512,
                                                      # 2048 tokens, windows of 1024 every 512
    gatherlens eval --corpus pydoc -k 16,64 --tokens 1024 --out q.json --plot q.png
    gatherlens eval --text my.txt --window 256 --stride 128 --out q.csv

Prints a table (perplexity over a sliding window, attention-mass recall, output cosine to dense)
for dense attention and each k; --out writes CSV or JSON by extension, --plot a PNG. Existing
files are not overwritten without --force. The metrics live in gatherlens.eval.topk_quality.
"""
from __future__ import annotations

import click

from gatherlens.commands.params import (
    Int, check_model, number, output_file, positive_ints, print_table, progress_bar, text_source_options,
)


@click.command("eval")
@text_source_options('"smollm2", "minilm", or a local Hugging Face folder / .gguf file.')
@click.option("-k", "--top-k", "ks", multiple=True, help="k values, comma-separated or repeated (-k 8 -k 32)  "
              "[default: 8,32,128,512].")
@click.option("--tokens", default=2048, show_default=True, type=Int(2),
              help="Score the first N tokens of the text.")
@click.option("--window", default=None, type=Int(2),
              help="Context window of each forward pass  [default: 1024, or the model's limit].")
@click.option("--stride", default=None, type=Int(1),
              help="Step between windows; each token then has >= window - stride tokens of context "
                   "[default: window / 2].")
@click.option("--out", "out", default=None, help="Write the results to a .csv or .json file.")
@click.option("--plot", "plot", default=None, help="Write a plot to a .png file.")
@click.option("--force", is_flag=True, help="Overwrite --out / --plot files that exist.")
def evaluate(model_name, corpus, text_file, ks, tokens, window, stride, out, plot, force):
    """Perplexity, attention-mass recall and output cosine: top-k attention against dense."""
    from rich.console import Console

    from gatherlens.errors import GatherLensError
    from gatherlens.models.files.integrity import require_finite

    # -k "": an error, not the default
    ks_list = positive_ints(",".join(ks) if ks else "8,32,128,512", "-k/--top-k", "k")
    check_model(model_name)
    if window is not None and stride is not None and stride > window:
        raise click.BadParameter(f"stride {stride} is larger than window {window}", param_hint="--stride")
    out_path = output_file(out, force, (".csv", ".json"), "--out")
    plot_path = output_file(plot, force, (".png",), "--plot")
    console = Console(stderr=True)
    try:
        lm, ids = _load(model_name, corpus, text_file, tokens)
        window, stride = _window_and_stride(lm, window, stride)
        report = _measure(lm, ids, ks_list, window, stride, console)
        require_finite([vars(r) for r in report.rows], "the eval results")
    except GatherLensError as err:
        raise click.ClickException(str(err)) from None
    source = text_file or corpus
    report.meta.update({"model": lm.name, "text": str(source)})
    print_table(f"{lm.name}: top-k vs dense on {source} ({ids.shape[1]} tokens, window {window}, stride {stride})",
                ("attention", "perplexity", "scored tokens", "mass recall", "min layer recall", "output cosine"),
                [[r.setting, number(r.perplexity, 3), str(r.tokens), number(r.recall), number(r.recall_min_layer),
                  number(r.cosine)] for r in report.rows])
    _write(report, out_path, plot_path, console, force)


def _load(model_name: str, corpus: str, text_file: str | None, tokens: int):
    """The model and the first `tokens` token ids (1, N) of the text."""
    from gatherlens.eval.corpus import load_text
    from gatherlens.models import load

    text = load_text(corpus, path=text_file)
    lm = load(model_name, progress=True)
    ids = lm.encode(text[: tokens * 12])                                   # (1, N'): ~4 chars a token
    if ids.shape[1] < tokens and len(text) > tokens * 12:
        ids = lm.encode(text)
    return lm, ids[:, :tokens]                                             # (1, N)


def _window_and_stride(lm, window: int | None, stride: int | None) -> tuple[int, int]:
    """--window (default 1024 or the model's limit) and --stride (default window / 2), checked."""
    limit = getattr(lm.config, "max_position_embeddings", None)
    if window is None:
        window = min(1024, limit or 1024)
    if limit and window > limit:
        raise click.BadParameter(f"window {window} exceeds the model's {limit} positions", param_hint="--window")
    if stride is None:
        stride = max(1, window // 2)
    if stride > window:
        raise click.BadParameter(f"stride {stride} is larger than window {window}", param_hint="--stride")
    return window, stride


def _measure(lm, ids, ks: list[int], window: int, stride: int, console):
    """evaluate_quality under a progress bar (one step per window and setting)."""
    from gatherlens.eval.topk_quality import evaluate_quality, sliding_windows

    n_win = len(sliding_windows(ids.shape[1], window, stride))
    with progress_bar(console, n_win * (len(ks) + 1)) as advance:
        return evaluate_quality(lm.model, ids, ks, window=window, stride=stride, progress=advance)


def _write(report, out_path, plot_path, console, force: bool) -> None:
    """Without --force a file made since the check at the start is refused, not overwritten."""
    from gatherlens.errors import GatherValueError
    from gatherlens.eval.io import write_report
    from gatherlens.eval.plot import plot_quality

    try:
        if out_path is not None:
            write_report(report, out_path, force=force, what="--out")
            console.print(f"wrote {out_path}")
        if plot_path is not None:
            plot_quality(report, plot_path, force=force, what="--plot")
            console.print(f"wrote {plot_path}")
    except GatherValueError as err:
        raise click.ClickException(str(err)) from None
