"""`gatherlens generate`: continue a text with sparse decoding, live, and draw which pages it read.

    gatherlens generate "It is a truth universally acknowledged" --max-new-tokens 40
    gatherlens generate --file chapter.txt --pages pages.svg        # the auto budget (the default)
    gatherlens generate --file chapter.txt --budget 512             # a fixed budget of 512 tokens
    gatherlens generate "Once upon a time" --dense
    gatherlens generate "Once upon a time" --quantized     # SmolLM2 run from its GGUF blocks
    gatherlens generate --file chapter.txt --kv-dtype float16   # the paged cache in 16 bits (int8: 8)
    gatherlens generate "What is a gather?" --chat --quantized  # through the model's chat template
    gatherlens generate "Once upon a time" --temperature 0.8 --top-k 40 --seed 1   # sampled (greedy by default)

The continuation streams as it is generated, with tokens/s and the context length; Ctrl-C (or
SIGTERM, SIGHUP) stops cleanly, prints what was generated so far and still writes --pages. A text longer than the model's positions keeps
its end, with a warning saying how many tokens were dropped. --pages FILE.svg|.html draws, for
every layer, which pages of the KV cache each decode step read (pages x steps). With --quantized
the model reads its GGUF in place: the file changed or cut short meanwhile ends the run with one
`Error: the model file ... changed while in use` line and exit 1 (gatherlens.models.files.watch).
The work is done by gatherlens.models.runtime.streaming; this module parses and prints.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click

from gatherlens.commands.params import (
    Budget, Int, kv_dtype_option, load_kwargs, output_file, quantized_option, require_causal, sampling_options,
    signals_as_ctrl_c, sparse_prefill_option,
    threads_option,
)
from gatherlens.drawable import picture_suffixes
from gatherlens.i18n import LANGS
from gatherlens.ops.sampling.config import GREEDY
from gatherlens.ops.sparse.config import DEFAULT


def _prompt_text(prompt: str | None, file: str | None) -> str:
    if (prompt is None) == (file is None):
        raise click.UsageError("give the text either as PROMPT or with --file FILE (one of the two)")
    if file is not None:
        from gatherlens.eval.corpus import load_text

        return load_text(path=file)
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="PROMPT")
    return prompt


@click.command("generate")
@click.argument("prompt", required=False)
@click.option("--file", "file", type=click.Path(dir_okay=False), default=None, help="Read the prompt from a UTF-8 text file.")
@click.option("--model", "model_name", default="smollm2", show_default=True,
              help='"smollm2" or a local Llama-family folder / .gguf file.')
@quantized_option()
@click.option("--budget", type=Budget(), default=None,
              help=f'"auto" (pages until their estimated attention mass reaches {DEFAULT.mass}, '
                   f'{DEFAULT.min_pages}..{DEFAULT.max_pages} pages) or tokens each decode step reads per '
                   f'selection head (default: {DEFAULT.budget}).')
@click.option("--dense", is_flag=True, help="Decode densely (transformers' default path) instead.")
@kv_dtype_option
@sparse_prefill_option()
@click.option("--max-new-tokens", default=64, show_default=True, type=Int(1), help="Tokens to generate.")
@click.option("--pages", "pages", default=None, help="Write the pages x steps picture to FILE.svg or FILE.html.")
@click.option("--lang", type=click.Choice(LANGS), default="en", show_default=True, help="Language of the picture.")
@threads_option
@click.option("--force", is_flag=True, help="Overwrite the --pages file if it exists.")
@click.option("--chat", is_flag=True,
              help="Send PROMPT as a user's message through the model's chat template (its GGUF's "
                   "tokenizer.chat_template) and stop at the template's end of turn.")
@click.option("--system", default=None, help="With --chat: a system message before PROMPT.")
@sampling_options(GREEDY)
def generate(prompt, file, model_name, quantized, budget, dense, kv_dtype, max_new_tokens, pages, lang, threads, force,
             sparse_prefill=False, chat=False, system=None, sampling=GREEDY):
    """Continue PROMPT with sparse decoding, streaming tokens/s and the context length (greedy unless
    given --temperature and the other sampling options)."""
    from rich.console import Console

    from gatherlens.errors import GatherLensError

    if dense and budget is not None:
        raise click.UsageError("--budget and --dense exclude each other")
    if dense and kv_dtype is not None:
        raise click.UsageError("--kv-dtype and --dense exclude each other (dense decoding keeps transformers' cache)")
    if system is not None and not chat:
        raise click.UsageError("--system needs --chat (a system message belongs to a chat)")
    pages_path = output_file(pages, force, picture_suffixes("svg", "html"), "--pages")
    text = _prompt_text(prompt, file)
    load_kw = load_kwargs(model_name, quantized)  # before the model loads
    require_causal(model_name, "generate")
    if quantized:  # only text is generated: gatherlens' own runtime where it runs the file (models/loading.py)
        from gatherlens.models.loading import TEXT_RUNTIME

        load_kw["runtime"] = "transformers" if sparse_prefill else TEXT_RUNTIME
    err = Console(stderr=True)
    try:
        with signals_as_ctrl_c() as stop:   # kill (SIGTERM) or a closed terminal (SIGHUP): as Ctrl-C
            result = _run(text, (model_name, load_kw), budget, dense, max_new_tokens, pages_path is not None,
                          threads, kv_dtype, sparse_prefill=sparse_prefill, sampling=sampling,
                          chat=_messages(text, system) if chat else None)
    except GatherLensError as e:
        raise click.ClickException(str(e)) from None
    _summary(result, err, stop["signal"] or "Ctrl-C")
    if pages_path is not None:
        try:  # checked again as it is written: a file made meanwhile is kept unless --force
            _write_pages(result, pages_path, lang, force, err)
        except GatherLensError as e:
            raise click.ClickException(str(e)) from None


def _messages(text: str, system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def _prompt_ids(lm, text: str, chat: list | None):
    """The prompt's ids (1, S) and the stop ids: the text as is (the model's EOS), or the chat through the
    model's template (its end of turn)."""
    if chat is None:
        return lm.encode(text, truncation=False), None
    from gatherlens.models.runtime.chat import chat_prompt, chat_template_of

    template = chat_template_of(lm)
    return chat_prompt(lm, chat, template), template.stop_ids


def _run(text: str, model: tuple[str, dict], budget, dense: bool, max_new_tokens: int, pages: bool, threads,
         kv_dtype: str | None = None, sparse_prefill: bool = False, sampling=None, chat: list | None = None):
    """Load (model: the name and load()'s keywords), fit the prompt to the model's positions, stream
    the continuation under a live status line."""
    from rich.live import Live

    from gatherlens.errors import GatherLensWarning
    from gatherlens.models import load
    from gatherlens.models.runtime.generation import require_causal
    from gatherlens.models.runtime.streaming import fit_prompt, stream_generate
    from gatherlens.models.runtime.threads import fix_threads

    if threads:
        fix_threads(threads)  # the user's count: the thread controller stays off
    lm = load(model[0], progress=True, **model[1])
    require_causal(lm)
    if sparse_prefill:  # every prefill block-sparse (models/attention/prefill.py); decoding as chosen
        from gatherlens.models.attention.prefill import use_sparse_prefill

        use_sparse_prefill(lm.model)
    ids, stop = _prompt_ids(lm, text, chat)
    ids, dropped = fit_prompt(lm, ids, max_new_tokens)
    if dropped:
        warnings.warn(f"the prompt has {ids.shape[1] + dropped} tokens; kept its last {ids.shape[1]} (dropped "
                      f"{dropped} from the start) so that it and {max_new_tokens} new tokens fit the model's "
                      f"{lm.config.max_position_embeddings} positions", GatherLensWarning, stacklevel=1)
    budget = None if dense else (budget or DEFAULT.budget)  # the one SparseConfig's default
    sparse = {} if dense else {"kv_dtype": kv_dtype or DEFAULT.kv_dtype}  # SparseConfig.kv_dtype
    sparse.update(sampling=sampling, stop=stop)
    if not sys.stdout.isatty():  # a pipe or a test: the plain continuation on stdout, stats at the end
        return stream_generate(lm, ids, budget, max_new_tokens, pages=pages, on_token=_write, **sparse)
    view = _LiveView(budget)
    with Live(view.render(None), transient=False, refresh_per_second=8, redirect_stdout=False) as live:
        return stream_generate(lm, ids, budget, max_new_tokens, pages=pages,
                               on_token=lambda piece, r: live.update(view.render(r, piece)), **sparse)


def _write(piece: str, result) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


class _LiveView:
    """The continuation so far and one status line under it (tokens/s, context length)."""

    def __init__(self, budget):
        from rich.text import Text

        self.text, self.how = Text(), "dense" if budget is None else f"sparse, budget {budget}"
        self.budget = budget

    def render(self, result, piece: str = ""):
        from rich.console import Group

        self.text.append(piece)
        if result is None:
            return Group(self.text, f"[dim]prefill ({self.how})…[/]")
        speed = f"{result.tokens_per_s:.1f} tokens/s" if result.tokens_per_s else "first token"
        return Group(self.text, f"[dim]{speed} · context {result.context} tokens · "
                                f"{len(result.new_ids)} new · {self.how}[/]")


def _summary(result, err, stopped_by: str = "Ctrl-C") -> None:
    if not sys.stdout.isatty():
        sys.stdout.write("\n")
    speed = f", {result.tokens_per_s:.2f} tokens/s" if result.tokens_per_s else ""
    head = f"stopped ({stopped_by}) after" if result.stopped else "generated"
    err.print(f"{head} {len(result.new_ids)} tokens{speed}; context {result.context} tokens "
              f"(prompt {result.prompt_tokens}, prefill {result.prefill_seconds:.2f} s)")
    read = result.pages_per_step()
    if read is not None:
        err.print(f"pages read per step and head: mean {read['mean']:.1f} (min {read['min']}, max {read['max']}) "
                  f"of {read['of']}, over {read['steps']} steps x {read['layers']} "
                  f"sparse layers x {read['heads']} heads")


def _write_pages(result, path: Path, lang: str, force: bool, err) -> None:
    from gatherlens.outputs import write_output
    from gatherlens.render import picture_file
    from gatherlens.render.page_trace import page_trace_html, page_trace_svg

    if result.trace is None:
        err.print("no picture: fewer than two tokens were generated, so no decode step read any page")
        return
    picture = picture_file(path.suffix, lambda: page_trace_svg(result.trace, lang=lang),
                           lambda: page_trace_html(result.trace, lang=lang))
    write_output(path, picture, "--pages", force=force)
    err.print(f"wrote {path}")
