"""`gatherlens explain "TEXT"`: every gather of a real model on your text, as a report.

    gatherlens explain                                   # SmolLM2 on a default sentence
    gatherlens explain "The capital of France is" --top-k 2 --layer 3 --head 4
    gatherlens explain "你好，世界" --model minilm --lang zh --out report-zh
    gatherlens explain "..." --model ./my-hf-model --out report --force
    gatherlens explain --quantized                       # SmolLM2 run from its GGUF blocks

Runs the model once under `gatherlens.trace()` with top-k attention on, prints a summary to the
terminal (gatherlens.render.summary: tokens and ids, the embedding gather, one query's top-k
keys, the next-token prediction, the table of every gather) and writes a self-contained HTML report with one SVG per
figure to --out (default ./gatherlens-report). The page is explorable offline: pick any layer, head
and query and move k (`gatherlens serve` is the same page, live); texts up to 2,048 tokens (past 128 the page
keeps the 16 query rows around --query). A folder that already holds files is refused
unless --force; --force replaces only the report's own files (index.html, story.json, NN-*.svg,
prefill-map.svg). --quantized runs a GGUF model from its blocks (float32 stays the default); the report
then draws the embedding gather from the quantized table. --sparse-prefill also prefills the text
block-sparsely (ops.prefill.config.TOY): the page gains a section with the key blocks each query block
gathered, for any layer and head, and prefill-map.svg draws --layer's and --head's.
"""
from __future__ import annotations

import os
import shlex
import sys
import time

import click

from gatherlens.commands.params import (Int, check_model, load_kwargs, quantized_option, signals_as_ctrl_c,
                                        sparse_prefill_option)
from gatherlens.i18n import LANGS
from gatherlens.ops.prefill.config import TOY
from gatherlens.report.defaults import DEFAULT_TEXT, LIVE_MAX_TOKENS, MAX_CHARS


def _command_line(text, model, quantized, top_k, layer, head, query, lang, out, sparse_prefill=False) -> str:
    parts = ["gatherlens", "explain", text]
    if model != "smollm2":
        parts += ["--model", model]
    if quantized:
        parts += ["--quantized"]
    if sparse_prefill:
        parts += ["--sparse-prefill"]
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
@quantized_option("The report then draws the embedding gather from the quantized table.")
@click.option("--top-k", "top_k", type=Int(1), default=4, show_default=True,
              help="Keys each query gathers in every attention layer.")
@click.option("--layer", type=Int(), default=None,
              help="Attention layer drawn in detail (default: the middle layer; negative counts "
                   "from the end).")
@click.option("--head", type=Int(), default=0, show_default=True,
              help="Query head drawn in detail (negative counts from the end).")
@click.option("--query", type=Int(), default=-1, show_default=True,
              help="Token position whose value gather is drawn (-1 = the last token).")
@click.option("--lang", type=click.Choice(LANGS), default="en", show_default=True,
              help="Language of the report and its captions.")
@click.option("--out", "out", type=click.Path(file_okay=False), default="gatherlens-report",
              show_default=True, help="Folder for index.html, story.json and the SVG figures.")
@click.option("--force", is_flag=True,
              help="Write into a folder that already holds files (replaces only report files).")
@sparse_prefill_option("The page gains a map of the key blocks each query block gathered, for any layer and head "
                       "(prefill-map.svg in --out: --layer's and --head's).")
@click.option("--backends", "show_backends", is_flag=True,
              help="Also print which implementation of each native operator ran, and why the others did not "
                   "(for developers).")
def explain(text, model, quantized, top_k, layer, head, query, lang, out, force, sparse_prefill=False,
            show_backends=False):
    """Explain every gather a real model runs on TEXT.

    TEXT defaults to "The cat sat on the mat because it was". Writes --out/index.html (one
    offline page), story.json and one SVG per figure, and prints a summary here.
    """
    # Before torch loads OpenMP: idle threads sleep instead of spinning. On a busy machine spinning
    # threads fight the other jobs for the cores and a forward pass gets many times slower.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from rich.console import Console

    from gatherlens.errors import GatherLensError
    from gatherlens.outputs import writable_dir
    from gatherlens.render.summary import print_summary
    from gatherlens.report.build import check_out_dir
    from gatherlens.report.records import explain_summary

    err = Console(stderr=True, log_path=False)
    _check_text(text)
    try:
        check_out_dir(out, force)  # fail before the model loads, not after
        load_kw = load_kwargs(model, quantized)
        check_model(model)
        writable_dir(out, "--out")
    except GatherLensError as e:
        raise click.ClickException(str(e)) from None
    t0 = time.perf_counter()
    options = dict(top_k=top_k, layer=layer, head=head, query=query, lang=lang, force=force,
                   sparse_prefill=sparse_prefill, quantized=quantized, load_kw=load_kw)
    try:
        with signals_as_ctrl_c() as stop, err.status("loading the model", spinner="dots") as status:
            def say(message: str) -> None:
                status.update(f"[bold]{message}[/] [dim]({time.perf_counter() - t0:.1f} s)[/]")

            story, paths, ran = _run(text, model, out, options, say, err)
    except GatherLensError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:   # Ctrl-C, kill (SIGTERM), a closed terminal (SIGHUP): the report is whole or absent
        raise click.ClickException(f"stopped ({stop['signal'] or 'Ctrl-C'}) before the report was complete: "
                                   f"nothing was written to {str(out)!r} (an earlier report there is as it was)") \
            from None
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 110)
    print_summary(explain_summary(story), paths, console, lang)
    for line in _closing_lines(ran if show_backends else "", story, time.perf_counter() - t0):
        err.log(line)


def _check_text(text: str) -> None:
    """An empty TEXT, or one past MAX_CHARS, refused before the model loads (the token limit comes after)."""
    if not text.strip():
        raise click.BadParameter("TEXT is empty; give a sentence, or leave it out for the default",
                                 param_hint="TEXT")
    if len(text) > MAX_CHARS:
        raise click.BadParameter(f"TEXT has {len(text):,} characters; the explorer takes up to {MAX_CHARS:,} "
                                 f"(and {LIVE_MAX_TOKENS:,} tokens): shorten it, or run it with gatherlens generate",
                                 param_hint="TEXT")


def _run(text: str, model: str, out: str, o: dict, say, err):
    """Load, collect the story, write the report (whole, or not at all): (story, paths, what ran)."""
    from gatherlens.models import load
    from gatherlens.models.files.integrity import require_finite
    from gatherlens.ops import backends
    from gatherlens.report.build import story_data, write_report
    from gatherlens.report.collect import collect

    say(f"loading {model} from its GGUF blocks" if o["quantized"] else
        f"loading {model} (the first SmolLM2 load converts its GGUF file once)")
    lm = load(model, progress=say, **o["load_kw"])
    err.log(f"loaded {lm.name} in {lm.seconds:.1f} s" + (" (from the converted copy in the cache)" if lm.from_cache
                                                           else ""))
    backends.reset_ran()  # what ran for this text only
    story = collect(lm, text, top_k=o["top_k"], layer=o["layer"], head=o["head"], query=o["query"], say=say,
                    prefill=TOY if o["sparse_prefill"] else None)
    ran = backends.describe()  # which row of each native operator's table ran, and why others did not
    require_finite(story_data(story), "the report's numbers (story.json)")
    say("drawing the figures and writing the report")
    command = _command_line(text, model, o["quantized"], o["top_k"], o["layer"], o["head"], o["query"], o["lang"],
                            out, o["sparse_prefill"])
    return story, write_report(story, out, lang=o["lang"], force=o["force"], command=command), ran


def _closing_lines(ran: str, story, seconds: float) -> list[str]:
    """What the command says after the summary: which backends ran (with --backends), what --sparse-prefill
    kept, the time."""
    lines = [f"backend {line}" for line in ran.splitlines()]
    return lines + ([_prefill_line(story)] if story.prefill is not None else []) + [f"done in {seconds:.1f} s"]


def _prefill_line(story) -> str:
    """One line on what --sparse-prefill kept (the report's prefill section draws it)."""
    maps = story.prefill
    if not maps.selections:
        return f"sparse prefill: {story.model_name} is an encoder (no causal prefill): no block map"
    layer = maps.layer_near(story.attention.layer)
    return (f"sparse prefill: {maps.kept_share():.0%} of the causal key blocks gathered over {len(maps.layers)} "
            f"layers (prefill-map.svg: layer {layer})")


if __name__ == "__main__":  # pragma: no cover
    explain(sys.argv[1:])
