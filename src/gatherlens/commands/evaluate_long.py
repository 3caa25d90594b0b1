"""`gatherlens eval-long`: RULER-style long-context tasks on real prose, dense against sparse, with intervals.

    gatherlens eval-long --quantized                             # 2K, 4K, 8K of Austen, 10 samples, every row
    gatherlens eval-long --quantized --lengths 4096 --samples 3 --first-seed 3 --records answers.jsonl
    gatherlens eval-long --from answers.jsonl --json long.json --csv long.csv --plot long.png
    gatherlens eval-long --text notes.txt --rows dense,auto --tasks niah_single,vt

Each sample is two haystacks of real text (a window of --corpus / --text) with the needles of the
tasks (eval.long_tasks: single, multi-key, multi-value and multi-query needles, variable tracking,
common-word extraction) at seeded depths; each haystack is prefilled once and every row answers its
questions from a copy of the cache (eval.long_context: dense; sparse decoding at auto, 512 and 256;
sparse prefill; float16 and int8 pages). Prints accuracy with 95% intervals, dense's first, and for
every other row whether it equals dense within the paired interval. --records appends every answer
as it is made (a long run in pieces: several seeds a call), --from reports from such a file without
a model.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from gatherlens.commands.params import (
    Int, int_list, load_kwargs, output_file, print_table, quantized_option, require_causal, text_source_options,
    threads_option,
)


@click.command("eval-long")
@text_source_options('"smollm2" or a local Llama-family folder / .gguf file.')
@quantized_option()
@click.option("--lengths", default="2048,4096,8192", show_default=True, help="Comma-separated context lengths (tokens).")
@click.option("--samples", default=10, show_default=True, type=Int(1), help="Samples per length.")
@click.option("--first-seed", default=0, show_default=True, type=Int(0), help="The first sample's seed.")
@click.option("--rows", "rows", default=None, help="Comma-separated rows (default: every one of eval.long_context.ROWS).")
@click.option("--tasks", "tasks", default=None, help="Comma-separated tasks (default: every one of eval.long_tasks.TASKS).")
@click.option("--records", "records", default=None, type=click.Path(dir_okay=False),
              help="Append every answer to this .jsonl file as it is made.")
@click.option("--from", "source", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Report from a --records file instead of running the model.")
@threads_option
@click.option("--json", "json_out", default=None, help="Write the accuracy rows and meta to a .json file.")
@click.option("--csv", "csv_out", default=None, help="Write the accuracy rows to a .csv file.")
@click.option("--plot", "plot_out", default=None, help="Draw accuracy against length per task (.png or .svg).")
@click.option("--force", is_flag=True, help="Overwrite output files that exist.")
def evaluate_long(model_name, corpus, text_file, quantized, lengths, samples, first_seed, rows, tasks, records, source,
                  threads, json_out, csv_out, plot_out, force):
    """RULER-style needles, variable tracking and word counting: every row's accuracy against dense's."""
    from rich.console import Console

    from gatherlens.errors import GatherLensError
    from gatherlens.eval.long_context import ROWS, long_report, row_setup
    from gatherlens.eval.long_tasks import TASKS

    row_list, task_list = _names(rows, ROWS, "--rows", row_setup), _names(tasks, TASKS, "--tasks")
    length_list = sorted(set(int_list(lengths, "--lengths", lo=256, hi=1 << 24)))
    if not length_list:
        raise click.BadParameter(f"{lengths!r}: give at least one length, like 2048,4096", param_hint="--lengths")
    records = _records_file(records)
    paths = {"json": output_file(json_out, force, (".json",), "--json"),
             "csv": output_file(csv_out, force, (".csv",), "--csv"),
             "plot": output_file(plot_out, force, (".png", ".svg"), "--plot")}
    console = Console(stderr=True)
    try:
        if source is not None:
            found = _read(source)
            meta = {"records": str(source)}
        else:
            found, meta = _run(model_name, corpus, text_file, quantized, length_list, samples, first_seed, row_list,
                               task_list, records, threads, console)
        report = long_report(found, meta)
    except GatherLensError as err:
        raise click.ClickException(str(err)) from None
    _print(report)
    _write(report, paths, force, console)


def _names(text: str | None, known: tuple, hint: str, check=None) -> tuple:
    """A comma-separated subset of `known` (a budget in tokens too, where `check` takes it), in its order."""
    if text is None:
        return known
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in known and not (check and _tokens(n, hint))]
    if bad or not names:
        raise click.BadParameter(f"{text!r}: give names from {', '.join(known)}", param_hint=hint)
    return names


def _tokens(name: str, hint: str) -> bool:
    """True for a budget in tokens (`gatherlens.params.parse_int`'s digits, >= 1); a clear error for digits
    out of range; False for any other name."""
    from gatherlens.errors import GatherValueError
    from gatherlens.params import parse_int

    if not name.isascii() or not name.isdigit():
        return False
    try:
        return parse_int(name, hint, 1, 1 << 30) >= 1
    except GatherValueError as e:
        raise click.BadParameter(str(e).removeprefix(f"{hint} = "), param_hint=hint) from None


def _records_file(path: str | None):
    """--records as a file answers can be appended to (it may exist), checked before anything runs."""
    from gatherlens.errors import GatherValueError
    from gatherlens.outputs import writable_file

    try:
        return None if path is None else writable_file(path, "--records")
    except GatherValueError as e:
        raise click.BadParameter(str(e).removeprefix("--records "), param_hint="--records") from None


def _read(path) -> list[dict]:
    """The answer records of a --records file (one JSON object a line)."""
    from gatherlens.errors import GatherValueError

    if not Path(path).is_file():  # /dev/null, a pipe: nothing to read (or a read that never ends)
        raise GatherValueError(f"--from {path}: not a regular file; give a --records file (.jsonl)")
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise GatherValueError(f"--from {path}: line {n} is not JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise GatherValueError(f"--from {path}: not UTF-8 text ({e})") from None
    if not out:
        raise GatherValueError(f"--from {path}: holds no records (one JSON object a line, as --records writes)")
    return out


def _run(model_name, corpus, text_file, quantized, lengths, samples, first_seed, rows, tasks, records, threads, console):
    """Load, build the haystack, answer every sample (each answer appended to --records as made)."""
    from gatherlens.eval.corpus import load_text
    from gatherlens.eval.long_context import answer_sample
    from gatherlens.eval.long_tasks import Haystack
    from gatherlens.models import load
    from gatherlens.models.runtime.threads import fix_threads

    require_causal(model_name, "eval-long")
    if threads:
        fix_threads(threads)
    text = load_text(corpus, path=text_file)  # a bad --corpus or --text: an error before the model loads
    lm = load(model_name, progress=True, **load_kwargs(model_name, quantized))
    hay = Haystack(lm.tokenizer, text)
    found = []
    for length in lengths:
        for seed in range(first_seed, first_seed + samples):
            made = answer_sample(lm, hay, length, seed, rows, tasks, progress=lambda m: console.log(m))
            found += made
            if records is not None:
                with open(records, "a", encoding="utf-8") as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in made)
    return found, {"model": lm.name, "text": text_file or corpus, "samples": samples, "first_seed": first_seed,
                   "quantized": quantized}


def _print(report) -> None:
    by = {(r["setting"], r["length"], r["task"]): r for r in report.rows}
    settings = list(dict.fromkeys(r["setting"] for r in report.rows))
    cells = []
    for length in sorted({r["length"] for r in report.rows}):
        for task in dict.fromkeys(r["task"] for r in report.rows):
            line = [f"{length} {task}"]
            for s in settings:
                r = by.get((s, length, task))
                mark = "" if r is None or "equal" not in r else (" =" if r["equal"] else " ≠")
                line.append("-" if r is None else f"{r['accuracy']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]{mark}")
            cells.append(line)
    print_table("accuracy [95%] (=: equal to dense within the paired interval)", ("length task", *settings), cells)


def _write(report, paths: dict, force: bool, console) -> None:
    from gatherlens.errors import GatherValueError
    from gatherlens.eval.io import write_table
    from gatherlens.eval.plot import plot_long

    columns = ("setting", "length", "task", "n", "accuracy", "ci", "diff", "diff_ci", "equal")
    rows = [{c: r.get(c) for c in columns} for r in report.rows]
    try:
        for kind in ("json", "csv"):
            if paths[kind] is not None:
                write_table(paths[kind], rows, columns, report.meta, force=force, what=f"--{kind}")
                console.print(f"wrote {paths[kind]}")
        if paths["plot"] is not None:
            plot_long(report, paths["plot"], force=force, what="--plot")
            console.print(f"wrote {paths['plot']}")
    except GatherValueError as err:
        raise click.ClickException(str(err)) from None
