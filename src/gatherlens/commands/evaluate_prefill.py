"""`gatherlens eval-prefill`: how much block-sparse prefill changes a real model, against a dense prefill.

    gatherlens eval-prefill                                  # SmolLM2, 8K of Austen: both rules against dense
    gatherlens eval-prefill --rules antidiagonal --threshold 0.9 --json prefill.json
    gatherlens eval-prefill --context 2048 --scored 128 --greedy 8 --passkey-trials 0

One prefill forward of the first --context tokens of the text scores its last --scored tokens
(perplexity, and its ratio to dense with a 95% interval), then --greedy tokens are decoded densely
from its complete cache (agreement with dense's); a passkey prompt of --passkey-context tokens is
answered --passkey-trials times. Rules: the presets of gatherlens.ops.prefill.config (antidiagonal,
pooled), with --threshold / --budget / --block-size applied to each. The metrics live in
gatherlens.eval.prefill_quality.
"""
from __future__ import annotations

import time

import click

from gatherlens.params import Real
from gatherlens.commands.params import (
    Int, load_kwargs, number, output_file, print_table, quantized_option, require_causal, text_source_options,
    threads_option,
)


@click.command("eval-prefill")
@text_source_options('"smollm2" or a local Hugging Face Llama-family folder / .gguf file.')
@quantized_option()
@click.option("--context", default=8192, show_default=True, type=Int(64), help="Tokens of the scored context.")
@click.option("--scored", default=512, show_default=True, type=Int(1), help="Last tokens of the context scored.")
@click.option("--greedy", default=32, show_default=True, type=Int(0), help="Greedy tokens compared after it.")
@click.option("--passkey-context", default=8192, show_default=True, type=Int(64), help="Tokens of each passkey prompt.")
@click.option("--passkey-trials", default=5, show_default=True, type=Int(0), help="Passkey prompts (0: none).")
@click.option("--passkey-dense/--no-passkey-dense", default=True, show_default=True,
              help="Also answer the passkey prompts with a dense prefill (the baseline row).")
@click.option("--rules", default="antidiagonal,pooled", show_default=True,
              help="Comma-separated rules (presets of gatherlens.ops.prefill.config), one row each.")
@click.option("--threshold", default=None, type=Real(0, 1, min_open=True),
              help="Share of the estimated mass each query block keeps (default: the preset's).")
@click.option("--budget", default=None, type=Int(1), help="Most key blocks per query block (default: none).")
@click.option("--block-size", default=None, type=Int(1), help="Tokens per block (default: the preset's).")
@threads_option
@click.option("--json", "json_out", default=None, help="Write rows and meta to a .json file.")
@click.option("--force", is_flag=True, help="Overwrite the --json file if it exists.")
def evaluate_prefill(model_name, corpus, text_file, quantized, context, scored, greedy, passkey_context,
                     passkey_trials, passkey_dense, rules, threshold, budget, block_size, threads, json_out, force):
    """Perplexity, greedy agreement and passkey: sparse prefill against dense."""
    from rich.console import Console

    from gatherlens.errors import GatherLensError

    configs = _configs(rules, threshold, budget, block_size)
    if scored >= context:
        raise click.BadParameter(f"{scored} must be smaller than --context {context}", param_hint="--scored")
    json_path = output_file(json_out, force, (".json",), "--json")
    load_kw = load_kwargs(model_name, quantized)
    require_causal(model_name, "eval-prefill")
    console = Console(stderr=True)
    t0 = time.perf_counter()
    try:
        lm, ids = _load(model_name, load_kw, corpus, text_file, context, threads,
                        passkey_context if passkey_trials else 0)
        from gatherlens.eval.prefill_quality import evaluate_prefill_quality

        report = evaluate_prefill_quality(lm.model, lm.tokenizer, ids, configs, scored=scored, greedy=greedy,
                                          passkey_context=passkey_context if passkey_trials else None,
                                          trials=passkey_trials, passkey_dense=passkey_dense,
                                          progress=lambda m: console.log(m))
    except GatherLensError as err:
        raise click.ClickException(str(err)) from None
    report.meta.update(model=lm.name, text=text_file or corpus, seconds=round(time.perf_counter() - t0, 1))
    _print(report, f"{lm.name}: sparse prefill vs dense, {report.meta['text']}, context {ids.shape[1]}, "
                   f"last {scored} scored")
    if json_path is not None:
        from gatherlens.eval.io import write_table
        from gatherlens.eval.prefill_quality import COLUMNS

        write_table(json_path, report.as_dicts(), COLUMNS, report.meta, force=force, what="--json")
        console.print(f"wrote {json_path}")
    console.log(f"done in {report.meta['seconds']} s")


def _configs(rules: str, threshold, budget, block_size) -> dict:
    """{rule name: PrefillConfig} from --rules and the overrides (a clear error for an unknown rule)."""
    from gatherlens.errors import GatherLensError
    from gatherlens.ops.prefill.config import PRESETS

    names = [r.strip() for r in rules.split(",") if r.strip()]
    bad = [n for n in names if n not in PRESETS]
    if bad or not names:
        raise click.BadParameter(f"{rules!r}: give rules from {', '.join(PRESETS)}", param_hint="--rules")
    changes = {k: v for k, v in (("threshold", threshold), ("budget", budget), ("block_size", block_size))
               if v is not None}
    try:
        return {n: PRESETS[n].replace(min_length=0, **changes) for n in names}
    except GatherLensError as err:  # named by the option it came from ("block_size = 7 must be ...")
        field = next((k for k in changes if str(err).startswith(f"{k} ")), None)
        hint = "--rules" if field is None else f"--{field.replace('_', '-')}"
        raise click.BadParameter(str(err), param_hint=hint) from None


def _load(model_name: str, load_kw: dict, corpus: str, text_file, context: int, threads, passkey_context: int = 0):
    """The model and the first `context` token ids (1, S) of the text; an error if it is shorter."""
    from gatherlens.eval.corpus import load_text
    from gatherlens.models import load
    from gatherlens.models.runtime.threads import fix_threads

    if threads:
        fix_threads(threads)
    text = load_text(corpus, path=text_file)
    lm = load(model_name, progress=True, **load_kw)
    limit = getattr(lm.config, "max_position_embeddings", None)
    for hint, tokens in (("--context", context), ("--passkey-context", passkey_context)):
        if limit and tokens > limit:
            raise click.BadParameter(f"{tokens} tokens exceed the model's {limit} positions ({lm.name})",
                                     param_hint=hint)
    ids = lm.encode(text, truncation=False)[:, :context]                      # (1, S)
    if ids.shape[1] < context:
        raise click.BadParameter(f"the text has only {ids.shape[1]} tokens; lower --context", param_hint="--context")
    return lm, ids


def _print(report, title: str) -> None:
    rows = []
    for r in report.rows:
        ci = "-" if r.ppl_ratio_ci is None else f"[{r.ppl_ratio_ci[0]:.4f}, {r.ppl_ratio_ci[1]:.4f}]"
        passkey = "-" if r.passkey_trials is None else f"{r.passkey_ok}/{r.passkey_trials}"
        agree = "-" if r.agree_tokens is None else f"{r.agree_tokens}/{len(r.greedy)} (lead {r.agree_prefix}" + (
            ")" if r.agree_margin is None else f", gap {r.agree_margin:.2f})")
        rows.append([r.setting, number(r.perplexity, 3), number(r.ppl_ratio), ci, number(r.top1_agree), agree, passkey,
                     number(r.kept_share, 3), number(r.prefill_s, 1)])
    print_table(title, ("setting", "ppl", "ratio", "95% interval", "top-1 agree", "greedy agree", "passkey", "kept",
                        "prefill s"), rows)
