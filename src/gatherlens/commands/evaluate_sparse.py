"""`gatherlens eval-sparse`: how much page-selected sparse decoding changes a real model.

    gatherlens eval-sparse                                   # the comparison table: SmolLM2, 8K of Austen
    gatherlens eval-sparse --budgets 256,512,1024,2048       # one row per budget, default settings
    gatherlens eval-sparse --context 2048 --budgets 128,512 --decode-tokens 64 --passkey-trials 2
    gatherlens eval-sparse --json q.json --csv q.csv --pictures figs/ --force
    gatherlens eval-sparse --budgets 512 --kv-dtype float16,int8   # pages in 16 / 8 bits: their own rows
    gatherlens eval-sparse --budgets auto,512,256 --greedy 64 --no-recall   # the auto budget; agreement only

The first context - N tokens of the text are prefilled densely once; the last N (--decode-tokens)
are decoded one step at a time, teacher-forced, from a copy of that cache, with dense attention
and with each setting. Without --budgets the settings are the comparison table (eval.sparse_
quality.comparison_setups: Quest's plain setting at --compare's first budget, one change at a
time, the oracle, the default; then the second budget); with --budgets, one row per budget with
--page-size, --dense-layers, --recent, --group-score, --per-head. --kv-dtype adds, for each storage
dtype it lists, every row again with pages stored so and a dense row over such pages (the
comparison table: float32, float16, bfloat16, int8 at the first budget). Prints perplexity and its ratio
to dense (with a 95% interval), teacher-forced top-1 agreement with dense, the greedy tokens equal to
dense's before the first divergence (--greedy of them) and dense's logit gap there, the pages a head
read per step, attention-mass recall, output cosine (--no-recall skips those two and runs the fast
paths), passkey trials retrieved (a 5-digit number hidden at spread depths in --context tokens of
filler, greedy generation).
--pictures DIR saves, per setting, an SVG and HTML of the pages one layer / KV head read at the
last decode step. The metrics live in gatherlens.eval.sparse_quality / passkey.
"""
from __future__ import annotations

import re
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import click

from gatherlens.commands.params import (
    Int, budget_list, number, output_file, positive_ints, print_table, progress_bar, require_causal,
    text_source_options, threads_option,
)
from gatherlens.ops.sparse.config import DEFAULT, GROUP_SCORES, KV_DTYPES
from gatherlens.errors import GatherValueError
from gatherlens.outputs import output_dir, write_output


@dataclass
class _Plan:
    """What eval-sparse measures, from its options."""

    budgets: list
    context: int
    page_size: int
    decode_tokens: int
    passkey_trials: int
    dense_layers: int
    share_selection: bool
    setups: list = field(default_factory=list)
    greedy: int = 0
    recall: bool = True


@click.command("eval-sparse")
@text_source_options('"smollm2" or a local Hugging Face Llama-family folder / .gguf file.')
@click.option("--context", default=8192, show_default=True, type=Int(64),
              help="Tokens of context (prefix + decoded tokens; also the passkey prompt length).")
@click.option("--budgets", default=None,
              help='Comma-separated token budgets or "auto", one row each with the settings below (default: the '
                   'comparison table).')
@click.option("--compare", default="512,256", show_default=True,
              help="The comparison table's two budgets: every setting at the first, the main ones at the second.")
@click.option("--page-size", default=DEFAULT.page_size, show_default=True, type=Int(1),
              help="Tokens per page (with --budgets).")
@click.option("--decode-tokens", default=512, show_default=True, type=Int(0),
              help="Last N tokens of the context decoded step by step and scored; 0 skips perplexity.")
@click.option("--passkey-trials", default=5, show_default=True, type=Int(0),
              help="Passkey prompts (needle depths spread over the context); 0 skips the test.")
@click.option("--greedy", default=32, show_default=True, type=Int(0),
              help="Greedy tokens after the prefix compared with dense's (first divergence and its margin); 0: none.")
@click.option("--recall/--no-recall", default=True, show_default=True,
              help="Measure attention-mass recall and output cosine (observers: slower paths).")
@click.option("--dense-layers", default=DEFAULT.dense_layers, show_default=True, type=Int(0),
              help="Leading layers that decode densely (Quest keeps 2; with --budgets).")
@click.option("--recent", default=DEFAULT.recent, type=Int(0),
              help="Newest tokens always read, within the budget (with --budgets; default: a quarter of it).")
@click.option("--group-score", type=click.Choice(GROUP_SCORES), default=DEFAULT.group_score, show_default=True,
              help="How a KV group's heads' page bounds combine (with --budgets).")
@click.option("--per-head/--shared", default=not DEFAULT.share_selection, show_default=True,
              help="Each query head chooses its pages, or one choice per KV group (with --budgets).")
@click.option("--kv-dtype", "kv_dtypes", default=None,
              help=f"Comma-separated page storage dtypes ({', '.join(KV_DTYPES)}): each adds its rows "
                   f"(default: none with --budgets, every one in the comparison table).")
@threads_option
@click.option("--json", "json_out", default=None, help="Write rows, passkey trials and meta to a .json file.")
@click.option("--csv", "csv_out", default=None, help="Write the table to a .csv file.")
@click.option("--pictures", "pictures", default=None, type=click.Path(file_okay=False),
              help="Folder for SVG/HTML pictures of the pages one layer read (one per budget).")
@click.option("--layer", default=None, type=Int(),
              help="Layer to draw (default: the middle one; negative counts from the end).")
@click.option("--head", default=0, show_default=True, type=Int(),
              help="KV group (or query head) to draw; negative counts from the end.")
@click.option("--force", is_flag=True, help="Overwrite output files that exist.")
def evaluate_sparse(model_name, corpus, text_file, context, budgets, compare, page_size, decode_tokens,
                    passkey_trials, dense_layers, recent, group_score, per_head, kv_dtypes, threads, json_out,
                    csv_out, pictures, layer, head, force, greedy=32, recall=True):
    """Perplexity, attention-mass recall, output cosine and passkey: sparse decoding against dense."""
    from rich.console import Console

    from gatherlens.errors import GatherLensError
    from gatherlens.models.files.integrity import require_finite

    plan = _plan(budgets, compare, context, page_size, decode_tokens, passkey_trials, dense_layers, recent,
                 group_score, per_head, _kv_dtypes(kv_dtypes))
    plan.greedy, plan.recall = greedy, recall
    _check_plan(plan)
    json_path = output_file(json_out, force, (".json",), "--json")
    csv_path = output_file(csv_out, force, (".csv",), "--csv")
    pic_dir = _picture_folder(pictures, force)
    require_causal(model_name, "eval-sparse")
    console = Console(stderr=True)
    try:
        lm, ids = _load(model_name, corpus, text_file, context, threads)
        draw_layer = layer if layer is not None else lm.config.num_hidden_layers // 2
        n = lm.config.num_hidden_layers
        if not -n <= draw_layer < n:  # one policy with explain: [-n, n), negatives from the end
            raise click.BadParameter(f"layer {draw_layer} is outside [{-n}, {n})", param_hint="--layer")
        draw_layer %= n
        if pic_dir is not None:
            _check_head(lm.config, plan, head)
        report, passkeys, last = _measure(lm, ids, plan, draw_layer, console)
    except GatherLensError as err:
        raise click.ClickException(str(err)) from None
    meta, rows = _results(lm, text_file or corpus, ids, plan, report, passkeys)
    require_finite(rows, "the eval results")  # NaN/inf: an error naming where, nothing written
    _print(rows, f"{lm.name}: sparse decoding vs dense, {meta['text']}, context {ids.shape[1]}, "
                 f"{decode_tokens} decoded tokens, page {page_size}")
    _write(json_path, csv_path, meta, rows, passkeys, console, force)
    if pic_dir is not None:
        _pictures(pic_dir, last, draw_layer, head, console, force)


def _kv_dtypes(text: str | None) -> tuple[str, ...] | None:
    """--kv-dtype's list of storage dtypes, each one of KV_DTYPES (None when not given)."""
    if text is None:
        return None
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in KV_DTYPES]
    if bad or not names:
        raise click.BadParameter(f"{text!r}: give storage dtypes from {', '.join(KV_DTYPES)}, like float16,int8",
                                 param_hint="--kv-dtype")
    return names


def _plan(budgets, compare, context, page_size, decode_tokens, passkey_trials, dense_layers, recent, group_score,
          per_head, kv_dtypes=None) -> _Plan:
    """The settings to measure: the comparison table, or one row per --budgets budget (each again per --kv-dtype)."""
    from gatherlens.eval.sparse_quality import KV_PAGE_ROWS, comparison_setups, kv_dtype_setups, setups_for_budgets

    if budgets is None:
        pair = positive_ints(compare, "--compare", "budget")
        if len(pair) != 2:
            raise click.BadParameter(f"{compare!r}: give two budgets, like 512,256", param_hint="--compare")
        return _Plan(pair, context, page_size, decode_tokens, passkey_trials, dense_layers, not per_head,
                     comparison_setups(pair[1], pair[0], kv_dtypes or KV_PAGE_ROWS))
    listed = budget_list(budgets, "--budgets")
    setups = setups_for_budgets(listed, page_size=page_size, dense_layers=dense_layers, recent=recent,
                                group_score=group_score, share_selection=not per_head)
    setups += kv_dtype_setups(setups, kv_dtypes) if kv_dtypes else []
    return _Plan(listed, context, page_size, decode_tokens, passkey_trials, dense_layers, not per_head, setups)


def _check_plan(plan: _Plan) -> None:
    if not plan.decode_tokens and not plan.passkey_trials:
        raise click.BadParameter("nothing to measure: --decode-tokens 0 and --passkey-trials 0",
                                 param_hint="--decode-tokens")
    if plan.decode_tokens >= plan.context:
        raise click.BadParameter(f"{plan.decode_tokens} must be smaller than --context {plan.context}",
                                 param_hint="--decode-tokens")


def _check_head(config, plan: _Plan, head: int) -> None:
    """--head against every drawn setting's heads (KV groups where the choice is shared, query heads where
    each head chooses), before the evaluation: the smallest count bounds it."""
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    shared = any(s.share_selection for s in plan.setups)
    H, what = (kv, "KV groups") if shared else (config.num_attention_heads, "query heads")
    if not -H <= head < H:
        raise click.BadParameter(f"head {head} is outside [{-H}, {H}): the model has {H} {what} to draw "
                                 f"(negative counts from the end)", param_hint="--head")


def _picture_folder(pictures: str | None, force: bool) -> Path | None:
    """The --pictures folder (`gatherlens.outputs.output_dir`'s rule: missing or empty unless --force), checked
    before the model loads."""
    if pictures is None:
        return None
    try:
        return output_dir(pictures, "--pictures", force=force)
    except GatherValueError as e:
        raise click.BadParameter(str(e).removeprefix("--pictures "), param_hint="--pictures") from None


def _load(model_name: str, corpus: str, text_file: str | None, context: int, threads: int | None):
    """The model and the first `context` token ids (1, S) of the text; an error if it is shorter."""
    from gatherlens.eval.corpus import load_text
    from gatherlens.models import load
    from gatherlens.models.runtime.threads import fix_threads

    if threads:
        fix_threads(threads)  # the user's count: the thread controller stays off
    text = load_text(corpus, path=text_file)
    lm = load(model_name, progress=True)
    limit = getattr(lm.config, "max_position_embeddings", None)
    if limit and context > limit:
        raise click.BadParameter(f"context {context} exceeds the model's {limit} positions", param_hint="--context")
    ids = lm.encode(text, truncation=False)[:, :context]  # (1, S)
    if ids.shape[1] < context:
        raise click.BadParameter(f"the text has only {ids.shape[1]} tokens; lower --context", param_hint="--context")
    return lm, ids


def _measure(lm, ids, plan: _Plan, draw_layer: int, console):
    """Quality and passkey under one progress bar; also the last PageSelection of draw_layer per setting."""
    from gatherlens.eval.passkey import passkey_trials
    from gatherlens.eval.sparse_quality import evaluate_sparse_quality
    from gatherlens.models.runtime.decoding import observe_sparse

    last, pending = {}, {}  # setting -> the last PageSelection of draw_layer; the newest one seen

    def keep(call):
        if call.layer == draw_layer:
            pending["sel"] = call.selection

    report, passkeys = None, []
    total = (plan.decode_tokens + plan.passkey_trials) * (len(plan.setups) + 1)
    if plan.decode_tokens and plan.recall:
        keep_ctx = observe_sparse(keep)
    else:  # no observer: the fast paths (no picture of the pages either)
        keep_ctx = contextlib.nullcontext()
    with progress_bar(console, total, width=22) as bar:
        def advance(n, description):  # after each decode step of setting `description`
            if "sel" in pending:
                last[description] = pending.pop("sel")
            bar(n, description)

        if plan.decode_tokens:
            with keep_ctx:
                report = evaluate_sparse_quality(lm.model, ids, setups=plan.setups, page_size=plan.page_size,
                                                 decode_tokens=plan.decode_tokens, progress=advance,
                                                 recall=plan.recall, greedy=plan.greedy)
        if plan.passkey_trials:
            passkeys = passkey_trials(lm.model, lm.tokenizer, context=plan.context, trials=plan.passkey_trials,
                                      setups=plan.setups, page_size=plan.page_size, progress=bar)
    return report, passkeys, last


def _results(lm, source, ids, plan: _Plan, report, passkeys) -> tuple[dict, list[dict]]:
    """The meta and the table rows (quality and passkey per setting) the outputs share."""
    from gatherlens.eval.passkey import table_rows

    meta = report.meta if report is not None else {"context": ids.shape[1], "page_size": plan.page_size,
                                                    "dense_layers": plan.dense_layers,
                                                    "share_selection": plan.share_selection}
    meta.update({"model": lm.name, "text": str(source), "passkey_trials": plan.passkey_trials})
    return meta, table_rows(report, passkeys, plan.budgets, plan.setups)


def _print(rows: list[dict], title: str) -> None:
    cells = []
    for r in rows:
        pk = "-" if r["passkey_trials"] is None else f"{r['passkey_ok']}/{r['passkey_trials']}"
        ratio = "-" if r["ppl_ratio"] is None else f"{100 * (r['ppl_ratio'] - 1):+.2f}%"
        if r.get("ppl_ratio_ci"):
            lo, hi = r["ppl_ratio_ci"]
            ratio += f" [{100 * (lo - 1):+.1f}, {100 * (hi - 1):+.1f}]"
        greedy = "-" if r.get("greedy_prefix") is None else f"{r['greedy_prefix']}/{r['greedy_tokens']}" + (
            "" if r.get("greedy_margin") is None else f" ({r['greedy_margin']:.2f})")
        cells.append([r["setting"], number(r["perplexity"], 3), ratio, number(r.get("top1_agree")), greedy,
                      number(r.get("pages_mean"), 1), number(r["recall"]), number(r["recall_min_layer"]),
                      number(r["cosine"]), pk])
    print_table(title, ("decode", "perplexity", "vs dense [95%]", "top-1 agree", "greedy equal (gap)", "pages/step",
                        "mass recall", "min layer recall", "output cosine", "passkey"), cells)


def _write(json_path, csv_path, meta: dict, rows: list[dict], passkeys, console, force: bool) -> None:
    """--json and --csv, written by the output rule: without --force a file made since the start is refused."""
    from gatherlens.eval.io import write_table
    from gatherlens.eval.passkey import TABLE_COLUMNS

    try:
        if json_path is not None:
            write_table(json_path, rows, TABLE_COLUMNS, meta, force=force, what="--json",
                        passkey=[p.as_dict() for p in passkeys])
            console.print(f"wrote {json_path}")
        if csv_path is not None:
            write_table(csv_path, rows, TABLE_COLUMNS, meta, force=force, what="--csv")
            console.print(f"wrote {csv_path}")
    except GatherValueError as err:
        raise click.ClickException(str(err)) from None


def _pictures(folder: Path, selections: dict, layer: int, head: int, console, force: bool) -> None:
    """An SVG and an HTML page per setting; without --force a file made since the start is refused, not replaced."""
    from gatherlens.errors import GatherLensError
    from gatherlens.render import picture_file

    folder.mkdir(parents=True, exist_ok=True)
    for setting, sel in selections.items():
        H = sel.pages.shape[1]
        if not -H <= head < H:
            raise click.BadParameter(f"head {head} is outside [{-H}, {H})", param_hint="--head")
        head %= H
        try:
            record = sel.to_record(batch=0, head=head)
            drawn = {suffix: picture_file(suffix, record.to_svg, record.to_html) for suffix in (".svg", ".html")}
        except GatherLensError as err:
            raise click.ClickException(f"drawing the pages of {setting}: {err}") from None
        slug = re.sub(r"[^A-Za-z0-9]+", "_", setting.replace("=", "")).strip("_")  # "budget512_dense_layers2"
        stem = folder / f"pages_layer{layer}_head{head}_{slug}"
        try:
            for suffix, content in drawn.items():
                write_output(stem.with_suffix(suffix), content, "--pictures", force=force)
        except GatherValueError as err:
            raise click.ClickException(str(err)) from None
        console.print(f"wrote {stem}.svg / .html")
